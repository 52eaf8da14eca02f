"""Weight formats chosen at load time: `with_weights(model, "int8")` and the list of formats.

  float32:  the params as loaded (default; exact against transformers).
  bfloat16: projection, embedding and LM head matrices in bfloat16; products accumulate in
            float32 (models/quant.py). Norms, biases and activations stay float32.
  int8:     those matrices int8 with a float32 scale per output channel (the embedding: per
            vocabulary row); activations quantised per token at each product, int32
            accumulation. A row's products depend on that row alone, whatever the batch or
            the verify width. Before quantising, SmoothQuant (specjax/io/smoothing.py,
            `smoothing=` its alpha, None for none) moves activation outliers into the weights.

In bfloat16 and int8 a position's logits are the same bits at any verify width, batch or cache
length (models/quant.py pads products to MIN_ROWS, models/fixed_order.py sums rows in a fixed
order, models/cache.py rounds the cache to whole attention blocks), so greedy speculative
output equals plain greedy output by construction. float32 keeps XLA's own kernels, its
fastest, exact in every test barring a near-tie. Formats change outputs against float32
(their quality cost), so a format is always the user's choice.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from specjax.io.model import Model, params_sha256
from specjax.io.smoothing import ALPHA, smooth
from specjax.models import init_params
from specjax.models.config import WEIGHT_FORMATS
from specjax.models.llama import PROJECTIONS
from specjax.models.quant import quantize, weight_axes


def check_weights(weights: str) -> str:
    """`weights` if it names a format; else a ValueError naming the formats."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}")
    return weights


def with_weights(model: Model, weights: str, smoothing: float | None = ALPHA, calibration=None) -> Model:
    """`model` with its matrices stored in weight format `weights` (see the module docstring).

    From float32 params (or params loaded in bfloat16: `dtype` becomes float32, the dtype of
    activations, norms and biases in the other formats). The same format returns `model`
    itself; float32 from another format is refused (the rounding is gone). int8 first folds
    SmoothQuant's factors (alpha `smoothing`; None: none) into the float32 params, calibrated
    on `calibration` token ids [B, T] (default: the text shipped with specjax). Raises ValueError
    for an unknown format, a family without the format yet (GPT-2, the MoE families) and
    params laid out over several devices (convert first, or load without a mesh).
    """
    check_weights(weights)
    current = model.config.weights
    if weights == current:
        return model
    if current != "float32":
        raise ValueError(
            f"the model's weights are already {current}: load it with weights='float32' to convert it to {weights}"
        )
    # Validates the family (ModelConfig._check_weights names the model_type it refuses).
    config = dataclasses.replace(model.config, weights=weights, dtype="float32")
    leaves = jax.tree.leaves(model.params)
    if any(len(getattr(x, "sharding", None).device_set) > 1 for x in leaves if hasattr(x, "sharding")):
        raise ValueError(
            f"weights={weights!r} cannot be applied to params laid out on a mesh yet: "
            "use weights='float32' with a mesh, or load without one"
        )
    source_params = model.params
    if weights == "int8" and smoothing is not None:
        source_params = smooth(model, calibration, smoothing)
    params = _convert(source_params, weights)
    _check_layout(config, params)
    # int8 changes the values and adds scales: record the float32 fingerprint for heads.
    # bfloat16 needs none: params_sha256 rounds every float to bfloat16 already.
    source = model.source_fingerprint or (params_sha256(model.params) if weights == "int8" else None)
    return dataclasses.replace(model, config=config, params=params, source_fingerprint=source)


@functools.partial(jax.jit, static_argnums=1)
def _quantized(w, axes: tuple[int, ...]):
    return quantize(w, axes)


_as_bfloat16 = jax.jit(lambda w: w.astype(jnp.bfloat16))
_as_float32 = jax.jit(lambda w: w.astype(jnp.float32))


def _convert(params: dict, weights: str) -> dict:
    """Each matrix named in PROJECTIONS to the format (int8: plus `<name>_scale`); every other
    floating leaf (norm scales, biases) to float32."""
    out = {}
    for name, value in params.items():
        if isinstance(value, dict):
            out[name] = _convert(value, weights)
        elif name in PROJECTIONS:
            if weights == "int8":
                out[name], out[f"{name}_scale"] = _quantized(value, weight_axes(PROJECTIONS[name]))
            else:
                out[name] = _as_bfloat16(value)
        elif jnp.issubdtype(value.dtype, jnp.floating):
            out[name] = _as_float32(value)
        else:
            out[name] = value
    return out


def _leaves(params) -> dict[str, tuple]:
    """ "layers.0.attn.q_proj" -> (shape, dtype) for every leaf (int and str keys alike)."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return {jax.tree_util.keystr(p, simple=True, separator="."): (tuple(x.shape), jnp.dtype(x.dtype)) for p, x in flat}


def _check_layout(config, params: dict) -> None:
    """The converted params have exactly the leaves, shapes and dtypes the config's module
    declares (so nnx.merge(graphdef(config), params) runs); a ValueError names the first not."""
    mine, theirs = _leaves(params), _leaves(jax.eval_shape(functools.partial(init_params, config)))
    if mine != theirs:
        differ = sorted(k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k))
        raise ValueError(
            f"weights={config.weights!r}: the converted params do not fit the model "
            f"({differ[0]}: {mine.get(differ[0])} against {theirs.get(differ[0])})"
        )
