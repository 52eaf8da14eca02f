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
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.core.loop import gather_tokens, prefill
from specjax.core.sampling import SamplingConfig, probabilities, sample
from specjax.drafters.base import DraftContext, Drafter, Proposal, TreeProposal
from specjax.io.model import Model
from specjax.models import KVCache, ModelConfig, TreeMask, forward


@struct.dataclass
class ModelDraftState:
    cache: KVCache  # the draft's own KV cache, [layers, B, S, n_kv, d_head]


def _draw(key, logits, sampling: SamplingConfig):
    """Draft token and the probabilities it was drawn from (None when greedy): logits [B, V]."""
    if sampling.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), None
    q = probabilities(logits, sampling)
    return sample(key, q), q


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


def propose_autoregressive(config: ModelConfig, params, cache: KVCache, ctx: DraftContext, key, catch_up: int):
    """K tokens from a model: catch-up of width `catch_up`, then K - 1 single-token steps.

    Returns (Proposal(tokens [B, K], q [B, K, V] or None when greedy), cache).
    """
    k = ctx.num_speculative_tokens
    lengths = ctx.lengths
    cache = resync(config, params, cache, ctx, catch_up)
    # Positions L-W..L-1 (a short prompt repeats position 0, writing the same K/V twice).
    feed = jnp.maximum(lengths[:, None] + jnp.arange(-catch_up, 0), 0)  # [B, W]
    logits, cache = forward(config, params, gather_tokens(ctx.tokens, feed), feed, cache)

    def draft_step(carry, step_key):
        cache, logits, position = carry  # logits [B, V] predict the token at `position` [B]
        token, q = _draw(step_key, logits, ctx.sampling)
        logits, cache = forward(config, params, token[:, None], position[:, None], cache)
        return (cache, logits[:, 0], position + 1), (token, q)

    keys = jax.random.split(key, k)
    (cache, logits, _), (tokens, qs) = jax.lax.scan(draft_step, (cache, logits[:, -1], lengths), keys[:-1])
    last_token, last_q = _draw(keys[-1], logits, ctx.sampling)
    drafts = jnp.concatenate([tokens.T, last_token[:, None]], axis=1)  # [B, K]
    q = None if last_q is None else jnp.concatenate([qs.transpose(1, 0, 2), last_q[:, None]], axis=1)
    return Proposal(tokens=drafts, q=q), cache


def propose_tree(config: ModelConfig, params, cache: KVCache, ctx: DraftContext, key, catch_up: int, candidates: str):
    """Expand `ctx.tree` level by level: one catch-up forward, then one forward per depth.

    The forward at depth d feeds the level's nodes that have children, at position
    L - 1 + d and at their tree slots L - 1 + i, each seeing the prefix and its ancestors
    (a TreeMask), and yields the distributions their children are drawn from. Children
    are the top-ranked tokens (greedy, or candidates == "top") or i.i.d. draws from q.
    Returns (TreeProposal(tokens [B, N], q [B, N + 1, V] or None), cache).
    """
    tree = ctx.tree
    b = ctx.lengths.shape[0]
    start = ctx.lengths - 1  # the root's slot and position
    cache = resync(config, params, cache, ctx, catch_up)
    feed = jnp.maximum(ctx.lengths[:, None] + jnp.arange(-catch_up, 0), 0)  # [B, W]
    logits, cache = forward(config, params, gather_tokens(ctx.tokens, feed), feed, cache)
    sampled = not ctx.sampling.greedy and candidates == "sample"
    visible = jnp.asarray(tree.ancestors)  # [N+1, N+1]
    tokens = jnp.zeros((b, tree.num_nodes + 1), jnp.int32)  # node 0 (the root) unused
    q_all = jnp.zeros((b, tree.num_nodes + 1, config.vocab_size), jnp.float32) if sampled else None
    parents, parent_logits = np.array([0]), logits[:, -1:]  # [P], [B, P, V]
    keys = jax.random.split(key, tree.depth)
    for depth in range(1, tree.depth + 1):
        nodes = tree.level(depth)  # [M]
        local = np.searchsorted(parents, tree.parents[nodes])  # each node's parent within `parents`
        ranks = tree.ranks[nodes]
        scores = parent_logits if ctx.sampling.greedy else probabilities(parent_logits, ctx.sampling)
        if sampled:
            q_all = q_all.at[:, parents].set(scores)
            draws = jax.random.categorical(
                keys[depth - 1], jnp.log(scores), axis=-1, shape=(int(ranks.max()) + 1, *scores.shape[:-1])
            )
            chosen = draws[ranks, :, local].T  # [B, M]
        else:
            top = jax.lax.top_k(scores, int(ranks.max()) + 1)[1]  # [B, P, R]
            chosen = top[:, local, ranks]  # [B, M]
        tokens = tokens.at[:, nodes].set(chosen.astype(jnp.int32))
        parents = tree.internal(depth)
        if depth == tree.depth or parents.size == 0:
            break
        slots = start[:, None] + parents  # [B, F]
        positions = jnp.broadcast_to(start[:, None] + depth, slots.shape)
        mask = TreeMask(start=start, slots=slots, visible=visible[parents])
        parent_logits, cache = forward(config, params, tokens[:, parents], positions, cache, mask)
    return TreeProposal(tokens=tokens[:, 1:], q=q_all), cache


def check_vocabulary(draft: ModelConfig, target: ModelConfig) -> None:
    if target.vocab_size != draft.vocab_size:
        raise ValueError(
            "draft and target must share a vocabulary: draft vocab_size "
            f"{draft.vocab_size} != target vocab_size {target.vocab_size}"
        )


@dataclasses.dataclass(frozen=True)
class DraftModel(Drafter):
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

    def __post_init__(self):
        if self.model is not None:
            object.__setattr__(self, "config", self.model.config)
        if self.config is None:
            raise ValueError("DraftModel needs a Model (DraftModel(model))")
        if self.catch_up < 2:
            raise ValueError(f"DraftModel.catch_up must be >= 2, got {self.catch_up}")
        if self.tree_candidates not in ("sample", "top"):
            raise ValueError(f"DraftModel.tree_candidates must be 'sample' or 'top', got {self.tree_candidates!r}")

    def weights(self) -> Any:
        if self.model is None:
            raise ValueError("this DraftModel holds no weights (it is the static part of one)")
        return self.model.params

    def without_weights(self) -> DraftModel:
        return dataclasses.replace(self, model=None)

    def tolerating_lag(self, lag: int) -> DraftModel:
        return dataclasses.replace(self, catch_up=max(self.catch_up, lag))

    def check(self, target_config: ModelConfig, num_speculative_tokens: int) -> None:
        check_vocabulary(self.config, target_config)

    def init(self, weights, ctx: DraftContext, prompt, cache_length: int) -> ModelDraftState:
        return ModelDraftState(cache=prefill(self.config, weights, prompt, ctx.lengths, cache_length, ctx.cache))

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
