"""Hugging Face checkpoint directories in and out: `load_model` and `save_model`.

A directory holds config.json, model.safetensors (or shards plus an index) and, when the
model has one, a tokenizer. The config mapping lives in specjax/io/hf_config.py, the tensor
layouts in specjax/io/hf_weights.py and the tokenizer files in specjax/io/tokenizer.py.
Loading reads config.json directly (no transformers import), so a ByteTokenizer model loads
without importing transformers at all.
"""

from __future__ import annotations

import json
from pathlib import Path

from specjax.io.borrowed_weights import SHARED_KEY, read_params_sharing
from specjax.io.embedded import embedded_names, embedded_path
from specjax.io.hf_config import config_from_hf, config_to_hf
from specjax.io.hf_weights import SINGLE_FILE, read_params, write_params
from specjax.io.model import Model, hf_repo_id
from specjax.io.tokenizer import ByteTokenizer, load_tokenizer, save_byte_tokenizer
from specjax.io.weight_formats import check_weights, with_weights

TRAINED_CONTEXT_KEY = "specjax_trained_context"  # config.json: tokens per training window (Model.trained_context)
MASK_TOKEN_KEY = "specjax_mask_token_id"  # config.json: a parallel draft's mask token (Model.mask_token_id)


def load_model(
    path_or_name: str | Path, dtype: str = "float32", mesh=None, load_borrowed=None, weights: str = "float32"
) -> Model:
    """A model from a local HF-format directory or the name of an embedded model.

    Supports the safetensors checkpoints (single file or sharded) of the architectures in
    hf_config.ARCHITECTURES: Llama (with llama3, linear, dynamic or yarn rope scaling), Qwen2, Mistral,
    Phi-3, Qwen3, Gemma 2, Gemma 3 (text), Mixtral, Qwen3-MoE and GPT-2. Params are cast to `dtype`
    ("float32", "bfloat16" or "float16"). Raises ValueError naming what is wrong.

    mesh: a jax.sharding.Mesh (specjax.make_mesh): the params are laid out on it as
    `specjax.shard_model` does, each process reading only the slices its devices hold
    (specjax/io/sharded_loading.py).

    load_borrowed: how a directory that borrows tensors (io/shared_weights.py) loads the
    model it names, name -> Model; `specjax.load_model` (io/presets.py) passes itself, so
    any name it takes works. None: this function (directories and embedded models).

    weights: the weight format, "float32" (default), "bfloat16" or "int8"
    (specjax/io/weight_formats.py); not with a mesh yet.
    """
    if weights != "float32":
        check_weights(weights)
        if mesh is not None:
            raise ValueError(f"weights={weights!r} on a mesh is not supported yet: use weights='float32' with a mesh")
        return with_weights(load_model(path_or_name, dtype, None, load_borrowed), weights)
    directory = _resolve(path_or_name)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{directory} has no config.json, so it is not a Hugging Face model directory")
    try:
        hf = json.loads(config_path.read_text())
    except ValueError as e:
        raise ValueError(f"{config_path} is not valid JSON: {e}") from e
    config = config_from_hf(hf, dtype=dtype, source=str(config_path))
    trained_context = hf.get(TRAINED_CONTEXT_KEY)
    if SHARED_KEY in hf:  # tensors borrowed from another model (io/borrowed_weights.py)
        if mesh is not None:
            raise ValueError(f"{directory} borrows tensors from another model: load it, then shard_model it")
        params = read_params_sharing(directory, config, hf[SHARED_KEY], load_borrowed or load_model)
    elif mesh is not None:
        from specjax.io.sharded_loading import read_sharded_params

        config, params = read_sharded_params(directory, config, mesh)
    else:
        params = read_params(directory, config)
    tokenizer = load_tokenizer(directory, hf)
    return Model(
        config,
        params,
        tokenizer,
        trained_context=trained_context,
        mask_token_id=hf.get(MASK_TOKEN_KEY),
        hf_repo=hf_repo_id(hf.get("_name_or_path")),  # transformers' save_pretrained records the repo there
    )


def save_model(model: Model, out_dir: str | Path) -> Path:
    """Write `model` as a Hugging Face directory that transformers' Auto classes load.

    Writes config.json (with `architectures` and `model_type`), one model.safetensors and
    the tokenizer: a ByteTokenizer becomes a byte-level tokenizer.json that encodes and
    decodes identically; an HF tokenizer saves itself. Returns the directory.
    """
    if model.config.weights != "float32":
        raise ValueError(
            f"cannot save a model with weights={model.config.weights!r}: a format is applied at load time "
            "(load_model(..., weights=...)); save the float32 model"
        )
    tokenizer = model.tokenizer
    if not (tokenizer is None or isinstance(tokenizer, ByteTokenizer) or hasattr(tokenizer, "save_pretrained")):
        raise ValueError(f"cannot save a tokenizer of type {type(tokenizer).__name__} (it has no save_pretrained)")
    config = config_to_hf(model.config, tokenizer)
    if model.trained_context is not None:
        config[TRAINED_CONTEXT_KEY] = int(model.trained_context)
    if model.mask_token_id is not None:
        config[MASK_TOKEN_KEY] = int(model.mask_token_id)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_params(out / SINGLE_FILE, model.config, model.params)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if isinstance(tokenizer, ByteTokenizer):
        save_byte_tokenizer(out, model.config.max_position_embeddings)
    elif tokenizer is not None:
        tokenizer.save_pretrained(str(out))
    return out


def _resolve(path_or_name: str | Path) -> Path:
    path = Path(path_or_name).expanduser()
    if path.is_dir():
        return path
    embedded = embedded_path(str(path_or_name)) if isinstance(path_or_name, str) else None
    if embedded is not None:
        return embedded
    names = ", ".join(embedded_names()) or "none installed"
    raise ValueError(
        f"{str(path_or_name)!r} is neither a model directory nor an embedded model name (embedded models: {names})"
    )


# config_from_hf and config_to_hf are re-exported: their home is specjax/io/hf_config.py.
__all__ = ["config_from_hf", "config_to_hf", "load_model", "save_model"]
