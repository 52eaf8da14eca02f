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

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.core.loop import gather_tokens
from specjax.drafters.base import DraftContext
from specjax.drafters.common import HoldsWeights, check_same_target, features_by_position, store_verified
from specjax.drafters.proposing import candidate_scores, draft_chain, expand_tree, samples_candidates, tree_feed
from specjax.models import KVCache, ModelConfig, feature_layers, init_cache
from specjax.models.heads import SPECJAX_HEAD, HeadOptions, eagle_forward, head_slots


@struct.dataclass
class EagleState:
    cache: KVCache  # the head's one-layer cache [1, B, S, n_kv, d_head]
    features: jax.Array  # [B, S, D] or [B, S, n * D] (feature_layers): the target's, by position (verified)


@dataclasses.dataclass(frozen=True)
class Eagle(HoldsWeights):
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

    def check(self, target_config: ModelConfig, num_speculative_tokens: int) -> None:
        check_same_target("EAGLE head", self.config, target_config)
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
        features = features_by_position(ctx, prompt, cache_length)
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
        logits, feature, cache = self._catch_up(weights, state, ctx, ctx.num_speculative_tokens)

        def advance(carry, token):  # token [B] at `position` [B], fed with the head's own f̂
            cache, feature, position = carry
            logits, cache, feature = self._forward(
                weights, ctx, token[:, None], feature[:, None], position[:, None], cache
            )
            return logits[:, 0], (cache, feature[:, 0], position + 1)

        carry = (cache, feature, ctx.lengths)
        proposal, (cache, _, _) = draft_chain(
            advance, carry, logits, key, ctx.num_speculative_tokens, ctx.sampling, ctx.grammar
        )
        return proposal, state.replace(cache=cache)

    def propose_tree(self, weights, state: EagleState, ctx: DraftContext, key):
        """Expand `ctx.tree` by depth (EAGLE-2's tree drafting, on a static tree): a node at
        depth d is fed (its token, its parent's predicted feature) at position L - 1 + d and
        tree slot L - 1 + i, seeing the prefix and its ancestors."""
        tree, sampling = ctx.tree, ctx.sampling
        b = ctx.lengths.shape[0]
        start = ctx.lengths - 1
        root_logits, root_feature, cache = self._catch_up(weights, state, ctx, tree.depth)
        predicted = jnp.zeros((b, tree.num_nodes + 1, self.config.hidden_size), root_feature.dtype)
        predicted = predicted.at[:, 0].set(root_feature)  # [B, N+1, D]: f̂ at each fed node

        def grow(depth, parents, tokens, carry):
            cache, predicted = carry
            positions, mask = tree_feed(tree, start, depth, parents)
            previous = predicted[:, tree.parents[parents]]  # [B, F, D]: each node's parent's f̂
            logits, cache, features = self._forward(weights, ctx, tokens[:, parents], previous, positions, cache, mask)
            return candidate_scores(logits, sampling), (cache, predicted.at[:, parents].set(features))

        root = candidate_scores(root_logits[:, None], sampling)  # [B, 1, V]
        sampled = samples_candidates(sampling, self.tree_candidates)
        proposal, (cache, _) = expand_tree(tree, root, key, sampled, grow, (cache, predicted), ctx.grammar)
        return proposal, state.replace(cache=cache)

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


def _previous(features, positions):
    """f_{p-1} for positions [B, W] from features [B, S, D] (zeros at p = 0) -> [B, W, D]."""
    prev = jnp.take_along_axis(features, jnp.maximum(positions - 1, 0)[:, :, None], axis=1)
    return jnp.where((positions > 0)[:, :, None], prev, 0.0)


def count_parameters(params: dict) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
