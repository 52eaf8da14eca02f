"""The Drafter protocol pieces that several drafters implement the same way.

Each drafter is one file (base.py), but the model-backed ones answer parts of the protocol
identically: where their weights live, how they widen their catch-up, how they turn one
pass's K distributions into a proposal, how they keep the target's states by position.
Written once here, a fix lands in every drafter, and no drafter imports another's
internals. Mixins add methods only, never dataclass fields, so a drafter's fields (its
equality and hash: the jit cache key) are what its own class declares.

  HoldsWeights     weights() / without_weights() for a `params` (or `model`) field
  CatchesUp        tolerating_lag() for a `catch_up` field
  BlockProposals   propose() / propose_tree() from `block_logits`: one pass, K outputs
  check_tree_candidates, check_same_target   __post_init__ / check() refusals
  features_by_position, store_verified       the target's states kept by position
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from specjax.drafters.base import DraftContext, Drafter, Proposal, TreeProposal
from specjax.drafters.proposing import block_proposal, block_tree
from specjax.models import ModelConfig

TREE_CANDIDATES = ("sample", "top")


class HoldsWeights(Drafter):
    """A drafter whose arrays sit in one dataclass field (compare=False, hash=False): `params`
    (the pytree itself), or with weights_field = "model" a `Model` whose `.params` they are."""

    weights_field: ClassVar[str] = "params"

    def weights(self) -> Any:
        held = getattr(self, self.weights_field)
        if held is None:
            raise ValueError(f"this {type(self).__name__} holds no weights (it is the static part of one)")
        return held.params if self.weights_field == "model" else held

    def without_weights(self) -> Drafter:
        return dataclasses.replace(self, **{self.weights_field: None})


class CatchesUp(Drafter):
    """A drafter with a `catch_up` field: the lag its per-round catch-up can absorb."""

    def tolerating_lag(self, lag: int) -> Drafter:
        return dataclasses.replace(self, catch_up=max(self.catch_up, lag))


class BlockProposals(Drafter):
    """A drafter whose K guesses come from one pass, none conditioned on another (a PARD
    draft, a block head, Medusa heads). It gives `block_logits`; proposals and trees
    follow (drafters/proposing.py: `block_proposal`, `block_tree`). Needs a
    `tree_candidates` field ("sample" or "top")."""

    @abc.abstractmethod
    def block_logits(self, weights, state, ctx: DraftContext, drafts: int) -> tuple[jax.Array, Any]:
        """(logits [B, drafts, V], state): output i is the distribution of the token at
        position lengths + i."""

    def propose(self, weights, state, ctx: DraftContext, key) -> tuple[Proposal, Any]:
        logits, state = self.block_logits(weights, state, ctx, ctx.num_speculative_tokens)  # [B, K, V]
        return block_proposal(logits, key, ctx.sampling, ctx.grammar), state

    def propose_tree(self, weights, state, ctx: DraftContext, key) -> tuple[TreeProposal, Any]:
        logits, state = self.block_logits(weights, state, ctx, ctx.tree.depth)  # [B, depth, V]: one per depth
        return block_tree(logits, ctx.tree, key, ctx.sampling, self.tree_candidates, ctx.grammar), state


def check_tree_candidates(kind: str, value: str) -> None:
    """The refusal of a bad `tree_candidates` field, for `kind` (the class name)."""
    if value not in TREE_CANDIDATES:
        raise ValueError(f"{kind}.tree_candidates must be 'sample' or 'top', got {value!r}")


def check_same_target(what: str, config: ModelConfig, target_config: ModelConfig) -> None:
    """A head that reads the target's states and LM head must match it where they meet.
    `what` names the head in the error ("EAGLE head", "block head")."""
    for field in ("hidden_size", "vocab_size", "tie_word_embeddings"):
        mine, theirs = getattr(config, field), getattr(target_config, field)
        if mine != theirs:
            raise ValueError(f"this {what} has {field}={mine}, the target {theirs}: it was trained for another target")


def features_by_position(ctx: DraftContext, prompt: jax.Array, cache_length: int) -> jax.Array:
    """[B, S, F]: the prompt's target states ctx.features [B, T, F] at their positions, zeros
    beyond (`init` of a drafter that keeps them; `store_verified` adds each round's)."""
    b, t = prompt.shape
    features = jnp.zeros((b, cache_length, ctx.features.shape[-1]), ctx.features.dtype)
    return features.at[:, :t].set(ctx.features)


def store_verified(features, ctx: DraftContext, num_accepted):
    """features [B, S, F] by position, with the round's verified target features written in:
    ctx.features [B, A + 1, F] at positions L_prev - 1 + j for j <= num_accepted (L_prev =
    new length - num_accepted - 1, before any EOS/max cut; a cut row is done and never
    drafts again). Drafters that read the target's states by position (EAGLE, the block head)
    keep them this way."""
    j = jnp.arange(ctx.features.shape[1])[None, :]
    start = ctx.lengths - num_accepted - 2  # [B]
    slots = jnp.where(j <= num_accepted[:, None], start[:, None] + j, features.shape[1])
    rows = jnp.arange(slots.shape[0])[:, None]
    return features.at[rows, slots].set(ctx.features.astype(features.dtype), mode="drop")
