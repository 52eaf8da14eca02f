"""Scale out: sharded target and draft on a jax.sharding Mesh, across devices and hosts.

  mesh.py        make_mesh(data=, model=), parsing "data=2,model=4", clear errors
  layout.py      Megatron-style PartitionSpecs of params, caches and per-row state
  placement.py   the engine hook: prompt rows on the "data" axis
  multihost.py   initialize(): jax.distributed for GPU clusters, TPU pods and CPU (gloo)
  cost.py        bytes each tensor-parallel layer all-reduces; predicted TP efficiency

The engine knows meshes only through placement.py (prompt rows onto "data" in
engine/prompts.py, rows gathered across hosts in engine/output.py): a jit whose inputs are
NamedSharding arrays is one SPMD program over the mesh, and XLA inserts the collectives.
Placing a Model on a mesh (io/sharding.py: shard_model, replicate_model) and reading only a
device's slices of a checkpoint (io/sharded_loading.py) are io's; placing a drafter beside
its target is drafters/pair_placement.py's. This package imports neither: it sits below both.
"""

from specjax.parallel import multihost
from specjax.parallel.layout import Plan, param_specs, plan
from specjax.parallel.mesh import DATA, MODEL, make_mesh, mesh_from, parse_mesh

__all__ = [
    "DATA",
    "MODEL",
    "Plan",
    "make_mesh",
    "mesh_from",
    "multihost",
    "param_specs",
    "parse_mesh",
    "plan",
]
