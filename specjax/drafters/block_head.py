"""A DFlash-style block head as a drafter: K proposals from one non-causal head forward.

The network (models/block_net.py) reads the target's multi-layer states as its context and
fills a block [last committed token, MASK x K] in one pass; its K mask outputs are the
proposals. A round at length L (tokens 0..L-1 committed, the target's states known up to
L - 2: token L - 1 is the last round's bonus, not yet run through the target):

  context: positions L-1-W .. L-2 (W = K + 1, the most a round can accept plus its bonus)
    re-written from the verified states the drafter keeps by position, so the head's cache
    holds the context of every committed position below L - 1 (cache.lengths = L - 1);
  block:   positions L-1 .. L+K-1, the anchor token and K masks, bidirectional within it.

The block's K/V land in slots L-1.. and are overwritten by the next round's context (its
catch-up is one wider than the accepted tokens for that reason). Adaptive speculation's
plain steps commit tokens whose states arrive one at a time; a lagging cache is caught up
in chunks first, as EAGLE's is.

Proposal i is drawn from output i alone, so q[:, i] is exactly its distribution and
speculative sampling stays exact. Trees (DDTree / JetSpec): the same one forward, of depth
outputs, drafts every node; a node at depth d takes its candidates from output d, whatever
its parent (the Cartesian tree, as for Medusa and ParallelDraft): the top-ranked tokens
(greedy, or tree_candidates="top": q = None) or i.i.d. draws recorded in q at the parent
("sample"). Shapes: drafters/block_trees.py (spine paths; the confidences DDTree reads).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from specjax.core.loop import gather_tokens
from specjax.drafters.base import DraftContext
from specjax.drafters.common import (
    BlockProposals,
    CatchesUp,
    HoldsWeights,
    check_same_target,
    check_tree_candidates,
    features_by_position,
    store_verified,
)
from specjax.models import BlockMask, KVCache, ModelConfig, feature_layers, init_cache
from specjax.models.block_net import block_head_states, block_logits_of, write_context


@struct.dataclass
class BlockHeadState:
    cache: KVCache  # the head's cache [N, B, S, n_kv, d_head]: context K/V at slot = position, below lengths
    features: jax.Array  # [B, S, n * D]: the target's block outputs by position (verified)


@dataclasses.dataclass(frozen=True)
class BlockHead(HoldsWeights, CatchesUp, BlockProposals):
    """A DFlash-style block head for one target; `config` is its N-layer Llama config
    (models/heads.head_config with num_hidden_layers=N).

    feature_layers: the target blocks whose outputs make the context (DFlash: spread from
    low to high); mask_token_id: the token the block's masks are embedded as (the target
    vocabulary's; training records it); block_size: the K it was trained for (a larger K
    is refused: those outputs were never trained). catch_up and tree_candidates are as
    ParallelDraft's.
    """

    params: dict | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)
    config: ModelConfig | None = None
    feature_layers: tuple[int, ...] = ()
    mask_token_id: int = 0
    block_size: int = 0
    catch_up: int = 0
    tree_candidates: str = "sample"
    name = "block_head"
    supports_trees = True

    def __post_init__(self):
        if self.config is None:
            raise ValueError("BlockHead needs its layers' config (see specjax.models.heads.head_config)")
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))  # hashable
        if not self.feature_layers:
            raise ValueError("a block head reads the target's multi-layer states: give it feature_layers")
        mask = self.mask_token_id
        if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < self.config.vocab_size:
            raise ValueError(
                f"BlockHead's mask_token_id must be a token id of the target's vocabulary "
                f"(0 <= id < {self.config.vocab_size}), got {mask!r}"
            )
        if self.block_size < 1:
            raise ValueError(f"BlockHead.block_size (the K it was trained for) must be >= 1, got {self.block_size}")
        if self.catch_up < 0:
            raise ValueError(f"BlockHead.catch_up must be >= 0 (0: K + 1), got {self.catch_up}")
        check_tree_candidates("BlockHead", self.tree_candidates)

    @property
    def needs_features(self):
        return self.feature_layers

    def check(self, target_config: ModelConfig, num_speculative_tokens: int) -> None:
        self._check_target(target_config)
        self._check_drafts(num_speculative_tokens, "num_speculative_tokens")

    def check_tree(self, target_config: ModelConfig, tree) -> None:
        self._check_target(target_config)
        self._check_drafts(tree.depth, "a tree's depth")  # one block guess per depth

    def _check_drafts(self, drafts: int, what: str) -> None:
        if drafts > self.block_size:
            raise ValueError(
                f"this block head was trained for blocks of {self.block_size} drafts; {what} {drafts} asks for more"
            )

    def _check_target(self, target_config: ModelConfig) -> None:
        check_same_target("block head", self.config, target_config)
        feature_layers(self.feature_layers, target_config.num_hidden_layers)  # a ValueError naming bad ones
        if self.params is not None:
            want, fc = len(self.feature_layers) * self.config.hidden_size, self.params["fc"]
            if fc.shape[0] != want:
                raise ValueError(
                    f"this block head's fc reads {fc.shape[0]} features, but feature_layers={self.feature_layers} "
                    f"gives {want}: weights and config do not belong together"
                )

    def init(self, weights, ctx: DraftContext, prompt, cache_length: int) -> BlockHeadState:
        b, t = prompt.shape
        features = features_by_position(ctx, prompt, cache_length)  # [B, S, n * D]: the prompt's, by position
        cache = init_cache(self.config, b, cache_length, dtype=ctx.cache.dtype, block_size=ctx.cache.block_size)
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        # Every prompt position; those at or past L - 1 hold nothing any query reads before a
        # block or a later context overwrites them.
        cache = write_context(self.config, weights, ctx.target_params, ctx.features, positions, cache)
        return BlockHeadState(cache=cache.replace(lengths=jnp.maximum(ctx.lengths - 1, 0)), features=features)

    def block_logits(self, weights, state: BlockHeadState, ctx: DraftContext, drafts: int):
        """The one head forward of a round: (logits [B, drafts, V], state); output i is the
        distribution of the token at position lengths + i."""
        hidden, state = self.block_states(weights, state, ctx, drafts)  # [B, drafts, D]
        return block_logits_of(self.config, weights, ctx.target_params, hidden), state

    def block_states(self, weights, state: BlockHeadState, ctx: DraftContext, drafts: int):
        """The round's one pass of the head's layers: (h [B, drafts, D] before the final norm,
        state); h[:, i] is output i's state for the token at lengths + i (DSpark adds its
        Markov term to it before the LM head)."""
        lengths = ctx.lengths  # [B] L
        w = max(self.catch_up, drafts + 1)
        last = jnp.maximum(lengths - 2, 0)[:, None]  # the last position with a target state

        def context(positions, cache):  # [B, W] positions -> their K/V written
            states = jnp.take_along_axis(state.features, positions[:, :, None], axis=1)  # [B, W, n * D]
            return write_context(self.config, weights, ctx.target_params, states, positions, cache)

        def lagging(cache):  # plain steps (adaptive K = 0) left more than W positions unwritten
            return jnp.any(~ctx.done & (cache.lengths < lengths - 1 - w))

        def resync(cache):
            cache = context(jnp.minimum(cache.lengths[:, None] + jnp.arange(w), last), cache)
            return cache.replace(lengths=jnp.minimum(cache.lengths + w, jnp.maximum(lengths - 1, 0)))

        cache = jax.lax.while_loop(lagging, resync, state.cache)
        committed = jnp.maximum(lengths[:, None] + jnp.arange(-w - 1, -1), 0)  # [B, W]: L-1-W .. L-2
        block = lengths[:, None] - 1 + jnp.arange(drafts + 1)  # [B, drafts + 1]: L-1 .. L-1+drafts
        anchor = gather_tokens(ctx.tokens, jnp.maximum(lengths - 1, 0)[:, None])  # [B, 1]
        tokens = jnp.concatenate([anchor, jnp.full((lengths.shape[0], drafts), self.mask_token_id, jnp.int32)], 1)
        states = jnp.take_along_axis(state.features, committed[:, :, None], axis=1)  # [B, W, n * D]
        mask = BlockMask(start=lengths - 1, slots=block, width=drafts + 1, mode="bidirectional")
        hidden, cache = block_head_states(
            self.config, weights, ctx.target_params, states, committed, tokens, block, cache, mask
        )
        cache = cache.replace(lengths=jnp.maximum(lengths - 1, 0))  # the block's slots hold no context
        return hidden[:, 1:], state.replace(cache=cache)  # [B, drafts, D]: the masks' states

    # propose and propose_tree come from BlockProposals: one block_logits per round.
    # update_tree keeps the default (update, no K/V moved): tree nodes never enter this cache.

    def update(self, weights, state: BlockHeadState, ctx: DraftContext, num_accepted):
        features = store_verified(state.features, ctx, num_accepted)
        # Context K/V end at the round's L - 1; the new states are written by the next round.
        cache = state.cache.replace(lengths=jnp.minimum(state.cache.lengths, ctx.lengths - num_accepted - 2))
        return state.replace(features=features, cache=cache)
