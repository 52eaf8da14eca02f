"""Gemma 3 GGUF files: what differs from the Llama layout specjax/io/gguf_file.py reads.

Three things, each as llama.cpp (the format's reference runtime) defines it:
  names:    the sandwich norms. llama.cpp's `ffn_norm` is HF's pre_feedforward_layernorm
            here (Llama's post_attention_layernorm), and the norms on each sub-layer's
            output are `post_attention_norm` and `post_ffw_norm`.
  weights:  llama.cpp's converter stores every Gemma norm weight as 1 + w (its RMSNorm
            multiplies by the stored weight; HF's, and specjax's GemmaRMSNorm, by 1 + w), so
            1 is subtracted on the way in, as transformers' GGUF loader does.
  config:   the metadata names the window size, the global rotary base and the norm epsilon;
            the rest llama.cpp assumes for every `gemma3` file (llama-model.cpp): five local
            layers per global one, the local rotary base 10000, and the attention score scale
            1 / sqrt(head_dim) (27B, i.e. 62 layers: 1 / sqrt(hidden / heads)). Newer files
            may carry the pattern and the local base (`attention.sliding_window_pattern`,
            `rope.freq_base_swa`); those win. For every released size but 27B the score
            scale equals transformers' default (query_pre_attn_scalar 256), so both load a
            file alike; on a 27B file transformers' default (256) is not what the model
            was trained with (168 = 5376 / 32), which this follows.
"""

from __future__ import annotations

import re

import numpy as np

from specjax.models.config import LAYER_TYPES

_NAMES = (
    (r"^model\.layers\.(\d+)\.pre_feedforward_layernorm\.weight$", r"blk.\1.ffn_norm.weight"),
    (r"^model\.layers\.(\d+)\.post_attention_layernorm\.weight$", r"blk.\1.post_attention_norm.weight"),
    (r"^model\.layers\.(\d+)\.post_feedforward_layernorm\.weight$", r"blk.\1.post_ffw_norm.weight"),
)
# Checked before the Llama table (post_attention_layernorm means another tensor there).
NAME_PATTERNS = tuple((re.compile(hf), gguf) for hf, gguf in _NAMES)

_PATTERN = 6  # llama.cpp's set_swa_pattern(6): layer i is global when (i + 1) % 6 == 0
_LOCAL_BASE = 10000.0  # llama.cpp's rope_freq_base_train_swa for gemma3
_LAYERS_27B = 62  # llama.cpp tells 27B (whose score scale is hidden / heads) by its depth


def config_fields(reader, meta: dict, hf: dict, source: str) -> dict:
    """The Gemma 3 entries of the HF config dict (beyond the Llama ones `hf` holds)."""
    layers, heads = hf["num_hidden_layers"], hf["num_attention_heads"]
    window = meta.get("gemma3.attention.sliding_window")
    if window is None:  # llama.cpp requires it too
        raise ValueError(f"{source} lacks the GGUF metadata key gemma3.'attention.sliding_window'")
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    scalar = hf["hidden_size"] // heads if layers == _LAYERS_27B else head_dim
    fields = {
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": int(window),
        "layer_types": _layer_types(reader, meta, layers, source),
        "rope_local_base_freq": float(meta.get("gemma3.rope.freq_base_swa", _LOCAL_BASE)),
        "query_pre_attn_scalar": scalar,
        # Gemma 3 has neither (HF's config: None); a converter that writes them is obeyed.
        "final_logit_softcapping": meta.get("gemma3.final_logit_softcapping"),
        "attn_logit_softcapping": meta.get("gemma3.attn_logit_softcapping"),
    }
    return fields


def _layer_types(reader, meta: dict, layers: int, source: str) -> list[str]:
    """Per-layer "sliding_attention" / "full_attention": llama.cpp's pattern (an int, every
    n-th layer global) or its per-layer array (true: the layer slides), else the default 6."""
    key = "gemma3.attention.sliding_window_pattern"
    if key in meta:  # one int
        pattern = int(meta[key])
        slides = [bool((i + 1) % pattern) if pattern > 0 else False for i in range(layers)]
    elif key in reader.fields:  # an array, one entry per layer
        slides = [bool(x) for x in reader.fields[key].contents()]
        if len(slides) != layers:
            raise ValueError(f"{source}: {key} has {len(slides)} entries for {layers} layers")
    else:
        slides = [bool((i + 1) % _PATTERN) for i in range(layers)]
    return [LAYER_TYPES[s] for s in slides]


def hf_tensor(gguf_name: str, w: np.ndarray) -> np.ndarray:
    """A dequantized tensor as HF stores it: norm weights back from 1 + w to w."""
    return w - 1.0 if gguf_name.endswith("norm.weight") else w
