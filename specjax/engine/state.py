"""The state of speculative decoding: the static plan and the loop state pytree.

Both round kinds (the chain in speculative.py, the tree in tree_round.py) read and write
this one state, so chains and trees run in the same compiled loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specjax.drafters import DraftContext, Drafter
from specjax.engine.loop import DEFAULT_CACHE, CacheConfig
from specjax.engine.sampling import SamplingConfig
from specjax.models import KVCache, ModelConfig
from specjax.trees.tree import Tree


@dataclasses.dataclass(frozen=True)
class SpecPlan:
    """Everything static about a speculative generation (hashable: a jit cache key)."""

    target: ModelConfig
    drafter: Drafter  # the static part (`without_weights()`): compared by configuration
    num_speculative_tokens: int  # K of a chain; a tree's node count N (the verify width is N + 1)
    sampling: SamplingConfig
    rule: Callable  # an AcceptanceRule (engine/acceptance.py), or a tree rule (trees/acceptance.py)
    cache: CacheConfig = DEFAULT_CACHE
    tree: Tree | None = None  # None: a chain of K (engine/speculative.py); else a tree round
    # An AdaptiveConfig (engine/adaptive_policy.py, without costs): each round picks K <= K_MAX.
    adaptive: Any = None

    @property
    def accepted_width(self) -> int:
        """Draft positions counted in SpecState.accepted_at: K, the tree's depth, or the
        deepest of the adaptive policy's trees."""
        if self.adaptive is not None and self.adaptive.trees:
            return max(tree.depth for tree in self.adaptive.trees)
        return self.num_speculative_tokens if self.tree is None else self.tree.depth


@struct.dataclass
class SpecState:
    """The loop state of speculative decoding: one pytree, donated to every round."""

    tokens: jax.Array  # [B, S] int32: prompt + committed tokens, slot = position
    lengths: jax.Array  # [B] int32: committed tokens per row, prompt included
    prompt_lengths: jax.Array  # [B] int32
    done: jax.Array  # [B] bool
    target_cache: KVCache
    draft_state: Any  # the drafter's pytree (a draft model's KV cache, match counters, ...)
    rng: jax.Array
    max_new_tokens: jax.Array  # [] int32
    eos_token_id: jax.Array  # [] int32, -1 when there is none
    row_rounds: jax.Array  # [B] int32: rounds in which each row was still generating
    accepted_at: jax.Array  # [B, K] int32 (a tree: [B, depth]): rounds that accepted draft position / depth i
    forwards: jax.Array  # [] int32: batched target verify passes
    plan: SpecPlan = struct.field(pytree_node=False)
    adaptive: Any = None  # an AdaptiveState (engine/adaptive_policy.py) when plan.adaptive is set


def draft_context(state: SpecState, target_params) -> DraftContext:
    """What the drafter may read of `state`: its committed sequence, the target and the plan."""
    plan = state.plan
    return DraftContext(
        tokens=state.tokens,
        lengths=state.lengths,
        prompt_lengths=state.prompt_lengths,
        done=state.done,
        target_params=target_params,
        target=plan.target,
        num_speculative_tokens=plan.num_speculative_tokens,
        sampling=plan.sampling,
        cache=plan.cache,
        tree=plan.tree,
    )


def accepted_positions(accepted_at, num_accepted, live):
    """[B, W] int32: 1 where draft position (a tree: depth) i < num_accepted of a live row.
    W = accepted_at's width, which may exceed this round's K or depth (adaptive speculation
    keeps the widest); num_accepted never does, so the rest stays 0."""
    i = jnp.arange(accepted_at.shape[1])[None, :]
    return ((i < num_accepted[:, None]) & live[:, None]).astype(jnp.int32)
