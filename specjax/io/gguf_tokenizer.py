"""The tokenizer of a GGUF file, built from its metadata without torch.

transformers' own route (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`) reads the
metadata with a reader that imports torch, which only specjax's `test` extra installs. Here
the metadata comes from the `gguf` package's reader (numpy only), is grouped and renamed as
transformers' `get_gguf_tokenizer` does it, and goes to transformers' own converter
(`convert_gguf_tokenizer` in transformers.integrations.gguf, torch-free, transformers >= 5.17),
so the backend is the one transformers builds, byte for byte (tests/test_gguf_without_torch.py
compares the two). Building SmolLM2's (49k tokens, 49k merges) takes about 0.2 s, less than
reading a saved copy back, so nothing is cached.

An older transformers (without that module) takes transformers' own route, which needs torch;
without torch the error says so.
"""

from __future__ import annotations

from pathlib import Path

# transformers' `_SPECIAL_TOKENS` (private there): tokenizer attribute -> llama.cpp id key.
_SPECIAL_TOKENS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}

# Special tokens that the tokenizer class transformers builds for a sentencepiece vocabulary
# of these architectures declares beyond the file's four: GemmaTokenizer's mask_token
# (default "<mask>", added to the vocabulary when absent, so the backend holds it either way).
_CLASS_SPECIAL_TOKENS = {arch: {"mask_token": "<mask>"} for arch in ("gemma", "gemma2", "gemma3")}


def _converter():
    """transformers' torch-free GGUF tokenizer module, or None when this transformers predates it."""
    try:
        from transformers.integrations.gguf import gguf_tokenizer_mapping
    except ImportError:
        return None
    return gguf_tokenizer_mapping


def tokenizer_metadata(reader, mapping) -> tuple[str, dict, dict]:
    """(architecture, tokenizer_dict, tokenizer_config) from a `gguf.GGUFReader`, as
    transformers' `get_gguf_tokenizer` returns them: `mapping.GGUF_TOKENIZER_MAPPING` renames
    the `tokenizer.*` keys into the two groups, and the special tokens are named by their ids."""
    meta = {key: field.contents() for key, field in reader.fields.items() if key.startswith("tokenizer.")}
    architecture = reader.fields["general.architecture"].contents()
    grouped = {
        group: {name: meta[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in meta}
        for group, renames in mapping.GGUF_TOKENIZER_MAPPING.items()
    }
    tokenizer, config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer.get("tokenizer_type") == "llama":
        # A sentencepiece file that does not say: llama.cpp adds BOS, and so does transformers.
        config.setdefault("add_bos_token", True)
    for name, key in _SPECIAL_TOKENS.items():
        token_id = meta.get(f"tokenizer.ggml.{key}")
        config[name] = tokenizer["tokens"][token_id] if token_id is not None else None
    return architecture, tokenizer, config


def gguf_tokenizer(path: str | Path, reader=None):
    """The HF fast tokenizer (with the chat template, bos/eos/pad) the GGUF file `path`
    describes; None if it carries no tokenizer. `reader`: the file's `gguf.GGUFReader`, if
    already open."""
    import transformers

    path = Path(path)
    if reader is None:
        import gguf

        reader = gguf.GGUFReader(str(path))
    if "tokenizer.ggml.model" not in reader.fields:
        return None
    mapping = _converter()
    if mapping is None:
        return _transformers_route(path)
    architecture, tokenizer_dict, config = tokenizer_metadata(reader, mapping)
    if tokenizer_dict.get("tokenizer_type") == "llama":
        config = _CLASS_SPECIAL_TOKENS.get(architecture, {}) | config
    backend, extra = mapping.convert_gguf_tokenizer(architecture, tokenizer_dict)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **config, **extra)


def _transformers_route(path: Path):
    """transformers' own GGUF tokenizer loading (transformers < 5.17), which imports torch."""
    import transformers

    try:
        import torch  # noqa: F401  (transformers' GGUF reader imports it)
    except ImportError as e:
        raise ValueError(
            f"building the tokenizer of {path} with transformers {transformers.__version__} needs torch; "
            "upgrade transformers (pip install -U 'transformers>=5.17') or install torch"
        ) from e
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
