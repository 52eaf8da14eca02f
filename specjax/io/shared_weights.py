"""A draft directory that borrows tensors from another model: `save_model_sharing`.

A draft distilled from a target's own layers (distill `draft_init: target_layers`) with its
embedding frozen (`train_embedding: false`) holds the target's embedding (and untied LM head)
unchanged. For SmolLM2-135M that table is 28M of the draft's 42M parameters, so shipping it
again would triple the files for nothing. The directory written here is the HF directory
`save_model` writes, less those tensors, with config.json naming where they come from:

    "specjax_weights_from": {"model": "smollm2-135m-instruct",
                             "tensors": ["model.embed_tokens.weight"], "sha256": "..."}

`load_model` (io/hf.py) reads such a directory by loading that model (a name or a path, as
`load_model` takes it) and taking the named tensors from it, after checking their sha256 (over
float32 bytes), so a draft never runs with another model's embedding. transformers cannot read
the directory on its own: the tensors are missing from its safetensors file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

from specjax.io.hf_weights import SINGLE_FILE, CheckpointReader, _llama_to_hf, check_layout, params_from_hf
from specjax.io.model import Model

SHARED_KEY = "specjax_weights_from"


def shared_tensor_names(model: Model) -> tuple[str, ...]:
    """The HF names of a Llama-family model's embedding and, when untied, LM head."""
    if model.config.model_type == "gpt2":
        raise ValueError("a draft that borrows its embedding must be of the Llama family, not gpt2")
    return ("model.embed_tokens.weight",) + (() if model.config.tie_word_embeddings else ("lm_head.weight",))


def _fingerprint(tensors: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(np.asarray(tensors[name], np.float32)).tobytes())
    return digest.hexdigest()


def _hf(model: Model, names) -> dict:
    tensors = _llama_to_hf(model.config, model.params)
    return {name: np.asarray(tensors[name]) for name in names}


def save_model_sharing(model: Model, out_dir: str | Path, source_name: str, source: Model, dtype=None) -> Path:
    """Write `model` as `save_model` does, less its embedding (and untied LM head), which must
    equal `source`'s; config.json names `source_name` (what `load_model` will load them from).
    dtype: cast the written tensors ("bfloat16" halves the files), or None to keep them."""
    from specjax.io.hf import save_model

    names = shared_tensor_names(model)
    mine, theirs = _hf(model, names), _hf(source, names)
    for name in names:
        if mine[name].shape != theirs[name].shape or not np.array_equal(mine[name], theirs[name]):
            raise ValueError(
                f"{name} of the model differs from {source_name}'s, so it cannot be borrowed: distil with "
                "train_embedding: false (the embedding frozen) or save the whole model with save_model"
            )
    out = save_model(model, out_dir)
    tensors = {k: v for k, v in load_file(str(out / SINGLE_FILE)).items() if k not in names}
    if dtype is not None:
        tensors = {k: np.asarray(jnp.asarray(v, dtype)) for k, v in tensors.items()}
    save_file(tensors, str(out / SINGLE_FILE), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config[SHARED_KEY] = {"model": source_name, "tensors": list(names), "sha256": _fingerprint(theirs)}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


def read_params_sharing(directory: Path, config, entry: dict) -> dict:
    """Params of a directory `save_model_sharing` wrote (config.json's `entry`), its borrowed
    tensors taken from the model it names, checked by sha256."""
    from specjax.io.presets import load_model

    if not isinstance(entry, dict) or not {"model", "tensors", "sha256"} <= set(entry):
        raise ValueError(f"{directory}/config.json: {SHARED_KEY} needs 'model', 'tensors' and 'sha256', got {entry!r}")
    source = load_model(entry["model"])  # float32: the fingerprint is over float32 bytes
    shared = _hf(source, entry["tensors"])
    if _fingerprint(shared) != entry["sha256"]:
        raise ValueError(
            f"{directory} borrows {', '.join(entry['tensors'])} from {entry['model']!r}, but the model loaded "
            "under that name has other values (another version or quantization): load the one it was saved with"
        )
    with CheckpointReader(directory, config.dtype) as reader:

        def get(name: str, shape: tuple):
            if name not in shared:
                return reader.get(name, shape)
            if tuple(shared[name].shape) != tuple(shape):
                raise ValueError(f"{entry['model']}'s {name} has shape {shared[name].shape}, the draft needs {shape}")
            return jnp.asarray(shared[name], reader.dtype)

        params = params_from_hf(config, get)
        reader.check_all_used()
    check_layout(config, params)
    return params
