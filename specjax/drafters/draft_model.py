"""A separate, smaller draft model that proposes K tokens autoregressively.

Each round: one catch-up forward of width W over the last W committed tokens (the draft
cache lags the committed sequence: after a rejection it has not seen the correction,
after full acceptance it has seen neither d_K nor the bonus), then K - 1 single-token
steps. d_K is drawn but not fed: the next round's catch-up feeds it if it was accepted.
Rewriting a slot with the K/V it already holds is harmless, so W only has to bound the
lag: 2 when this model's own drafts are what gets verified.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from specjax.core.loop import gather_tokens, prefill
from specjax.drafters.base import DraftContext
from specjax.drafters.common import CatchesUp, HoldsWeights, check_tree_candidates
from specjax.drafters.proposing import candidate_scores, draft_chain, expand_tree, samples_candidates, tree_feed
from specjax.io.model import Model
from specjax.models import KVCache, ModelConfig, forward


@struct.dataclass
class ModelDraftState:
    cache: KVCache  # the draft's own KV cache, [layers, B, S, n_kv, d_head]


RESYNC_CHUNK = 32  # tokens per forward when a cache lags far behind


def resync(config: ModelConfig, params, cache: KVCache, ctx: DraftContext, width: int) -> KVCache:
    """Feed committed tokens until the cache lags by at most `width`, in chunks of
    max(width, RESYNC_CHUNK) tokens.

    A round's own catch-up covers the lag a round leaves (at most `width`). Adaptive
    speculation (engine/adaptive.py) also commits tokens in plain steps that draft nothing,
    so the lag can grow without bound; `cache.lengths` (kept by `committed_cache`) says
    where the committed K/V end. Otherwise the loop body never runs. Chunks wider than the
    catch-up matter: after 50 plain steps a probe of K = 1 would otherwise run 25 forwards
    of width 2 before it drafts, where a forward of width 32 costs about what one of width
    2 does on a small draft.
    """
    last = jnp.maximum(ctx.lengths - 1, 0)[:, None]  # [B, 1]: the last committed slot
    chunk = max(width, RESYNC_CHUNK)

    def cond_fn(cache):
        return jnp.any(~ctx.done & (cache.lengths < ctx.lengths - width))

    def body_fn(cache):
        # Rows already close enough re-feed committed slots (rewriting the K/V they hold).
        feed = jnp.minimum(cache.lengths[:, None] + jnp.arange(chunk), last)  # [B, C]
        return forward(config, params, gather_tokens(ctx.tokens, feed), feed, cache)[1]

    return jax.lax.while_loop(cond_fn, body_fn, cache)


def committed_cache(cache: KVCache, ctx: DraftContext) -> KVCache:
    """After a commit: slots below the returned lengths hold K/V of the committed sequence.
    The correction/bonus token (the last committed) was never fed, and rejected drafts past
    it hold stale K/V that the next catch-up rewrites before any query reads them."""
    return cache.replace(lengths=jnp.minimum(cache.lengths, ctx.lengths - 1))


def catch_up_logits(config: ModelConfig, params, cache: KVCache, ctx: DraftContext, catch_up: int):
    """A round's catch-up: `resync`, then one forward over positions L-W..L-1 (W = catch_up;
    a short prompt repeats position 0, writing the same K/V twice). -> (logits [B, W, V], cache)."""
    cache = resync(config, params, cache, ctx, catch_up)
    feed = jnp.maximum(ctx.lengths[:, None] + jnp.arange(-catch_up, 0), 0)  # [B, W]
    return forward(config, params, gather_tokens(ctx.tokens, feed), feed, cache)


def propose_autoregressive(config: ModelConfig, params, cache: KVCache, ctx: DraftContext, key, catch_up: int):
    """K tokens from a model: catch-up of width `catch_up`, then K - 1 single-token steps.

    Returns (Proposal(tokens [B, K], q [B, K, V] or None when greedy), cache).
    """
    logits, cache = catch_up_logits(config, params, cache, ctx, catch_up)

    def advance(carry, token):  # token [B] at `position` [B]
        cache, position = carry
        logits, cache = forward(config, params, token[:, None], position[:, None], cache)
        return logits[:, 0], (cache, position + 1)

    carry = (cache, ctx.lengths)
    proposal, (cache, _) = draft_chain(
        advance, carry, logits[:, -1], key, ctx.num_speculative_tokens, ctx.sampling, ctx.grammar
    )
    return proposal, cache


def propose_tree(config: ModelConfig, params, cache: KVCache, ctx: DraftContext, key, catch_up: int, candidates: str):
    """Expand `ctx.tree` level by level: one catch-up forward, then one forward per depth.

    The forward at depth d feeds the level's nodes that have children, at position
    L - 1 + d and at their tree slots L - 1 + i, each seeing the prefix and its ancestors
    (a TreeMask), and yields the distributions their children are drawn from. Children
    are the top-ranked tokens (greedy, or candidates == "top") or i.i.d. draws from q.
    Returns (TreeProposal(tokens [B, N], q [B, N + 1, V] or None), cache).
    """
    tree, sampling = ctx.tree, ctx.sampling
    start = ctx.lengths - 1  # the root's slot and position
    logits, cache = catch_up_logits(config, params, cache, ctx, catch_up)

    def grow(depth, parents, tokens, cache):
        positions, mask = tree_feed(tree, start, depth, parents)
        logits, cache = forward(config, params, tokens[:, parents], positions, cache, mask)
        return candidate_scores(logits, sampling), cache  # [B, F, V]

    root = candidate_scores(logits[:, -1:], sampling)  # [B, 1, V]
    return expand_tree(tree, root, key, samples_candidates(sampling, candidates), grow, cache, ctx.grammar)


def prefilled(config: ModelConfig, params, ctx: DraftContext, prompt, cache_length: int) -> ModelDraftState:
    """A draft model's state after the prefill: the prompt's K/V, cache.lengths = prompt lengths."""
    return ModelDraftState(cache=prefill(config, params, prompt, ctx.lengths, cache_length, ctx.cache))


def check_vocabulary(draft: ModelConfig, target: ModelConfig) -> None:
    if target.vocab_size != draft.vocab_size:
        raise ValueError(
            "draft and target must share a vocabulary: draft vocab_size "
            f"{draft.vocab_size} != target vocab_size {target.vocab_size}"
        )


@dataclasses.dataclass(frozen=True)
class DraftModel(HoldsWeights, CatchesUp):
    """A separate draft `Model` (the classic draft/target pair). `generate(..., draft=model)`
    wraps a plain `Model` passed as `draft` in this.

    catch_up: width of the per-round catch-up forward; it must bound how far the draft
    cache can lag the committed sequence (2 when this model's drafts are verified; a
    combinator whose other drafter may be accepted for K tokens needs K + 1).
    """

    model: Model | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)
    config: ModelConfig | None = None
    catch_up: int = 2
    # Tree candidates under sampling: "sample" draws a node's children i.i.d. from q
    # (SpecInfer); "top" takes q's top-ranked tokens, deterministic and distinct.
    tree_candidates: str = "sample"
    name = "draft_model"
    supports_trees = True
    weights_field = "model"

    def __post_init__(self):
        if self.model is not None:
            object.__setattr__(self, "config", self.model.config)
        if self.config is None:
            raise ValueError("DraftModel needs a Model (DraftModel(model))")
        if self.catch_up < 2:
            raise ValueError(f"DraftModel.catch_up must be >= 2, got {self.catch_up}")
        check_tree_candidates("DraftModel", self.tree_candidates)

    def check(self, target_config: ModelConfig, num_speculative_tokens: int) -> None:
        check_vocabulary(self.config, target_config)

    def init(self, weights, ctx: DraftContext, prompt, cache_length: int) -> ModelDraftState:
        return prefilled(self.config, weights, ctx, prompt, cache_length)

    def propose(self, weights, state: ModelDraftState, ctx: DraftContext, key):
        proposal, cache = propose_autoregressive(self.config, weights, state.cache, ctx, key, self.catch_up)
        return proposal, ModelDraftState(cache=cache)

    def propose_tree(self, weights, state: ModelDraftState, ctx: DraftContext, key):
        proposal, cache = propose_tree(self.config, weights, state.cache, ctx, key, self.catch_up, self.tree_candidates)
        return proposal, ModelDraftState(cache=cache)

    def update_tree(self, weights, state: ModelDraftState, ctx: DraftContext, src, dst, num_accepted):
        # Nodes the draft never fed (leaves) move garbage; the catch-up rewrites it (as after a
        # chain round, the draft lags by at most the last accepted node and the bonus token).
        state = ModelDraftState(cache=state.cache.move(src, dst))
        return self.update(weights, state, ctx, num_accepted)

    def update(self, weights, state: ModelDraftState, ctx: DraftContext, num_accepted):
        return ModelDraftState(cache=committed_cache(state.cache, ctx))
