"""The matrix products of a weight format: float32 (today's einsum), bfloat16 and int8.

Every projection of the Llama family (q/k/v/o, gate/up/down) and its LM head go through
`project`. A format is chosen at load time (ModelConfig.weights, specjax/io/weight_formats.py):

  float32:  `jnp.einsum(spec, x, w)` exactly, in the params' dtype (ModelConfig.dtype).
  bfloat16: x and w in bfloat16, accumulated and returned in float32.
  int8:     w int8 with a float32 scale per output channel (symmetric: absmax / 127 over the
            contraction axes of w); x quantised the same way per token (absmax over its
            contraction axes) at each call; int8 x int8 -> int32 products, then
            int32 * (x_scale * w_scale) in float32. Integer accumulation is exact, so a row's
            product depends on that row alone: it cannot change with the batch or the verify
            width (float32 and bfloat16 sums can: XLA:CPU's kernels round them differently
            at another row count at SmolLM2's shapes).

Why few rows are padded: XLA:CPU's bfloat16 and int8 dot kernels are fast from two rows up
and slow for exactly one (a 1-row int8 forward costs 2.6x a 2-row one, measured on
SmolLM2-135M shapes), and the row count also picks *which* kernel sums a row, in which order
(scripts/width_classes.py, results/width_classes: float32 {1} {2+}; bfloat16 with float32
accumulation {1} {2} {3+}; int8 one class). So a product with fewer rows than MIN_ROWS runs
with zero rows added and is sliced back: a plain step (one row per sequence) then runs the
verify's kernel, fast, and a row's products are the same bits whether it is decoded alone
or verified among K + 1 (with models/fixed_order.py's sums, its logits too: greedy
speculation equals plain). float32 is not padded: its one-row kernel is its fastest (its
exactness is tested, not built in).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .config import WEIGHT_FORMATS

STORED_DTYPES = {"bfloat16": jnp.bfloat16, "int8": jnp.int8}  # a non-float32 format's matrices
_QMAX = 127.0  # symmetric int8: [-127, 127], so negation never overflows
# absmax * (1 / 127), not absmax / 127: XLA turns a division by a constant into this product
# under jit but not op by op, and a scale must not depend on which ran it.
_INV_QMAX = np.float32(1.0 / _QMAX)


def _parse(spec: str) -> tuple[str, str, str]:
    inputs, out = spec.replace(" ", "").split("->")
    xs, ws = inputs.split(",")
    return xs, ws, out


def _contracted(spec: str) -> tuple[str, str, str, str]:
    """(x subscripts, w subscripts, output subscripts, contracted letters) of `spec`."""
    xs, ws, out = _parse(spec)
    return xs, ws, out, "".join(c for c in xs if c in ws and c not in out)


def quantize(w, axes: tuple[int, ...]):
    """Symmetric int8 over `axes` (the contraction axes): w -> (int8 like w, float32 scale of
    w's shape without `axes`). An all-zero channel gets scale 0 and codes 0 (no NaN)."""
    w = jnp.asarray(w).astype(jnp.float32)
    scale = jnp.max(jnp.abs(w), axis=axes) * _INV_QMAX
    safe = jnp.where(scale == 0, 1.0, scale)
    q = jnp.clip(jnp.round(w / jnp.expand_dims(safe, axes)), -_QMAX, _QMAX).astype(jnp.int8)
    return q, scale


def weight_axes(spec: str) -> tuple[int, ...]:
    """The contraction axes of the weight (second operand) of `spec`."""
    _, ws, _, contracted = _contracted(spec)
    return tuple(i for i, c in enumerate(ws) if c in contracted)


# The fewest rows a product runs with, per format (see the module docstring).
MIN_ROWS = {"float32": 1, "bfloat16": 3, "int8": 2}


def _padding(xs: str, ws: str, out: str, x, min_rows: int) -> tuple[str, int] | None:
    """(axis letter, its padded size) when x has fewer than `min_rows` rows (the product of
    its non-contracted sizes): its first axis that the weight lacks and the output keeps,
    grown until the rows reach min_rows; None when no padding is needed."""
    rows = int(np.prod([n for c, n in zip(xs, x.shape, strict=True) if c in out]))
    letter = next((c for c in xs if c not in ws and c in out), None)
    if rows >= min_rows or letter is None or rows == 0:
        return None
    size = x.shape[xs.index(letter)]
    return letter, -(-min_rows // (rows // size))  # ceil: the other axes' rows times the new size


def project(x, w, scale, spec: str, fmt: str):
    """einsum(spec, x, w) in weight format `fmt`; `scale` is w's int8 scale (None otherwise).

    x: activations (its contraction axes are those it shares with w and the output drops);
    w: the stored weight. Returns float32 for bfloat16/int8, today's dtype for float32.
    """
    if fmt == "float32":
        if w.dtype == jnp.int8:  # would promote the codes to floats and drop the scale: wrong, silently
            raise ValueError(
                "an int8 weight in a float32 product: this module (a draft head reading an int8 target's "
                "embedding or LM head?) does not support int8 weights yet; use the float32 or bfloat16 target"
            )
        return jnp.einsum(spec, x, w)
    xs, ws, out = _parse(spec)
    padding = _padding(xs, ws, out, x, MIN_ROWS.get(fmt, 1))
    if padding is None:
        return _product(x, w, scale, spec, fmt)
    letter, size = padding
    axis, kept = xs.index(letter), x.shape[xs.index(letter)]
    widths = [(0, size - kept if i == axis else 0) for i in range(x.ndim)]
    padded = jnp.pad(x, widths)  # zero rows: each row's product reads its own row only
    return jax.lax.slice_in_dim(_product(padded, w, scale, spec, fmt), 0, kept, axis=out.index(letter))


def _product(x, w, scale, spec: str, fmt: str):
    if fmt == "bfloat16":
        return jnp.einsum(spec, x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
    if fmt != "int8":
        raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {fmt!r}")
    if scale is None:
        raise ValueError("int8 weights need their scale")
    xs, ws, out, contracted = _contracted(spec)
    axes = tuple(i for i, c in enumerate(xs) if c in contracted)
    qx, x_scale = quantize(x, axes)  # per token: x's non-contracted axes keep their own scale
    acc = jnp.einsum(spec, qx, w, preferred_element_type=jnp.int32)
    kept_x = "".join(c for c in xs if c not in contracted)
    kept_w = "".join(c for c in ws if c not in contracted)
    # The two scales' outer product laid out as the output (einsum does the broadcasting).
    scales = jnp.einsum(f"{kept_x},{kept_w}->{out}", x_scale, scale.astype(jnp.float32))
    return acc.astype(jnp.float32) * scales
