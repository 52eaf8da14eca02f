"""Training steps over a ("data", "model") mesh: `mesh:` of `train-head` and `distill`.

A training step is one jit whose inputs arrive as NamedSharding arrays, so XLA compiles it
as one SPMD program over the mesh and inserts the collectives itself, as for generation
(specjax/parallel/__init__.py). What goes where:
  - the frozen target: laid out as generation lays it out (io/sharding.py `shard_model`,
    parallel/layout.py): tensor parallel over "model", replicated over "data"; its
    forward inside the step (logits, features) runs sharded, on the fly;
  - the trained params and their optimizer state: replicated (a head), or, for a draft
    model (`layout=`), by the same layout when the draft splits over "model" without
    repeating kv heads (repeated copies would train apart); replicated otherwise;
  - each batch's rows: split over "data"; the loss's mean over rows becomes an all-reduce,
    and the gradients of replicated params come back replicated.
The step's outputs keep the inputs' shardings (out_shardings), so every step runs the one
compiled program. The results equal one device's up to the order of float sums.

Without a mesh (`mesh: null`, the default) every function here does what the trainers
did before: plain arrays, jit placing them itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from specjax.io.model import Model
from specjax.io.sharding import shard_model
from specjax.models import ModelConfig
from specjax.parallel.layout import param_shardings, plan
from specjax.parallel.mesh import DATA, mesh_from, mesh_shape, parse_mesh


def check_mesh(spec: str | None, batch_size: int) -> None:
    """Raise ValueError unless `spec` ("data=2,model=4", or None) parses and its "data" axis
    divides `batch_size` (a config's check: no device is needed)."""
    if spec is None:
        return
    data = parse_mesh(spec).get(DATA, 1)
    if batch_size % data:
        raise ValueError(
            f"mesh {spec!r} splits each batch's rows over data={data} devices, but the batch has {batch_size} "
            f"rows: use a batch_size divisible by {data} (data.batch_size, or dataset.batch_size with a dataset)"
        )


class MeshSteps:
    """Where a trainer's arrays live on `mesh` (a spec as `mesh_from` takes it; None: one device)."""

    def __init__(self, spec, batch_size: int):
        self.mesh: Mesh | None = mesh_from(spec)
        if self.mesh is not None:
            data = mesh_shape(self.mesh)[0]
            if batch_size % data:
                raise ValueError(
                    f"a mesh with data={data} cannot split a batch of {batch_size} rows: "
                    f"use a batch_size divisible by {data}"
                )

    def target(self, model: Model) -> Model:
        """The frozen target as generation places it (`shard_model`); `model` itself without a mesh.

        Its config may count replicated kv heads (layout.py): the step's forward must use it."""
        return model if self.mesh is None else shard_model(model, self.mesh)

    def layout(self, config: ModelConfig):
        """The layout.py plan a trained model of `config` is split by, or None (replicated): a
        model the "model" axis does not split, or one whose kv heads it would repeat."""
        if self.mesh is None:
            return None
        try:
            p = plan(config, mesh_shape(self.mesh)[1])
        except ValueError:
            return None
        return p if p.kv_repeat == 1 else None

    def state(self, params, opt_state, restored: bool, layout=None):
        """(params, opt_state) placed for the step: replicated, or split by `layout` (a plan of
        `self.layout`), the optimizer's moments as their params (their paths end alike).

        Without a mesh, restored arrays (committed to a device by orbax) are made uncommitted
        as fresh ones are, so a run resumed in this process reuses the programs compiled here."""
        if self.mesh is None:
            if restored:
                return jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), (params, opt_state))
            return params, opt_state
        return tuple(jax.device_put(tree, self._shardings(tree, layout)) for tree in (params, opt_state))

    def _shardings(self, tree, layout):
        if layout is None:
            return jax.tree.map(lambda _: NamedSharding(self.mesh, P()), tree)
        return param_shardings(tree, self.mesh, layout)

    def rows(self, *arrays):
        """Batch arrays [B, ...] (None passes through) on the devices: rows split over "data"."""
        if self.mesh is None:
            return tuple(None if a is None else jnp.asarray(a) for a in arrays)
        return tuple(
            None if a is None else jax.device_put(a, NamedSharding(self.mesh, P(DATA, *([None] * (np.ndim(a) - 1)))))
            for a in arrays
        )

    def jit(self, step, params, opt_state, metrics: int):
        """`step(static, optimizer, target_params, params, opt_state, *batch)` -> (params,
        opt_state, *`metrics` more outputs), jitted with params and opt_state donated. On a
        mesh, both come out as `params` and `opt_state` (placed by `state`) went in, and the
        metrics (a loss, its parts) replicated."""
        options = dict(static_argnums=(0, 1), donate_argnums=(3, 4))
        if self.mesh is None:
            return jax.jit(step, **options)
        placed = jax.tree.map(lambda x: x.sharding, (params, opt_state))
        replicated = NamedSharding(self.mesh, P())
        return jax.jit(step, out_shardings=(*placed, *[replicated] * metrics), **options)
