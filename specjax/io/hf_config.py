"""Hugging Face config.json <-> ModelConfig, one family at a time: `config_from_hf`, `config_to_hf`.

Reading needs no transformers import (a ByteTokenizer model loads without it); writing
builds transformers' own config class, so the installed transformers reads back exactly what
it would have written. Directory IO lives in specjax/io/hf.py, tensor layouts in
specjax/io/hf_weights.py.
"""

from __future__ import annotations

from specjax.io.tokenizer import BYTE_TOKENIZER_KEY, ByteTokenizer
from specjax.models import ModelConfig
from specjax.models.config import GEMMA_TYPES, LAYER_TYPES, MOE_TYPES, ROPE_SCALING_KEYS

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MistralForCausalLM": "mistral",
    "Phi3ForCausalLM": "phi3",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "GPT2LMHeadModel": "gpt2",
}
_ARCHITECTURE_OF = {model_type: arch for arch, model_type in ARCHITECTURES.items()}
# HF's own defaults for keys that save_pretrained may leave out of config.json.
_DEFAULT_MAX_POSITIONS = {
    "llama": 2048,
    "qwen2": 32768,
    "mistral": 131072,
    "phi3": 4096,
    "qwen3": 32768,
    "gemma2": 8192,
    "gemma3_text": 131072,
    "mixtral": 131072,
    "qwen3_moe": 32768,
}
_DEFAULT_THETA = {"mixtral": 1e6, "gemma3_text": 1e6}  # others: 10000
_DEFAULT_WINDOW = {"mistral": 4096, "gemma2": 4096, "gemma3_text": 4096}


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
    gemma = model_type in GEMMA_TYPES
    # Gemma names its activation `hidden_activation`; the others `hidden_act`.
    act_key, act = ("hidden_activation", "gelu_pytorch_tanh") if gemma else ("hidden_act", "silu")
    if (hf.get(act_key) or act) != act:
        raise ValueError(f"{source}: {act_key} {hf[act_key]!r} is not supported; {model_type} models need {act!r}")
    heads, hidden, layers = need("num_attention_heads"), need("hidden_size"), need("num_hidden_layers")
    max_positions = hf.get("max_position_embeddings", _DEFAULT_MAX_POSITIONS[model_type])
    head_dim = hf.get("head_dim")
    if head_dim is not None and hidden % heads == 0 and head_dim == hidden // heads:
        head_dim = None  # the implied value: equal configs compile once, whatever the file said
    if model_type == "qwen2":
        attention_bias, o_proj_bias = True, False
    elif model_type in ("mistral", "phi3", "mixtral"):
        attention_bias = o_proj_bias = False
    else:  # HF's attention_bias means q, k, v and o
        attention_bias = o_proj_bias = bool(hf.get("attention_bias", False))
    sliding_window, layer_types = _attention_windows(hf, model_type, layers, source)
    family = {}
    if gemma:
        if hf.get("use_bidirectional_attention"):
            raise ValueError(f"{source}: use_bidirectional_attention is not supported (specjax decodes causally)")
        default_cap = (30.0, 50.0) if model_type == "gemma2" else (None, None)
        family = {
            "query_pre_attn_scalar": float(hf.get("query_pre_attn_scalar", 256)),
            "final_logit_softcapping": hf.get("final_logit_softcapping", default_cap[0]),
            "attn_logit_softcapping": hf.get("attn_logit_softcapping", default_cap[1]),
        }
    if model_type in MOE_TYPES:
        family = _moe_fields(hf, model_type, need, source)
    theta, rope_scaling, local_theta = _rope(hf, model_type, max_positions, source)
    return ModelConfig(
        vocab_size=need("vocab_size"),
        hidden_size=hidden,
        intermediate_size=family.pop("intermediate_size", None) or need("intermediate_size"),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        rope_theta=float(theta),
        rope_scaling=rope_scaling,
        rope_local_base_freq=local_theta,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=max_positions,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", gemma)),
        attention_bias=attention_bias,
        o_proj_bias=o_proj_bias,
        mlp_bias=bool(hf.get("mlp_bias", False)) if model_type == "llama" else False,
        head_dim=head_dim,
        dtype=dtype,
        model_type=model_type,
        sliding_window=sliding_window,
        layer_types=layer_types,
        **family,
    )


def _moe_fields(hf: dict, model_type: str, need, source: str) -> dict:
    if model_type == "mixtral":
        return {
            "num_experts": need("num_local_experts"),
            "num_experts_per_tok": hf.get("num_experts_per_tok", 2),
            "norm_topk_prob": True,
        }
    # Every layer sparse: the Qwen3-MoE checkpoints published so far.
    if hf.get("mlp_only_layers") or hf.get("decoder_sparse_step", 1) != 1:
        raise ValueError(
            f"{source}: Qwen3-MoE with dense layers (mlp_only_layers={hf.get('mlp_only_layers')}, "
            f"decoder_sparse_step={hf.get('decoder_sparse_step')}) is not supported; only every layer sparse"
        )
    experts = hf.get("num_experts") or hf.get("num_local_experts")
    if not experts:
        raise ValueError(f"{source} lacks 'num_experts', which a qwen3_moe config must have")
    return {
        "num_experts": experts,
        "num_experts_per_tok": need("num_experts_per_tok"),
        "norm_topk_prob": bool(hf.get("norm_topk_prob", False)),
        "intermediate_size": need("moe_intermediate_size"),  # every layer is an MoE layer
    }


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


def _rope(hf: dict, model_type: str, max_positions: int, source: str) -> tuple[float, dict | None, float | None]:
    """(rope_theta, rope_scaling or None, Gemma 3's local base or None) from an HF config.

    transformers 5 writes `rope_parameters` (theta inside; Gemma 3 nests one per layer type);
    4.x wrote `rope_theta`, `rope_scaling` and Gemma 3's `rope_local_base_freq` at the top level.
    """
    default_theta = hf.get("rope_theta", _DEFAULT_THETA.get(model_type, 10000.0))
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if model_type != "gemma3_text":
        return (*_rope_entry(rope, hf, default_theta, max_positions, model_type, source), None)
    if "full_attention" in rope or "sliding_attention" in rope:  # transformers 5: one entry per layer type
        full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
    else:
        full, local = rope, {"rope_theta": hf.get("rope_local_base_freq", 10000.0)}
    theta, scaling = _rope_entry(full, hf, default_theta, max_positions, model_type, source)
    local_theta, local_scaling = _rope_entry(local, hf, 10000.0, max_positions, model_type, source)
    if local_scaling is not None:
        raise ValueError(f"{source}: rope scaling on Gemma 3's sliding-window layers is not supported")
    return theta, scaling, float(local_theta)


def _rope_entry(rope: dict, hf: dict, default_theta: float, max_positions: int, model_type: str, source: str):
    """One rope dict -> (theta, rope_scaling dict or None), checked against what specjax computes."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    theta = rope.get("rope_theta", default_theta)
    if rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
        factor = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
        raise ValueError(f"{source}: partial_rotary_factor {factor} is not supported")
    if kind == "default":
        return theta, None
    if kind not in ROPE_SCALING_KEYS or model_type == "phi3":  # transformers' Phi-3 has only default and longrope
        supported = "default" if model_type == "phi3" else ", ".join(["default", *ROPE_SCALING_KEYS])
        raise ValueError(
            f"{source}: rope scaling {kind!r} (rope_scaling / rope_parameters) is not supported for "
            f"{model_type}; supported: {supported}"
        )
    required, optional = ROPE_SCALING_KEYS[kind]
    scaling = {"rope_type": kind} | {key: rope[key] for key in (*required, *optional) if rope.get(key) is not None}
    if "original_max_position_embeddings" in required and "original_max_position_embeddings" not in scaling:
        scaling["original_max_position_embeddings"] = max_positions  # transformers' fallback
    missing = [key for key in required if key not in scaling]
    if missing:
        raise ValueError(f"{source}: rope scaling {kind!r} lacks {', '.join(map(repr, missing))}")
    return theta, scaling


def _attention_windows(hf: dict, model_type: str, layers: int, source: str) -> tuple[int | None, list | None]:
    """(sliding_window, layer_types) as transformers applies them; see ModelConfig.sliding_window."""
    if model_type == "llama":
        return None, None  # transformers' Llama has no sliding window, whatever config.json says
    if model_type in ("qwen2", "qwen3", "qwen3_moe") and not hf.get("use_sliding_window", False):
        return None, None
    window = hf.get("sliding_window", _DEFAULT_WINDOW.get(model_type))
    if window is None:
        return None, None
    types = None
    if model_type in ("qwen2", "qwen3"):
        first = hf.get("max_window_layers", 28)
        types = hf.get("layer_types") or [LAYER_TYPES[i >= first] for i in range(layers)]
    elif model_type in GEMMA_TYPES:
        # Gemma 2 alternates local and global layers; Gemma 3 has five local layers per global one.
        pattern = hf.get("sliding_window_pattern", hf.get("_sliding_window_pattern", 6))
        pattern = 2 if model_type == "gemma2" else pattern
        types = hf.get("layer_types") or [LAYER_TYPES[bool((i + 1) % pattern)] for i in range(layers)]
    if types is not None and (len(types) != layers or any(t not in LAYER_TYPES for t in types)):
        raise ValueError(f"{source}: layer_types must name one of {', '.join(LAYER_TYPES)} per layer, got {types}")
    return window, types


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
        fields = _llama_family_fields(config)
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


def _llama_family_fields(config: ModelConfig) -> dict:
    mt = config.model_type
    fields = {
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.resolved_head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        # Both transformers 4 and 5 accept these (5 moves them into rope_parameters).
        "rope_theta": config.rope_theta,
        "rope_scaling": dict(config.rope_scaling) if config.rope_scaling else None,
        "max_position_embeddings": config.max_position_embeddings,
    }
    types = [LAYER_TYPES[config.layer_slides(i)] for i in range(config.num_hidden_layers)]
    if mt in GEMMA_TYPES:
        fields |= {
            "hidden_activation": "gelu_pytorch_tanh",
            "attention_bias": config.attention_bias,
            # transformers types it int (strictly, in 5.x): 256.0 must be written as 256.
            "query_pre_attn_scalar": _int_if_whole(config.query_pre_attn_scalar),
            "attn_logit_softcapping": config.attn_logit_softcapping,
            "final_logit_softcapping": config.final_logit_softcapping,
            # A Gemma without a window is all global layers; the window value is then unused.
            "sliding_window": config.sliding_window or config.max_position_embeddings,
            "layer_types": types,
        }
        if mt == "gemma3_text":
            fields["rope_local_base_freq"] = config.rope_local_base_freq
        return fields
    fields["hidden_act"] = "silu"
    if mt in ("llama", "qwen3", "qwen3_moe"):
        fields["attention_bias"] = config.attention_bias or config.o_proj_bias
    if mt == "llama":
        fields["mlp_bias"] = config.mlp_bias
    else:
        fields["sliding_window"] = config.sliding_window
    if mt in ("qwen2", "qwen3", "qwen3_moe"):
        fields["use_sliding_window"] = config.sliding_window is not None
        if mt != "qwen3_moe" and config.sliding_window is not None:
            fields |= {"layer_types": types, "max_window_layers": types.index("sliding_attention")}
    if mt == "mixtral":
        fields |= {"num_local_experts": config.num_experts, "num_experts_per_tok": config.num_experts_per_tok}
    if mt == "qwen3_moe":
        fields |= {
            "num_experts": config.num_experts,
            "num_experts_per_tok": config.num_experts_per_tok,
            "norm_topk_prob": config.norm_topk_prob,
            "moe_intermediate_size": config.intermediate_size,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        }
    return fields


def _int_if_whole(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


__all__ = ["ARCHITECTURES", "config_from_hf", "config_to_hf"]
