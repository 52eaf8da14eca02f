"""The drafter interface: how a round gets its K proposed tokens.

A drafter is a small frozen (hashable) object plus a pytree state. The jitted round calls
three pure functions on it:

    state = drafter.init(weights, ctx, prompt, cache_length)        after the prefill
    proposal, state = drafter.propose(weights, state, ctx, key)     K tokens per row
    state = drafter.update(weights, state, ctx, num_accepted)       after the commit

Verification, the acceptance rule and the commit never depend on which drafter runs, so a
new drafter is one file in this package. The object is static: it is part of the jit cache
key, like the target's ModelConfig. Arrays it reads (a draft model's params) are not part
of it: `weights()` hands them to the jitted loop as a traced argument, and
`without_weights()` is the static object jit keys on, so two drafters that differ only in
their weights share compiled programs.

Exactness: a drafter may read only committed history (`DraftContext`), never the round's
randomness beyond its own key. Then speculative sampling stays exact whatever it proposes,
as long as `q` is the distribution it really drew from (None: a deterministic proposal).
"""

from __future__ import annotations

import abc
from typing import Any

import jax
from flax import struct

from specjax.core.loop import DEFAULT_CACHE, CacheConfig
from specjax.core.sampling import SamplingConfig
from specjax.models import ModelConfig


@struct.dataclass
class DraftContext:
    """What a drafter may read in a round: the committed sequence and the target.

    Rows are right-aligned to nothing: slot = absolute position, prompt first. Slots at or
    beyond a row's length hold stale or padding tokens and must never be matched or fed.
    """

    tokens: jax.Array  # [B, S] int32: prompt + committed tokens, slot = position
    lengths: jax.Array  # [B] int32: committed tokens per row, prompt included
    prompt_lengths: jax.Array  # [B] int32
    done: jax.Array  # [B] bool: finished rows (their proposals are verified and discarded)
    target_params: Any  # the target's params pytree (self-speculation reads its layers)
    target: ModelConfig = struct.field(pytree_node=False)
    num_speculative_tokens: int = struct.field(pytree_node=False)
    sampling: SamplingConfig = struct.field(pytree_node=False)
    cache: CacheConfig = struct.field(pytree_node=False, default=DEFAULT_CACHE)  # layout of any cache it keeps
    tree: Any = struct.field(pytree_node=False, default=None)  # the round's Tree, or None for a chain
    # Target hidden states (the LM head's input, [.., D]) for drafters with needs_features:
    # in `init`, of every prompt position [B, T_bucket, D]; in `update`, of the root and the
    # accepted nodes of the round just verified, [B, A + 1, D] at positions L_prev - 1 + j,
    # valid for j <= num_accepted. None for other drafters.
    features: Any = None
    # In `init` only: the target's KVCache right after the prefill ([L, B, S, n_kv, d_head]),
    # for drafters whose own cache would hold the same K/V (layer skip's first N layers).
    # None elsewhere: a drafter must not write into the target's cache.
    target_cache: Any = None
    # The rows' GrammarState (core/grammar.py) when the output is constrained, else
    # None. A drafter may mask its own logits with it (drafters/proposing.py draft_chain);
    # it need not: the target's masked distribution rejects forbidden drafts.
    grammar: Any = None


@struct.dataclass
class Proposal:
    """K proposed tokens per row and where they came from."""

    tokens: jax.Array  # [B, K] int32
    q: jax.Array | None  # [B, K, V] float32 draft probabilities, or None: deterministic (one-hot)
    found: jax.Array | None = None  # [B] bool: rows with a real proposal (None: every row)
    # [B, K] float32: the drafter's own estimate that draft i survives verification given
    # drafts < i did (DSpark's confidence head); None: the drafter has none. confidence[:, i]
    # must depend on drafts before i only, never on d_i itself: a verify schedule that stops
    # before draft i because of it then stays exact under sampling (engine/verify_schedule.py).
    # It steers how much of the block is verified, never what is accepted.
    confidence: jax.Array | None = None


@struct.dataclass
class TreeProposal:
    """Tokens for every node of a token tree (specjax/trees/tree.py) and where they came from."""

    tokens: jax.Array  # [B, N] int32: nodes 1..N in the tree's canonical order
    # [B, N + 1, V] float32: q[:, i] is the distribution node i's children were drawn from
    # i.i.d. (node 0 = the root); None: deterministic, distinct candidates (top-k).
    q: jax.Array | None


class Drafter(abc.ABC):
    """Base class of every drafter. Subclass it as a frozen dataclass.

    Override `init` and `propose`; `update`, `stats`, `weights`, `without_weights` and
    `check` have defaults for drafters that keep no weights and learn nothing from the
    verdict.
    """

    name = "drafter"

    def weights(self) -> Any:
        """Arrays the drafter reads (a pytree), passed to the jitted loop as an argument."""
        return ()

    def without_weights(self) -> Drafter:
        """The static part: hashable, compared by configuration, holding no arrays."""
        return self

    def check(self, target_config: ModelConfig, num_speculative_tokens: int) -> None:
        """Raise ValueError, naming the problem, if this drafter cannot serve `target_config`.

        The default accepts any target (a drafter that reads nothing of the target's).
        """
        del target_config, num_speculative_tokens

    def tolerating_lag(self, lag: int) -> Drafter:
        """This drafter, able to catch up when its state lags the committed sequence by up to
        `lag` tokens (a combinator needs it when another drafter's tokens were accepted)."""
        del lag
        return self

    @abc.abstractmethod
    def init(self, weights, ctx: DraftContext, prompt: jax.Array, cache_length: int) -> Any:
        """State after the prefill. prompt [B, T_bucket] right-padded; ctx.lengths = prompt lengths."""

    @abc.abstractmethod
    def propose(self, weights, state, ctx: DraftContext, key: jax.Array) -> tuple[Proposal, Any]:
        """K = ctx.num_speculative_tokens tokens per row for positions lengths..lengths+K-1."""

    def abstains(self, weights, state, ctx: DraftContext) -> jax.Array | None:
        """[B] bool: rows for which this drafter has nothing worth verifying this round (prompt
        lookup without a match), or None: it always has something. Adaptive speculation
        takes a plain step when every live row abstains (AdaptiveConfig.abstain). Like
        `propose`, it may read only committed history, so skipping a round keeps exactness."""
        del weights, state, ctx
        return None

    def update(self, weights, state, ctx: DraftContext, num_accepted: jax.Array) -> Any:
        """State after the commit: ctx holds the new tokens and lengths; num_accepted [B]."""
        del weights, ctx, num_accepted
        return state

    # Feature-conditioned drafters (Medusa, EAGLE) read the target's hidden states, which the
    # engine then returns from the prefill and every verify pass (DraftContext.features).
    # The engine passes this value as forward's `features=`: True for the final-norm state
    # [.., D], or a tuple of block indices for those blocks' outputs concatenated [.., n * D].
    needs_features = False

    # Trees (specjax/trees). A drafter that can expand a token tree overrides these two.
    supports_trees = False

    def check_tree(self, target_config: ModelConfig, tree) -> None:
        """Raise ValueError if this drafter cannot expand `tree` for `target_config`."""
        if not self.supports_trees:
            raise ValueError(
                f"drafter {self.name!r} cannot expand a token tree; "
                "trees work with DraftModel, ParallelDraft, LayerSkip, Medusa, Eagle and BlockHead"
            )
        self.check(target_config, tree.num_nodes)

    def propose_tree(self, weights, state, ctx: DraftContext, key: jax.Array) -> tuple[TreeProposal, Any]:
        """Tokens for the N nodes of `ctx.tree`: the rank-r child of a node is the r-th
        candidate at it. Node i sits at position lengths - 1 + depth(i)."""
        raise NotImplementedError(f"drafter {self.name!r} cannot expand a token tree")

    def update_tree(self, weights, state, ctx: DraftContext, src, dst, num_accepted: jax.Array) -> Any:
        """State after a tree round's commit. The accepted nodes' K/V sit at slots src [B, depth]
        and belong at dst [B, depth] (the slots of their positions; past the cache end for
        unused entries): a drafter with a cache moves them (`KVCache.move`), as the round
        does for the target."""
        del src, dst
        return self.update(weights, state, ctx, num_accepted)

    def stats(self, state) -> dict[str, jax.Array]:
        """Per-row counters [B] this drafter reports (summed into GenerationStats.drafter)."""
        del state
        return {}
