"""A target and its drafter on a mesh, as the CLI and the bench's `mesh:` place them."""

from __future__ import annotations

import dataclasses

from jax.sharding import Mesh

from specjax.drafters.draft_model import DraftModel
from specjax.io.model import Model
from specjax.io.sharding import replicate_model, shard_model


def shard_pair(target: Model, draft, mesh: Mesh):
    """A target and its draft on `mesh`, as the CLI and the bench's `mesh:` place them.

    The target is tensor-parallel; a draft model is too when its heads split over the
    "model" axis, else replicated (a draft is small, and a replicated one runs its K
    sequential steps with no communication). Other drafters are returned as they are:
    their weights, if any, are copied to the mesh by jit. `draft` may be None (plain).
    """
    target = shard_model(target, mesh)
    if isinstance(draft, Model):
        draft = DraftModel(draft)
    if isinstance(draft, DraftModel) and draft.model is not None:
        try:
            placed = shard_model(draft.model, mesh)
        except ValueError:
            placed = replicate_model(draft.model, mesh)
        draft = dataclasses.replace(draft, model=placed)
    return target, draft
