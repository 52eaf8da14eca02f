"""Hugging Face checkpoint directories in and out: `load_model` and `save_model`.

A directory holds config.json, model.safetensors (or shards plus an index) and, when the
model has one, a tokenizer. The config mapping lives here; the tensor layouts live in
specjax/io/hf_weights.py. Loading reads config.json directly (no transformers import), so a
ByteTokenizer model loads without importing transformers at all.
"""

from __future__ import annotations

import json
from pathlib import Path

from specjax.io.embedded import embedded_names, embedded_path
from specjax.io.hf_weights import SINGLE_FILE, read_params, write_params
from specjax.io.model import Model
from specjax.io.tokenizer import ByteTokenizer
from specjax.models import ModelConfig

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MistralForCausalLM": "mistral",
    "GPT2LMHeadModel": "gpt2",
}
_ARCHITECTURE_OF = {model_type: arch for arch, model_type in ARCHITECTURES.items()}
# HF's own defaults for keys that save_pretrained may leave out of config.json.
_DEFAULT_MAX_POSITIONS = {"llama": 2048, "qwen2": 32768, "mistral": 131072}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
BYTE_TOKENIZER_KEY = "specjax_tokenizer"  # config.json marker: the model uses specjax's ByteTokenizer
_BYTE_SPECIALS = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}


def load_model(path_or_name: str | Path, dtype: str = "float32") -> Model:
    """A model from a local HF-format directory or the name of an embedded model.

    Supports LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM and GPT2LMHeadModel
    safetensors checkpoints (single file or sharded). Params are cast to `dtype`
    ("float32", "bfloat16" or "float16"). Raises ValueError naming what is wrong.
    """
    directory = _resolve(path_or_name)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{directory} has no config.json, so it is not a Hugging Face model directory")
    try:
        hf = json.loads(config_path.read_text())
    except ValueError as e:
        raise ValueError(f"{config_path} is not valid JSON: {e}") from e
    config = config_from_hf(hf, dtype=dtype, source=str(config_path))
    return Model(config=config, params=read_params(directory, config), tokenizer=_load_tokenizer(directory, hf))


def save_model(model: Model, out_dir: str | Path) -> Path:
    """Write `model` as a Hugging Face directory that transformers' Auto classes load.

    Writes config.json (with `architectures` and `model_type`), one model.safetensors and
    the tokenizer: a ByteTokenizer becomes a byte-level tokenizer.json that encodes and
    decodes identically; an HF tokenizer saves itself. Returns the directory.
    """
    tokenizer = model.tokenizer
    if not (tokenizer is None or isinstance(tokenizer, ByteTokenizer) or hasattr(tokenizer, "save_pretrained")):
        raise ValueError(f"cannot save a tokenizer of type {type(tokenizer).__name__} (it has no save_pretrained)")
    config = config_to_hf(model.config, tokenizer)
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


def config_from_hf(hf: dict, dtype: str = "float32", source: str = "config.json") -> ModelConfig:
    """A ModelConfig from the dict of an HF config.json; ValueError for what specjax cannot run."""
    model_type = _model_type(hf, source)
    if "quantization_config" in hf:
        raise ValueError(f"{source}: quantized checkpoints are not supported (found quantization_config)")

    def need(key: str):
        if key not in hf:
            raise ValueError(f"{source} lacks {key!r}, which a {model_type} config must have")
        return hf[key]

    if model_type == "gpt2":
        return _gpt2_config(hf, need, dtype, source)
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{source}: hidden_act {hf['hidden_act']!r} is not supported; Llama-family models need 'silu'")
    heads, hidden = need("num_attention_heads"), need("hidden_size")
    max_positions = hf.get("max_position_embeddings", _DEFAULT_MAX_POSITIONS[model_type])
    _check_sliding_window(hf, model_type, max_positions, source)
    head_dim = hf.get("head_dim")
    if head_dim is not None and hidden % heads == 0 and head_dim == hidden // heads:
        head_dim = None  # the implied value: equal configs compile once, whatever the file said
    if model_type == "llama":  # HF's attention_bias means q, k, v and o
        attention_bias = o_proj_bias = bool(hf.get("attention_bias", False))
    else:
        attention_bias, o_proj_bias = model_type == "qwen2", False
    return ModelConfig(
        vocab_size=need("vocab_size"),
        hidden_size=hidden,
        intermediate_size=need("intermediate_size"),
        num_hidden_layers=need("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        rope_theta=float(_rope_theta(hf, source)),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=max_positions,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=attention_bias,
        o_proj_bias=o_proj_bias,
        mlp_bias=bool(hf.get("mlp_bias", False)) if model_type == "llama" else False,
        head_dim=head_dim,
        dtype=dtype,
        model_type=model_type,
    )


def _model_type(hf: dict, source: str) -> str:
    supported = ", ".join(ARCHITECTURES)
    architectures = hf.get("architectures") or []
    if architectures:
        if architectures[0] not in ARCHITECTURES:
            raise ValueError(f"{source}: unsupported architecture {architectures[0]!r}; supported: {supported}")
        return ARCHITECTURES[architectures[0]]
    if hf.get("model_type") in _ARCHITECTURE_OF:
        return hf["model_type"]
    raise ValueError(f"{source}: unsupported model_type {hf.get('model_type')!r}; supported architectures: {supported}")


def _rope_theta(hf: dict, source: str) -> float:
    # transformers 5 writes `rope_parameters` (theta inside); 4.x wrote `rope_theta` and
    # `rope_scaling` at the top level.
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(
            f"{source}: rope scaling {kind!r} (rope_scaling / rope_parameters) is not supported; "
            "only the default rotary embedding is"
        )
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{source}: partial_rotary_factor {rope['partial_rotary_factor']} is not supported")
    return rope.get("rope_theta", hf.get("rope_theta", 10000.0))


def _check_sliding_window(hf: dict, model_type: str, max_positions: int, source: str) -> None:
    """specjax attends to the whole context; a window that can bind would change the model."""
    window = hf.get("sliding_window", 4096 if model_type == "mistral" else None)
    if model_type == "qwen2" and not hf.get("use_sliding_window", False):
        window = None
    if "sliding_attention" not in (hf.get("layer_types") or ["sliding_attention"]):
        window = None
    if window is not None and window < max_positions:
        raise ValueError(
            f"{source}: sliding_window={window} is smaller than max_position_embeddings={max_positions}; "
            "specjax has no sliding-window attention. Setting max_position_embeddings <= sliding_window in "
            "config.json makes the window never bind (and limits sequences to that length)."
        )


def _gpt2_config(hf: dict, need, dtype: str, source: str) -> ModelConfig:
    if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(
            f"{source}: activation_function {hf['activation_function']!r} is not supported; GPT-2 needs 'gelu_new'"
        )
    for key, supported in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
        if hf.get(key, supported) != supported:
            raise ValueError(f"{source}: {key}={hf[key]} is not supported (only {supported})")
    hidden, heads = need("n_embd"), need("n_head")
    return ModelConfig(
        vocab_size=need("vocab_size"),
        hidden_size=hidden,
        intermediate_size=hf.get("n_inner") or 4 * hidden,
        num_hidden_layers=need("n_layer"),
        num_attention_heads=heads,
        num_key_value_heads=heads,
        rms_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),  # ModelConfig reuses this field for LayerNorm
        max_position_embeddings=need("n_positions"),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        dtype=dtype,
        model_type="gpt2",
    )


def config_to_hf(config: ModelConfig, tokenizer=None) -> dict:
    """The config.json dict for `config`, built by transformers' own config class so that the
    installed transformers reads back exactly what it would have written."""
    import transformers

    if config.model_type == "gpt2":
        fields = {
            "n_embd": config.hidden_size,
            "n_layer": config.num_hidden_layers,
            "n_head": config.num_attention_heads,
            "n_inner": config.intermediate_size,
            "n_positions": config.max_position_embeddings,
            "layer_norm_epsilon": config.rms_norm_eps,
            "activation_function": "gelu_new",
        }
    else:
        fields = {
            "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size,
            "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads,
            "head_dim": config.resolved_head_dim,
            "rms_norm_eps": config.rms_norm_eps,
            "rope_theta": config.rope_theta,
            "max_position_embeddings": config.max_position_embeddings,
            "hidden_act": "silu",
            "sliding_window": None,
        }
        if config.model_type == "llama":
            fields["attention_bias"] = config.attention_bias or config.o_proj_bias
            fields["mlp_bias"] = config.mlp_bias
        if config.model_type == "qwen2":
            fields["use_sliding_window"] = False
    special = {key: getattr(tokenizer, key, None) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    hf_config = transformers.AutoConfig.for_model(
        config.model_type,
        architectures=[_ARCHITECTURE_OF[config.model_type]],
        vocab_size=config.vocab_size,
        tie_word_embeddings=config.tie_word_embeddings,
        dtype=config.dtype,
        **special,
        **fields,
    )
    out = hf_config.to_dict()
    if isinstance(tokenizer, ByteTokenizer):
        out[BYTE_TOKENIZER_KEY] = "bytes"
    return out


def _load_tokenizer(directory: Path, hf: dict):
    marker = hf.get(BYTE_TOKENIZER_KEY)
    if marker is not None:
        if marker != "bytes":
            raise ValueError(f"{directory / 'config.json'}: unknown {BYTE_TOKENIZER_KEY} {marker!r} (known: 'bytes')")
        return ByteTokenizer()
    if not any((directory / name).is_file() for name in _TOKENIZER_FILES):
        return None
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(directory))


def _byte_level_chars() -> list[str]:
    """The printable stand-in character of each byte 0..255 (GPT-2's byte-level alphabet)."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    stand_ins = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(stand_ins)) for b in range(256)]


def save_byte_tokenizer(out_dir: str | Path, max_length: int) -> None:
    """Write tokenizer files that transformers' AutoTokenizer loads as a copy of ByteTokenizer.

    A BPE over the 256 byte characters with no merges gives one id per byte, in byte
    order; the specials take 256..258. `add_special_tokens=True` prepends <bos>, as
    ByteTokenizer does, and special-token text in the input is encoded as plain bytes.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    byte_tok = ByteTokenizer()
    vocab = {c: i for i, c in enumerate(_byte_level_chars())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in _BYTE_SPECIALS.values()])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", byte_tok.bos_token_id)]
    )
    assert [tok.token_to_id(s) for s in _BYTE_SPECIALS.values()] == [256, 257, 258], "special ids drifted"
    out = Path(out_dir)
    tok.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        # The class name both transformers 4.x and 5.x resolve to their tokenizers-backed class.
        "tokenizer_class": "PreTrainedTokenizerFast",
        **_BYTE_SPECIALS,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": True,
        "model_max_length": max_length,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(_BYTE_SPECIALS, indent=2) + "\n")


__all__ = ["ARCHITECTURES", "config_from_hf", "config_to_hf", "load_model", "save_model"]
