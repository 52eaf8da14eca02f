"""The EAGLE-style drafter (Li et al. 2024): a one-layer head that extrapolates the target's features.

The head network (its params, `eagle_forward`, the training passes) lives in
specjax/models/heads.py, with the description of what it reads and predicts; this file
runs it inside a decoding round. Drafting K tokens: a catch-up over the last K + 1
positions with the verify pass's true features (re-feeding a position rewrites identical
K/V), then K - 1 steps on the head's own predicted features. The target's embedding and
LM head are read from the target at run time; a saved head holds only fc, its layer and
its norm.

Multi-layer features (EAGLE-3, Li et al. 2025), `Eagle(feature_layers=(i, j, k))`: the
target's verify pass returns the outputs of blocks i, j, k concatenated, h [.., 3D], and the
drafter keeps those in its state. Only the first draft step (the catch-up, and the root of
a tree) is fed target features; every later step is fed the head's own predicted feature
f̂ [D], as EAGLE-3 does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.core.loop import gather_tokens
from specjax.core.sampling import probabilities
from specjax.drafters.base import DraftContext, Drafter, Proposal, TreeProposal
from specjax.drafters.draft_model import _draw
from specjax.models import KVCache, ModelConfig, TreeMask, feature_layers, init_cache
from specjax.models.heads import SPECJAX_HEAD, HeadOptions, eagle_forward, head_slots


@struct.dataclass
class EagleState:
    cache: KVCache  # the head's one-layer cache [1, B, S, n_kv, d_head]
    features: jax.Array  # [B, S, D] or [B, S, n * D] (feature_layers): the target's, by position (verified)


@dataclasses.dataclass(frozen=True)
class Eagle(Drafter):
    """An EAGLE-style head for one target; `config` is its one-layer Llama config.

    `feature_layers`: () reads the target's final-norm feature (EAGLE); block indices
    (i, j, k) read those blocks' outputs concatenated (EAGLE-3; module docstring).
    `options`: the network variant (models/heads.HeadOptions); the default is specjax's head.
    """

    params: dict | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)
    config: ModelConfig | None = None
    tree_candidates: str = "sample"  # as DraftModel.tree_candidates
    feature_layers: tuple[int, ...] = ()
    options: HeadOptions = SPECJAX_HEAD
    name = "eagle"
    supports_trees = True

    def __post_init__(self):
        if self.config is None:
            raise ValueError("Eagle needs its head config (see specjax.models.heads.head_config)")
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))  # hashable

    @property
    def needs_features(self):
        # What the engine passes to forward/prefill as `features=`: a layer tuple, or True.
        return self.feature_layers or True

    def weights(self) -> Any:
        if self.params is None:
            raise ValueError("this Eagle holds no weights (it is the static part of one)")
        return self.params

    def without_weights(self) -> Eagle:
        return dataclasses.replace(self, params=None)

    def check(self, target_config: ModelConfig, num_speculative_tokens: int) -> None:
        for field in ("hidden_size", "vocab_size", "tie_word_embeddings"):
            mine, theirs = getattr(self.config, field), getattr(target_config, field)
            if mine != theirs:
                raise ValueError(
                    f"this EAGLE head has {field}={mine}, the target {theirs}: it was trained for another target"
                )
        if self.feature_layers:
            feature_layers(self.feature_layers, target_config.num_hidden_layers)  # a ValueError naming bad ones
        want = len(self.feature_layers) * self.config.hidden_size
        if self.options.eagle3:  # fc itself reads the target states: fc [n * D, D]
            if not self.feature_layers:
                raise ValueError("an EAGLE-3 head reads multi-layer features: give it feature_layers")
            fc = None if self.params is None else self.params["fc"]
            if fc is not None and fc.shape[0] != want:
                raise ValueError(
                    f"this EAGLE-3 head's fc reads {fc.shape[0]} features, but feature_layers={self.feature_layers} "
                    f"gives {want}"
                )
            return
        reduce = None if self.params is None else self.params.get("reduce")
        if self.params is not None and (reduce is None) != (not self.feature_layers):
            raise ValueError(
                f"this EAGLE head's weights {'lack' if reduce is None else 'have'} a reduce matrix, but it reads "
                f"feature_layers={self.feature_layers}: weights and config do not belong together"
            )
        if reduce is not None and reduce.shape[0] != want:
            raise ValueError(
                f"this EAGLE head's reduce matrix reads {reduce.shape[0]} features, but feature_layers="
                f"{self.feature_layers} gives {want}"
            )

    def _forward(self, weights, ctx: DraftContext, tokens, previous, positions, cache, tree=None, from_target=False):
        return eagle_forward(
            self.config, weights, ctx.target_params, tokens, previous, positions, cache, tree, from_target, self.options
        )

    def init(self, weights, ctx: DraftContext, prompt, cache_length: int) -> EagleState:
        b, t = prompt.shape
        # [B, S, D] (final-norm) or [B, S, n * D] (multi-layer): the target features by position.
        features = jnp.zeros((b, cache_length, ctx.features.shape[-1]), ctx.features.dtype)
        features = features.at[:, :t].set(ctx.features)
        cache = init_cache(self.config, b, cache_length, dtype=ctx.cache.dtype, block_size=ctx.cache.block_size)
        # Every prompt position p gets (token_p, f_{p-1}); padding positions are rewritten later.
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        previous = _previous(features, positions)
        _, cache, _ = self._forward(weights, ctx, prompt, previous, positions, cache, from_target=True)
        return EagleState(cache=cache.replace(lengths=ctx.lengths), features=features)

    def _catch_up(self, weights, state: EagleState, ctx: DraftContext, accepted_max: int):
        """Re-feed positions L-A-1..L-1 with true features (A = the most a round can accept);
        the last one predicts the token at L. -> (logits [B, V], feature [B, D], cache)."""
        width = accepted_max + 1

        def feed_true(positions, cache):  # positions [B, W]: (token_p, true f_{p-1}) at each
            tokens, previous = gather_tokens(ctx.tokens, positions), _previous(state.features, positions)
            return self._forward(weights, ctx, tokens, previous, positions, cache, from_target=True)

        # Plain steps of adaptive speculation (engine/adaptive.py) commit tokens the head never
        # saw: feed what its cache lacks in chunks first (the loop never runs otherwise).
        last = jnp.maximum(ctx.lengths - 1, 0)[:, None]

        def lagging(cache):
            return jnp.any(~ctx.done & (cache.lengths < ctx.lengths - width))

        def resync(cache):
            return feed_true(jnp.minimum(cache.lengths[:, None] + jnp.arange(width), last), cache)[1]

        cache = jax.lax.while_loop(lagging, resync, state.cache)
        feed = jnp.maximum(ctx.lengths[:, None] + jnp.arange(-width, 0), 0)  # [B, A+1]
        logits, cache, predicted = feed_true(feed, cache)
        return logits[:, -1], predicted[:, -1], cache

    def propose(self, weights, state: EagleState, ctx: DraftContext, key):
        k = ctx.num_speculative_tokens
        lengths = ctx.lengths
        logits, feature, cache = self._catch_up(weights, state, ctx, k)

        def draft_step(carry, step_key):
            cache, logits, feature, position = carry  # logits [B, V] predict the token at `position`
            token, q = _draw(step_key, logits, ctx.sampling)
            logits, cache, feature = self._forward(
                weights, ctx, token[:, None], feature[:, None], position[:, None], cache
            )
            return (cache, logits[:, 0], feature[:, 0], position + 1), (token, q)

        keys = jax.random.split(key, k)
        carry = (cache, logits, feature, lengths)
        (cache, logits, _, _), (tokens, qs) = jax.lax.scan(draft_step, carry, keys[:-1])
        last_token, last_q = _draw(keys[-1], logits, ctx.sampling)
        drafts = jnp.concatenate([tokens.T, last_token[:, None]], axis=1)  # [B, K]
        q = None if last_q is None else jnp.concatenate([qs.transpose(1, 0, 2), last_q[:, None]], axis=1)
        return Proposal(tokens=drafts, q=q), state.replace(cache=cache)

    def propose_tree(self, weights, state: EagleState, ctx: DraftContext, key):
        """Expand `ctx.tree` by depth (EAGLE-2's tree drafting, on a static tree): a node at
        depth d is fed (its token, its parent's predicted feature) at position L - 1 + d and
        tree slot L - 1 + i, seeing the prefix and its ancestors."""
        tree = ctx.tree
        b = ctx.lengths.shape[0]
        start = ctx.lengths - 1
        root_logits, root_feature, cache = self._catch_up(weights, state, ctx, tree.depth)
        sampled = not ctx.sampling.greedy and self.tree_candidates == "sample"
        visible = jnp.asarray(tree.ancestors)
        tokens = jnp.zeros((b, tree.num_nodes + 1), jnp.int32)
        predicted = jnp.zeros((b, tree.num_nodes + 1, self.config.hidden_size), root_feature.dtype)
        predicted = predicted.at[:, 0].set(root_feature)  # [B, N+1, D]: f̂ at each fed node
        q_all = jnp.zeros((b, tree.num_nodes + 1, self.config.vocab_size), jnp.float32) if sampled else None
        parents, parent_logits = np.array([0]), root_logits[:, None]  # [P], [B, P, V]
        keys = jax.random.split(key, tree.depth)
        for depth in range(1, tree.depth + 1):
            nodes = tree.level(depth)
            local = np.searchsorted(parents, tree.parents[nodes])
            ranks = tree.ranks[nodes]
            scores = parent_logits if ctx.sampling.greedy else probabilities(parent_logits, ctx.sampling)
            if sampled:
                q_all = q_all.at[:, parents].set(scores)
                shape = (int(ranks.max()) + 1, *scores.shape[:-1])
                draws = jax.random.categorical(keys[depth - 1], jnp.log(scores), axis=-1, shape=shape)
                chosen = draws[ranks, :, local].T  # [B, M]
            else:
                chosen = jax.lax.top_k(scores, int(ranks.max()) + 1)[1][:, local, ranks]  # [B, M]
            tokens = tokens.at[:, nodes].set(chosen.astype(jnp.int32))
            parents = tree.internal(depth)
            if depth == tree.depth or parents.size == 0:
                break
            slots = start[:, None] + parents  # [B, F]
            positions = jnp.broadcast_to(start[:, None] + depth, slots.shape)
            mask = TreeMask(start=start, slots=slots, visible=visible[parents])
            previous = predicted[:, tree.parents[parents]]  # [B, F, D]: each node's parent's f̂
            parent_logits, cache, features = self._forward(
                weights, ctx, tokens[:, parents], previous, positions, cache, mask
            )
            predicted = predicted.at[:, parents].set(features)
        return TreeProposal(tokens=tokens[:, 1:], q=q_all), state.replace(cache=cache)

    def update_tree(self, weights, state: EagleState, ctx: DraftContext, src, dst, num_accepted):
        # Slots of positions; a head with position 0 hidden holds position p at slot p - 1.
        cache = state.cache
        state = state.replace(
            cache=cache.move(head_slots(src, cache, self.options), head_slots(dst, cache, self.options))
        )
        return self.update(weights, state, ctx, num_accepted)

    def update(self, weights, state: EagleState, ctx: DraftContext, num_accepted):
        # Verified features: positions L_prev - 1 + j for j <= num_accepted (L_prev = new length
        # - num_accepted - 1, before any EOS/max cut; a cut row is done and never drafts again).
        features = store_verified(state.features, ctx, num_accepted)
        # Slots below the round's start hold K/V of true features (its catch-up fed them); the
        # drafted ones past it were fed predicted features, and the next catch-up rewrites them.
        cache = state.cache.replace(lengths=jnp.minimum(state.cache.lengths, ctx.lengths - num_accepted - 1))
        return state.replace(features=features, cache=cache)


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


def _previous(features, positions):
    """f_{p-1} for positions [B, W] from features [B, S, D] (zeros at p = 0) -> [B, W, D]."""
    prev = jnp.take_along_axis(features, jnp.maximum(positions - 1, 0)[:, :, None], axis=1)
    return jnp.where((positions > 0)[:, :, None], prev, 0.0)


def count_parameters(params: dict) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
