"""Scale out: sharded target and draft on a jax.sharding Mesh, across devices and hosts.

  mesh.py        make_mesh(data=, model=), parsing "data=2,model=4", clear errors
  layout.py      Megatron-style PartitionSpecs of params, caches and per-row state
  shard.py       shard_model: a Model's params placed on a mesh
  placement.py   the engine hook: prompt rows on the "data" axis
  loading.py     each process reads only its devices' slices of a safetensors checkpoint
  distributed.py initialize(): jax.distributed for GPU clusters, TPU pods and CPU (gloo)
  cost.py        bytes each tensor-parallel layer all-reduces; predicted TP efficiency

The engine knows meshes only through placement.py (prompt rows onto "data" in
engine/prompts.py, rows gathered across hosts in engine/output.py): a jit whose inputs are
NamedSharding arrays is one SPMD program over the mesh, and XLA inserts the collectives.
"""

from specjax.parallel import distributed
from specjax.parallel.layout import Plan, param_specs, plan
from specjax.parallel.mesh import DATA, MODEL, make_mesh, mesh_from, parse_mesh
from specjax.parallel.shard import replicate_model, shard_model

__all__ = [
    "DATA",
    "MODEL",
    "Plan",
    "distributed",
    "make_mesh",
    "mesh_from",
    "param_specs",
    "parse_mesh",
    "plan",
    "replicate_model",
    "shard_model",
]
