"""`shard_model`: lay a Model's params out on a mesh, so that every jit that reads them runs sharded.

JAX jit follows the data: a generation jit whose params arrive as NamedSharding arrays is
compiled as one SPMD program over the mesh, and the partitioner inserts the all-reduces
that tensor parallelism needs. The engine's only contact with meshes is placement.py.
"""

from __future__ import annotations

import dataclasses

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from specjax.io.model import Model
from specjax.parallel.layout import expand_kv_heads, param_shardings, plan, sharded_config
from specjax.parallel.mesh import mesh_shape


def shard_model(model: Model, mesh: Mesh) -> Model:
    """`model` with its params placed on `mesh` (layout: specjax/parallel/layout.py).

    Raises ValueError naming the numbers when the model cannot be split over the mesh's
    "model" axis. With fewer kv heads than the "model" axis the returned config counts the
    replicated kv heads (num_key_value_heads = model axis); its outputs are unchanged.
    """
    p = plan(model.config, mesh_shape(mesh)[1])
    params = expand_kv_heads(model.params, p.kv_repeat)
    params = jax.device_put(params, param_shardings(params, mesh, p))
    return dataclasses.replace(model, config=sharded_config(model.config, p), params=params)


def replicate_model(model: Model, mesh: Mesh) -> Model:
    """`model` with a full copy of its params on every device of `mesh` (a small draft: no
    all-reduces in its K sequential steps, at the price of its params on every device)."""
    return dataclasses.replace(model, params=jax.device_put(model.params, NamedSharding(mesh, PartitionSpec())))
