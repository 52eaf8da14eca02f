"""Placing a generation's per-row inputs on the "data" axis of the mesh its params live on.

The engine calls two hooks here: `place_rows` (engine/prompts.py), and `gather_rows`
(engine/output.py, multi-host only). Prompts, their lengths and the
`done` mask go to NamedSharding(mesh, P("data", ...)), and from there the SPMD partitioner
propagates the row split to every buffer the jitted loop creates (token buffer, KV caches,
per-row counters), while the params' layout puts kv heads on "model". Without a mesh
(params on one device) everything stays as before.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from specjax.parallel.mesh import DATA, mesh_shape, params_mesh


def model_mesh(model):
    """The mesh `model`'s params are laid out on (None when they are not on one)."""
    return params_mesh(model.params)


def row_multiple(mesh) -> int:
    """Batch buckets are padded to a multiple of this (the "data" axis size; 1 without a mesh)."""
    return 1 if mesh is None else mesh_shape(mesh)[0]


def pad_rows(bucket_rows: int, mesh) -> int:
    """`bucket_rows` rounded up to a multiple of the "data" axis, so rows split evenly."""
    m = row_multiple(mesh)
    return -(-bucket_rows // m) * m


def place_rows(arrays: tuple, mesh) -> tuple:
    """device_put numpy arrays whose first axis is rows: split over "data" when it divides them.

    Without a mesh, or rows the "data" axis does not divide (a step-by-step state of the
    caller's exact rows), a plain uncommitted device_put: jit then places them itself.
    """
    rows = np.shape(arrays[0])[0]
    if mesh is None or rows % row_multiple(mesh):
        return jax.device_put(arrays)
    shardings = tuple(NamedSharding(mesh, P(DATA, *([None] * (np.ndim(a) - 1)))) for a in arrays)
    return jax.device_put(arrays, shardings)


def gather_rows(state):
    """A final loop state whose row arrays every process can read: the engine's collect hook.

    One process (the usual case) returns `state` untouched. Across processes, rows split
    over "data" live partly on other hosts, so every non-addressable array except KV caches
    (never read by collect, and the bulk of the bytes) and rng keys is all-gathered to a
    host numpy array.
    """
    if jax.process_count() == 1:
        return state
    from jax.experimental import multihost_utils

    from specjax.models import KVCache

    def gather(x):
        if isinstance(x, KVCache) or not isinstance(x, jax.Array) or x.is_fully_addressable:
            return x
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # rng keys: not output, not gatherable
            return x
        return multihost_utils.process_allgather(x, tiled=True)

    return jax.tree.map(gather, state, is_leaf=lambda x: isinstance(x, KVCache))
