"""Mixed precision for training: float32 weights and optimizer, the products in bfloat16.

A config's `compute_dtype` ("float32" or "bfloat16") names the dtype a training step runs
the trained network in. Its weights, its optimizer state and what is saved stay float32;
inside the differentiated loss the network runs on a `compute_copy` of them, so the
gradients come back through the cast as float32. The losses' softmaxes and sums stay
float32 (the models return float32 logits, from a bfloat16 product: rounded as bfloat16).
On a CPU with bfloat16 matrix units (AMX, AVX512_BF16) the products take a third less time
(results/feature_store).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

COMPUTE_DTYPES = ("float32", "bfloat16")


def check_compute_dtype(name: str, value: str) -> None:
    """A ValueError naming the setting unless `value` is one of COMPUTE_DTYPES."""
    if value not in COMPUTE_DTYPES:
        raise ValueError(f"{name} must be one of {', '.join(COMPUTE_DTYPES)}, got {value!r}")


def cast_floats(tree, dtype):
    """Every floating leaf of `tree` in `dtype` (integer leaves, such as a d2t map, as they are)."""
    dt = jnp.dtype(dtype)
    return jax.tree.map(lambda x: x.astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def compute_copy(dtype: str, config, params):
    """(config with `dtype`, params cast to it): what a loss runs the trained network on. The
    config's dtype is what its caches and activations take, so attention runs in it too.
    "float32" returns both as they are: a network whose own config is bfloat16 stays so."""
    if dtype == "float32":
        return config, params
    return dataclasses.replace(config, dtype=dtype), cast_floats(params, dtype)
