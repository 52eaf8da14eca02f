"""The loop state every generation runs on, its static plan, and the round epilogue.

Core: it knows a drafter and a tree only as the static values a plan carries (drafters/
and trees/ sit above it, the engine above them).

Plain decoding is the no-drafter case of the same state: every round kind (a plain step, a
chain of K, a token tree, an adaptive branch) reads one `LoopState` and ends in one
`finish_round`, which commits and counts. So the counters mean the same thing everywhere,
and the statistics are derived from them in one place (engine/output.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specjax.core.grammar import after_commit
from specjax.core.loop import DEFAULT_CACHE, CacheConfig, commit
from specjax.core.sampling import SamplingConfig
from specjax.models import KVCache, ModelConfig


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything static about a generation (hashable: a jit cache key; a change recompiles)."""

    target: ModelConfig
    drafter: Any  # a Drafter's static part (`without_weights()`); None: plain decoding
    num_speculative_tokens: int  # K of a chain; a tree's node count N (the verify width is N + 1); 0: plain
    sampling: SamplingConfig
    rule: Callable | None  # an AcceptanceRule (core/acceptance.py) or a tree rule (trees/tree_acceptance.py)
    cache: CacheConfig = DEFAULT_CACHE
    tree: Any = None  # a specjax.Tree, or None: a chain of K (engine/rounds.py)
    # An AdaptiveConfig (engine/adaptive_policy.py, without costs): each round picks K <= K_MAX.
    adaptive: Any = None
    # A VerifySchedule (engine/verify_schedule.py, widths resolved): draft K, verify fewer.
    verify_schedule: Any = None

    @property
    def accepted_width(self) -> int:
        """Draft positions counted in LoopState.accepted_at: K, the tree's depth, the deepest
        of the adaptive policy's trees, or 0 for plain decoding."""
        if self.adaptive is not None and self.adaptive.trees:
            return max(tree.depth for tree in self.adaptive.trees)
        return self.num_speculative_tokens if self.tree is None else self.tree.depth

    @property
    def wants_features(self) -> bool:
        """Whether the target's forwards return hidden states for the drafter (heads)."""
        return self.drafter is not None and self.drafter.needs_features


SpecPlan = Plan  # the name before plain decoding shared the plan


@struct.dataclass
class LoopState:
    """The loop state of a generation: one pytree, donated to every round.

    Counters (the only ones; every rate is derived from them in engine/output.py):
    row_rounds, accepted_at and forwards.
    """

    tokens: jax.Array  # [B, S] int32: prompt + committed tokens, slot = position
    lengths: jax.Array  # [B] int32: committed tokens per row, prompt included
    prompt_lengths: jax.Array  # [B] int32
    done: jax.Array  # [B] bool
    target_cache: KVCache  # [layers, B, S, n_kv, d_head] K and V, valid below `lengths`
    draft_state: Any  # the drafter's pytree (a draft model's KV cache, match counters, ...); None: plain
    rng: jax.Array
    max_new_tokens: jax.Array  # [] int32
    eos_token_ids: jax.Array  # [E] int32 stop tokens, -1 entries match nothing
    row_rounds: jax.Array  # [B] int32: rounds (plain: steps) in which each row was still generating
    accepted_at: jax.Array  # [B, W] int32: rounds that accepted draft position (a tree: depth) i; W = 0 plain
    forwards: jax.Array  # [] int32: batched target forwards of the loop (one per round)
    plan: Plan = struct.field(pytree_node=False)
    adaptive: Any = None  # an AdaptiveState (engine/adaptive_policy.py) when plan.adaptive is set
    schedule: Any = None  # a ScheduleState (engine/verify_schedule.py) when plan.verify_schedule is set
    # A GrammarState (core/grammar.py) when the output is constrained: the target's
    # distribution is masked by each row's state at every position, and finish_round moves
    # the states along what was committed. None: unconstrained.
    grammar: Any = None


SpecState = LoopState  # the names before plain decoding shared the state
DecodeState = LoopState


def accepted_positions(accepted_at, num_accepted, live):
    """[B, W] int32: 1 where draft position (a tree: depth) i < num_accepted of a live row.
    W = accepted_at's width, which may exceed this round's K or depth (adaptive speculation
    keeps the widest); num_accepted never does, so the rest stays 0."""
    i = jnp.arange(accepted_at.shape[1])[None, :]
    return ((i < num_accepted[:, None]) & live[:, None]).astype(jnp.int32)


def finish_round(
    state: LoopState,
    candidates,
    num_accepted,
    target_cache: KVCache,
    rng,
    update_drafter: Callable[[jax.Array, jax.Array, jax.Array], Any] | None = None,
) -> LoopState:
    """The epilogue of every round kind: commit, set the target cache's valid length, let the
    drafter see the commit, count.

    candidates [B, W]: the accepted draft tokens, then the correction/bonus token; the first
      num_accepted + 1 [B] of them are committed (cut at EOS and max_new_tokens).
    target_cache: after the round's verify forward (a tree's accepted path already moved to
      its slots). Rollback is a length change: slots holding rejected drafts stay and are
      overwritten later.
    update_drafter: (tokens, lengths, done) after the commit -> the drafter's new state;
      None keeps it (plain decoding has none).
    """
    tokens, lengths, done = commit(
        state.tokens,
        state.lengths,
        state.prompt_lengths,
        state.done,
        candidates,
        num_accepted + 1,
        state.max_new_tokens,
        state.eos_token_ids,
    )
    live = ~state.done
    valid = jnp.minimum(state.lengths + num_accepted, lengths)  # the target holds K/V of these
    draft_state = state.draft_state if update_drafter is None else update_drafter(tokens, lengths, done)
    grammar = state.grammar
    if grammar is not None:
        grammar = after_commit(grammar, candidates, lengths - state.lengths)
    return state.replace(
        tokens=tokens,
        lengths=lengths,
        done=done,
        target_cache=target_cache.replace(lengths=valid),
        draft_state=draft_state,
        grammar=grammar,
        rng=rng,
        row_rounds=state.row_rounds + live.astype(jnp.int32),
        accepted_at=state.accepted_at + accepted_positions(state.accepted_at, num_accepted, live),
        forwards=state.forwards + 1,
    )
