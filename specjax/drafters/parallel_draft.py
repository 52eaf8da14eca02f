"""Parallel drafting (PARD, An et al. 2025; vLLM's unified parallel drafting): K proposals
from ONE forward of a draft model.

Each round feeds the draft [the committed tokens its cache lacks..., MASK x (K - 1)] at
consecutive positions, with ordinary causal attention. Output i of the block (at the last
committed token, position L - 1, then at the mask positions L..L+K-2) is the draft's
distribution for the token at position L + i: proposal i is drawn from it (or is its
argmax, greedy). The proposals do not condition on one another, so the cost of drafting
is one forward of width W + K - 1 whatever K is, where an autoregressive draft runs K.
An ordinary language model proposes poorly this way: after a mask it has never seen in
training it guesses; a PARD-trained draft (mask-token training) learns what the tokens
after the masks are likely to be.

The draft cache holds committed tokens only. Every round writes the masks' K/V at slots
L..L+K-2, but the round sets `cache.lengths` to L, so the next round's catch-up, which
rewrites every slot from cache.lengths up to its last committed token in the same forward,
overwrites them before any query can read them; slots past a query's position are never
visible. After a round the cache lags the committed sequence by the accepted tokens plus
the bonus, at most K + 1: the catch-up is that wide, so one forward suffices (`resync`
repairs any longer lag, after adaptive speculation's plain steps).

Trees (DDTree / JetSpec): depth d takes block output d's candidates whatever the parent,
Medusa's Cartesian trees (`cartesian_tree`): one forward of W + depth - 1 tokens drafts
every node. Top-ranked candidates (greedy, or tree_candidates="top") are a deterministic
proposal (q = None); i.i.d. draws ("sample") record output d's distribution at their parent.
Shapes: drafters/block_trees.py (spine paths; the confidences DDTree reads).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from specjax.core.loop import gather_tokens
from specjax.drafters.base import DraftContext
from specjax.drafters.common import BlockProposals, CatchesUp, HoldsWeights, check_tree_candidates
from specjax.drafters.draft_model import ModelDraftState, check_vocabulary, prefilled, resync
from specjax.io.model import Model
from specjax.models import BlockMask, ModelConfig, forward


@dataclasses.dataclass(frozen=True)
class ParallelDraft(HoldsWeights, CatchesUp, BlockProposals):
    """A draft `Model` that proposes K tokens from one forward over [context, MASK x (K - 1)].

    mask_token_id: the id the draft was trained to read as "a token to guess" (a token of
    the draft's own vocabulary, which must be the target's); None: the one the model
    records (`Model.mask_token_id`, config.json's specjax_mask_token_id, which a draft
    trained by `specjax distill` with parallel enabled carries).
    catch_up: width of the committed part of the forward; 0 (the default) means K + 1 (the
    tree's depth + 1 in a tree round), the most one round leaves the cache behind. A wider
    one (a combinator's `tolerating_lag`) costs more tokens per forward, never a forward more.
    tree_candidates: as DraftModel's ("sample": i.i.d. draws under sampling; "top": top-ranked).
    """

    model: Model | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)
    mask_token_id: int | None = None
    config: ModelConfig | None = None
    catch_up: int = 0
    tree_candidates: str = "sample"
    name = "parallel_draft"
    supports_trees = True
    weights_field = "model"

    def __post_init__(self):
        if self.model is not None:
            object.__setattr__(self, "config", self.model.config)
            if self.mask_token_id is None:
                object.__setattr__(self, "mask_token_id", self.model.mask_token_id)
        if self.config is None:
            raise ValueError("ParallelDraft needs a draft Model: ParallelDraft(model, mask_token_id)")
        vocab = self.config.vocab_size
        mask = self.mask_token_id
        if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < vocab:
            unknown = (
                ": give one (mask_token_id: ID), or a draft whose config.json records it (specjax_mask_token_id, "
                "written by `specjax distill` with parallel.enabled)"
                if mask is None
                else ""
            )
            raise ValueError(
                f"ParallelDraft's mask_token_id must be a token id of the draft's vocabulary "
                f"(0 <= id < {vocab}), got {mask!r}{unknown}"
            )
        if self.catch_up < 0:
            raise ValueError(f"ParallelDraft.catch_up must be >= 0 (0: K + 1), got {self.catch_up}")
        check_tree_candidates("ParallelDraft", self.tree_candidates)

    def check(self, target_config: ModelConfig, num_speculative_tokens: int) -> None:
        # The target verifies draft token ids and q's [.., V] rows as its own.
        check_vocabulary(self.config, target_config)

    def init(self, weights, ctx: DraftContext, prompt, cache_length: int) -> ModelDraftState:
        # As a draft model's: the prompt's K/V, cache.lengths = prompt lengths.
        return prefilled(self.config, weights, ctx, prompt, cache_length)

    def block_logits(self, weights, state: ModelDraftState, ctx: DraftContext, width: int):
        """The one draft forward of a round: (logits [B, width, V], state).

        Output i (i = 0..width-1) is the draft's distribution for the token at position
        lengths + i: i = 0 reads the last committed token, i >= 1 the i-th mask.
        """
        lengths = ctx.lengths  # [B] L: tokens 0..L-1 committed
        w = max(self.catch_up, width + 1)  # bounds the lag a round of `width` leaves
        cache = resync(self.config, weights, state.cache, ctx, w)  # a no-op unless plain steps ran
        # Positions L-W..L-1: every slot from cache.lengths (>= L - W after resync) up to the
        # last committed token, so each slot a query reads, mask K/V included, is rewritten
        # first. Rows already caught up re-feed slots with the K/V they hold (harmless); a
        # short prompt repeats position 0, writing the same K/V twice.
        committed = jnp.maximum(lengths[:, None] + jnp.arange(-w, 0), 0)  # [B, W]
        masks = lengths[:, None] + jnp.arange(width - 1)  # [B, width - 1]: positions L..L+width-2
        positions = jnp.concatenate([committed, masks], axis=1)  # [B, W + width - 1]
        tokens = jnp.concatenate(
            [gather_tokens(ctx.tokens, committed), jnp.full_like(masks, self.mask_token_id)], axis=1
        )  # [B, W + width - 1]
        # PARD's attention is causal over [context, MASK, ...]: the block mask in its causal
        # mode (the block: the last committed token and the masks). As a block call it
        # leaves cache.lengths alone, and we set it: slots below L hold committed K/V, the
        # masks' slots L.. hold nothing committed.
        block = BlockMask(start=lengths - 1, slots=positions, width=width, mode="causal")
        logits, cache = forward(self.config, weights, tokens, positions, cache, block)
        cache = cache.replace(lengths=lengths)
        return logits[:, w - 1 :], ModelDraftState(cache=cache)  # [B, width, V]

    # propose and propose_tree come from BlockProposals: one block_logits per round, proposal
    # i drawn from output i alone (so q[:, i] is exactly its distribution).
    # update_tree keeps the default (update, no K/V moved): tree nodes never enter this cache.

    def update(self, weights, state: ModelDraftState, ctx: DraftContext, num_accepted):
        # Committed K/V still end at the round's L (where the masks began): the accepted
        # tokens and the bonus (or a plain step's token) are fed by the next catch-up.
        cache = state.cache
        return ModelDraftState(cache=cache.replace(lengths=jnp.minimum(cache.lengths, ctx.lengths)))
