"""SmoothQuant for the int8 weight format: move activation outliers into the weights.

int8 quantises each token's activations by that token's largest magnitude, and a few input
channels of a transformer's projections run 10-100x larger than the rest: every other
channel is left with a handful of codes. On SmolLM2-135M that costs a next-token KL of 0.029
against float32, where int8 weights with float activations cost 0.0034 (results/weight_formats).
SmoothQuant (Xiao et al., 2023, arXiv 2211.10438) divides input channel j by
s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) and multiplies the weight's row j by s_j: the
float product is unchanged, the activations are flatter and the weights a little less so.
The 1/s_j folds into the operation that produces X, so the model runs unchanged:

  q/k/v input   the input norm's scale (shared by q, k and v: one s for the three)
  gate/up input the post-attention norm's scale
  o_proj input  v_proj's output channels (and v's bias): attention is linear in v. Heads
                sharing a K/V head share its channel, so s is taken per K/V head.
  down input    up_proj's output channels: act(gate) * up is linear in up.

The LM head is left alone: it is tied to the embedding in most small models, and the draft
heads read it (models/heads.py). The smoothed float32 params compute the same function as the
original up to float rounding; quantising them is then `with_weights`' int8 conversion.

The maxima come from a forward over calibration tokens (`CALIBRATION`, shipped with specjax,
or the caller's): the model's `_project` is observed from outside while one forward is traced
(models/ holds no hooks), and the observer returns each projection input's channel maxima,
by name and layer, as outputs of that one jitted program.
"""

from __future__ import annotations

import contextlib
from importlib import resources

import jax
import jax.numpy as jnp
import numpy as np

ALPHA = 0.5  # SmoothQuant's default; scripts/weight_formats.py --smoothing measures others
# Generic English, code and a chat turn: what a chat model's activations look like, in the wheel.
CALIBRATION = "calibration.txt"
_GEMMA_NORMS = ("gemma2", "gemma3_text")  # HF's (1 + w) norm: the scale is 1 + w


def calibration_tokens(model, max_tokens: int = 512) -> np.ndarray:
    """[1, T] int32: the shipped calibration text in the model's tokenizer (T <= max_tokens);
    a model without a tokenizer (the random presets) gets fixed pseudo-random token ids."""
    if model.tokenizer is None:
        return np.random.default_rng(0).integers(0, model.config.vocab_size, (1, max_tokens), dtype=np.int32)
    text = resources.files("specjax.io").joinpath(CALIBRATION).read_text(encoding="utf-8")
    ids = list(model.tokenizer.encode(text))[:max_tokens]
    return np.asarray([ids], np.int32)


@contextlib.contextmanager
def _observed(seen: dict[str, list]):
    """Record the per-channel |x| maxima of every projection input, by projection name."""
    from specjax.models import llama

    project = llama._project

    def observe(module, name, x):
        seen.setdefault(name, []).append(jnp.max(jnp.abs(x), axis=(0, 1)))  # x [B, T, ...]: over every token
        return project(module, name, x)

    llama._project = observe
    try:
        yield
    finally:
        llama._project = project


def activation_maxima(model, tokens) -> dict[str, list[np.ndarray]]:
    """{projection name: [per layer, the input's channel maxima]} over tokens [B, T]."""
    from specjax.models import full_forward

    def maxima(params, tokens):
        seen: dict[str, list] = {}
        with _observed(seen):
            full_forward(model.config, params, tokens)
        return seen

    seen = jax.device_get(jax.jit(maxima)(model.params, jnp.asarray(tokens, jnp.int32)))
    layers = model.config.num_hidden_layers
    for name in ("q_proj", "o_proj", "up_proj", "down_proj"):
        if len(seen.get(name, ())) != layers:
            raise ValueError(f"calibration saw {len(seen.get(name, ()))} {name} inputs, expected {layers}")
    return seen


def _factors(x_max, w_max, alpha: float):
    """s = x^alpha / w^(1 - alpha) per channel; 1 where either side is 0 (a dead channel)."""
    x_max, w_max = np.asarray(x_max, np.float64), np.asarray(w_max, np.float64)
    s = np.where((x_max > 0) & (w_max > 0), x_max**alpha / np.maximum(w_max, 1e-30) ** (1 - alpha), 1.0)
    return np.clip(s, 1e-4, 1e4).astype(np.float32)


def _divide_norm(scale, s, gemma: bool):
    """A norm whose output is divided by s: w / s, or (1 + w) / s - 1 for Gemma's norm."""
    return (1.0 + scale) / s - 1.0 if gemma else scale / s


def smooth(model, tokens=None, alpha: float = ALPHA):
    """Float32 params of `model` with SmoothQuant's factors folded in (the same function).

    tokens: calibration token ids [B, T] (default: `calibration_tokens(model)`).
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"SmoothQuant's alpha must lie in [0, 1], got {alpha}")
    config = model.config
    if config.weights != "float32":
        raise ValueError(f"SmoothQuant smooths float32 params, got weights={config.weights!r}")
    seen = activation_maxima(model, calibration_tokens(model) if tokens is None else tokens)
    gemma = config.model_type in _GEMMA_NORMS
    kv, heads = config.num_key_value_heads, config.num_attention_heads
    params = jax.tree.map(np.asarray, model.params)  # host copies: edited below, then back to jax
    for i in range(config.num_hidden_layers):
        layer = params["layers"][i]
        attn, mlp = layer["attn"], layer["mlp"]
        # q/k/v: one factor per model channel d, from the largest weight of the three in row d.
        rows = [np.abs(attn[n]).reshape(attn[n].shape[0], -1).max(axis=1) for n in ("q_proj", "k_proj", "v_proj")]
        w = np.max(rows, axis=0)
        s = _factors(seen["q_proj"][i], w, alpha)  # [D]
        layer["input_norm"]["scale"] = _divide_norm(layer["input_norm"]["scale"], s, gemma)
        for n in ("q_proj", "k_proj", "v_proj"):
            attn[n] = attn[n] * s[:, None, None]
        # o_proj: its input channel (h, k) is v's channel (h // G, k); one factor per K/V head.
        x = seen["o_proj"][i].reshape(kv, heads // kv, -1).max(axis=1)  # [n_kv, d_head]
        w = np.abs(attn["o_proj"]).max(axis=2).reshape(kv, heads // kv, -1).max(axis=1)
        s = _factors(x, w, alpha)  # [n_kv, d_head]
        attn["v_proj"] = attn["v_proj"] / s[None]
        if "v_bias" in attn:
            attn["v_bias"] = attn["v_bias"] / s
        attn["o_proj"] = attn["o_proj"] * np.repeat(s, heads // kv, axis=0)[:, :, None]
        # gate/up: one factor per model channel, as q/k/v.
        w = np.maximum(np.abs(mlp["gate_proj"]).max(axis=1), np.abs(mlp["up_proj"]).max(axis=1))
        s = _factors(seen["up_proj"][i], w, alpha)  # [D]
        layer["post_attention_norm"]["scale"] = _divide_norm(layer["post_attention_norm"]["scale"], s, gemma)
        mlp["gate_proj"], mlp["up_proj"] = mlp["gate_proj"] * s[:, None], mlp["up_proj"] * s[:, None]
        # down: its input channel f is up's output channel f.
        s = _factors(seen["down_proj"][i], np.abs(mlp["down_proj"]).max(axis=1), alpha)  # [F]
        mlp["up_proj"] = mlp["up_proj"] / s[None, :]
        mlp["down_proj"] = mlp["down_proj"] * s[:, None]
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.float32) if a.dtype.kind == "f" else jnp.asarray(a), params)
