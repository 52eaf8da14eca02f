"""Reading a model directory that borrows tensors from another model (io/shared_weights.py
writes one): the config.json key, the tensors' fingerprint, and the params with the borrowed
tensors filled in.

This is the part that both sides need: hf.py's `load_model` reads such directories, and
shared_weights.py, which writes them through hf.py's `save_model`, fingerprints what it
leaves out. It imports neither, and loads the model a directory names through the loader
its caller passes in (`specjax.load_model`, io/presets.py, which takes any model name), so
no import runs back up from here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from specjax.io.hf_weights import CheckpointReader, _llama_to_hf, check_layout, params_from_hf
from specjax.io.model import Model

SHARED_KEY = "specjax_weights_from"  # config.json: {"model": name, "tensors": [HF names], "sha256": ...}


def shared_tensor_names(model: Model) -> tuple[str, ...]:
    """The HF names of a Llama-family model's embedding and, when untied, LM head."""
    if model.config.model_type == "gpt2":
        raise ValueError("a draft that borrows its embedding must be of the Llama family, not gpt2")
    return ("model.embed_tokens.weight",) + (() if model.config.tie_word_embeddings else ("lm_head.weight",))


def tensor_fingerprint(tensors: dict) -> str:
    """sha256 over the tensors' names and float32 bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(np.asarray(tensors[name], np.float32)).tobytes())
    return digest.hexdigest()


def hf_tensors(model: Model, names) -> dict:
    """{HF name: numpy array} of the model's tensors named `names`."""
    tensors = _llama_to_hf(model.config, model.params)
    return {name: np.asarray(tensors[name]) for name in names}


def read_params_sharing(directory: Path, config, entry: dict, load: Callable[[str], Model]) -> dict:
    """Params of a directory `save_model_sharing` wrote (config.json's `entry`), its borrowed
    tensors taken from the model it names, loaded by `load(name)`, checked by sha256."""
    if not isinstance(entry, dict) or not {"model", "tensors", "sha256"} <= set(entry):
        raise ValueError(f"{directory}/config.json: {SHARED_KEY} needs 'model', 'tensors' and 'sha256', got {entry!r}")
    source = load(entry["model"])  # float32: the fingerprint is over float32 bytes
    shared = hf_tensors(source, entry["tensors"])
    if tensor_fingerprint(shared) != entry["sha256"]:
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
