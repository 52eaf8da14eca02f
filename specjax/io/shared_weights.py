"""A draft directory that borrows tensors from another model: `save_model_sharing`.

A draft distilled from a target's own layers (distill `draft_init: target_layers`) with its
embedding frozen (`train_embedding: false`) holds the target's embedding (and untied LM head)
unchanged. For SmolLM2-135M that table is 28M of the draft's 42M parameters, so shipping it
again would triple the files for nothing. The directory written here is the HF directory
`save_model` writes, less those tensors, with config.json naming where they come from:

    "specjax_weights_from": {"model": "smollm2-135m-instruct",
                             "tensors": ["model.embed_tokens.weight"], "sha256": "..."}

`load_model` (io/hf.py, through io/borrowed_weights.py) reads such a directory by loading that
model (a name or a path, as `specjax.load_model` takes it) and taking the named tensors from it,
after checking their sha256 (over float32 bytes), so a draft never runs with another model's
embedding. transformers cannot read the directory on its own: the tensors are missing from its
safetensors file.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

from specjax.io.borrowed_weights import SHARED_KEY, hf_tensors, shared_tensor_names, tensor_fingerprint
from specjax.io.hf import save_model
from specjax.io.hf_weights import SINGLE_FILE
from specjax.io.model import Model


def save_model_sharing(model: Model, out_dir: str | Path, source_name: str, source: Model, dtype=None) -> Path:
    """Write `model` as `save_model` does, less its embedding (and untied LM head), which must
    equal `source`'s; config.json names `source_name` (what `load_model` will load them from).
    dtype: cast the written tensors ("bfloat16" halves the files), or None to keep them."""
    names = shared_tensor_names(model)
    mine, theirs = hf_tensors(model, names), hf_tensors(source, names)
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
    config[SHARED_KEY] = {"model": source_name, "tensors": list(names), "sha256": tensor_fingerprint(theirs)}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out
