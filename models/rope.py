"""Rotary position embeddings and their scaled variants, as transformers computes them.

`frequencies` mirrors transformers' modeling_rope_utils for the rope types specjax loads
(default, linear, dynamic, yarn, llama3): the inverse frequencies are computed once per
trace, in numpy float32 like torch's float32 ops, and become constants of the program.
Every type only changes the frequencies, except YaRN, which also scales cos and sin by an
attention factor (so scores by its square).
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import numpy as np


@functools.cache
def _frequencies(head_dim: int, theta: float, scaling: tuple | None) -> tuple[np.ndarray, float]:
    dim = head_dim
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)  # [d_head / 2]
    inv_freq = (np.float32(1.0) / np.power(np.float32(theta), exponents)).astype(np.float32)
    if scaling is None:
        return inv_freq, 1.0
    params = dict(scaling)
    kind, factor = params["rope_type"], float(params["factor"])
    if kind == "linear":  # positions / factor, i.e. frequencies / factor
        return (inv_freq / np.float32(factor)).astype(np.float32), 1.0
    if kind == "dynamic":
        # NTK-aware: transformers grows the base once the sequence passes
        # max_position_embeddings; below it the base is rope_theta. specjax never runs a
        # position at or past max_position_embeddings (generation and logits refuse), so
        # the default frequencies are exact here.
        return inv_freq, 1.0
    if kind == "llama3":
        return _llama3(inv_freq, params, factor), 1.0
    if kind == "yarn":
        return _yarn(theta, dim, params, factor)
    raise ValueError(f"rope_type {kind!r} is not supported")


def _llama3(inv_freq: np.ndarray, params: dict, factor: float) -> np.ndarray:
    """Llama 3.1: long wavelengths divided by factor, short ones kept, a smooth ramp between."""
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    old_context = float(params["original_max_position_embeddings"])
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = (np.float32(2 * math.pi) / inv_freq).astype(np.float32)
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / np.float32(factor), inv_freq).astype(np.float32)
    smooth = ((old_context / wavelen - low) / (high - low)).astype(np.float32)
    smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn(theta: float, dim: int, params: dict, factor: float) -> tuple[np.ndarray, float]:
    """YaRN: interpolate low frequencies, extrapolate high ones, ramp between; scale cos/sin."""
    original = params["original_max_position_embeddings"]

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def correction_dim(rotations):  # the dimension whose wavelength makes `rotations` turns in `original`
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers does, to avoid dividing by zero
    pos_freqs = np.power(np.float32(theta), np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    extrapolation = np.float32(1.0) / pos_freqs
    interpolation = np.float32(1.0) / (np.float32(factor) * pos_freqs)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
    keep = 1 - ramp  # 1: extrapolate (high frequencies), 0: interpolate
    inv_freq = interpolation * (1 - keep) + extrapolation * keep
    return inv_freq.astype(np.float32), float(attention_factor)


def frequencies(head_dim: int, theta: float, scaling: dict | None = None) -> tuple[np.ndarray, float]:
    """(inverse frequencies [d_head / 2] float32, attention factor) of one rotary variant.

    scaling: HF's rope_scaling dict (rope_type plus its keys), or None for the default.
    """
    return _frequencies(head_dim, float(theta), None if scaling is None else tuple(sorted(scaling.items())))


def rotary(x, positions, inv_freq: np.ndarray, attention_factor: float = 1.0):
    """Rotate-half rotary embedding (HF convention), computed in float32.

    x: [B, T, heads, d_head]; positions: [B, T] absolute positions; inv_freq: [d_head / 2].
    """
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, d_half]
    cos = (jnp.cos(angles) * attention_factor)[:, :, None, :]
    sin = (jnp.sin(angles) * attention_factor)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)
