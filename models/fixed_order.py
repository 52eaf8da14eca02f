"""Sums whose order does not depend on how many rows run together.

XLA:CPU picks how to vectorise a reduction from the whole array's shape, so the sum over one
row of a [T, S] array can come out in other bits at T = 1 than at T = 5
(results/width_classes: a softmax over 256 keys has classes {1}, {2..16} of row counts).
A plain step (one row per sequence) and a verify (K + 1 rows) then normalise the same
position's attention scores and activations differently by an ulp, and in the int8 format
an ulp before the per-token quantisation can move a code and the logits by ~2: greedy
speculative output leaves plain output. Here a sum is a fixed pairwise tree of elementwise
adds (zero-padded to a power of two), which IEEE arithmetic without fast-math evaluates in
the same order for every row whatever the shape. Max is exact in any order, so
softmax needs only the sum. The bfloat16 and int8 weight formats use these (models/llama.py,
models/attention.py); float32 keeps XLA's own reductions, bit for bit as before.
"""

from __future__ import annotations

import jax.numpy as jnp


def tree_sum(x, axis: int = -1, keepdims: bool = False):
    """sum(x, axis) as a balanced tree of adds: the same bits for a row at any row count."""
    x = jnp.moveaxis(x, axis, -1)
    n = x.shape[-1]
    size = 1 << max(n - 1, 0).bit_length()  # the next power of two (1 for n <= 1)
    if size != n:
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, size - n)])
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    out = x[..., 0]
    return jnp.moveaxis(out[..., None], -1, axis) if keepdims else out


def tree_mean(x, axis: int = -1, keepdims: bool = False):
    return tree_sum(x, axis, keepdims) / x.shape[axis]


def softmax(x, axis: int = -1):
    """jax.nn.softmax with a `tree_sum` denominator (rows of -inf only: as jax, NaN never
    arises here because every query sees at least its own slot)."""
    shifted = x - jnp.max(x, axis=axis, keepdims=True)
    e = jnp.exp(shifted)
    return e / tree_sum(e, axis, keepdims=True)
