"""EAGLE-style head (Li et al. 2024): one decoder layer that extrapolates the target's features.

At position p the head reads x_p = fc([embed(token_p); f_{p-1}]), where f_{p-1} is the
target's hidden state (the LM head's input) at p - 1, runs one decoder layer (the same
Block every model here uses, with its own small KV cache) and a final norm, and predicts
f̂_p; the target's own LM head (shared, never copied) turns f̂_p into a guess for token
p + 1. Drafting K tokens: a catch-up over the last K + 1 positions with the verify pass's
true features (re-feeding a position rewrites identical K/V), then K - 1 steps on the
head's own predicted features. The target's embedding and LM head are read from the target
at run time; a saved head holds only fc, its layer and its norm.

The head's first position has no previous feature: f_{-1} = 0, in training and decoding.

Multi-layer features (EAGLE-3, Li et al. 2025), `Eagle(feature_layers=(i, j, k))`: the
target's verify pass returns the outputs of blocks i, j, k concatenated, h [.., 3D], and the
head keeps those in its state. A `reduce` matrix [3D, D] (EAGLE-3's fc) maps them, each
RMS-normalised first, to g in the head's D-dim feature space, and the head reads
fc([embed; g]) as above. Only the first draft step (the catch-up, and the root of a tree)
is fed target features; every later step is fed the head's own predicted feature f̂ [D]
in place of g, as EAGLE-3 does. So the head
needs no extra target output: f̂ is trained to regress the target's final-norm feature
(EAGLE's feature loss), and training unrolls one step on f̂ (EAGLE-3's training-time test,
`unrolled`) so the layer learns both inputs: g from the target, f̂ from itself.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from specjax.drafters.base import DraftContext, Drafter, Proposal, TreeProposal
from specjax.drafters.draft_model import _draw
from specjax.engine.loop import gather_tokens
from specjax.engine.sampling import probabilities
from specjax.models import (
    KVCache,
    ModelConfig,
    TreeMask,
    feature_layers,
    full_forward,
    graphdef,
    init_cache,
    init_params,
)
from specjax.models.llama import decode


def head_config(target: ModelConfig, num_attention_heads: int, num_key_value_heads: int, intermediate_size: int):
    """The head's one-layer Llama config: the target's width, vocabulary and rotary
    embedding (base and scaling: a Llama 3.1 target's positions rotate the same way)."""
    head_dim = target.resolved_head_dim
    return ModelConfig(
        vocab_size=target.vocab_size,
        hidden_size=target.hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=1,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        rope_theta=target.rope_theta,
        rope_scaling=target.rope_scaling,
        rms_norm_eps=target.rms_norm_eps,
        max_position_embeddings=target.max_position_embeddings,
        tie_word_embeddings=target.tie_word_embeddings,
        dtype=target.dtype,
        model_type="llama",
    )


def init_eagle_params(
    config: ModelConfig,
    target_params: dict | None = None,
    seed: int = 0,
    target_config: ModelConfig | None = None,
    layers: tuple[int, ...] = (),
) -> dict:
    """fc [2D, D], one layer and a final norm (a copy of the target's when it is a plain RMSNorm
    of the same layout; Gemma's scales by 1 + w, so its weights would mean something else);
    with multi-layer features `layers`, also reduce [len(layers) * D, D]."""
    full = init_params(config, seed)
    d = config.hidden_size
    fc = 0.02 * jax.random.normal(jax.random.key(seed + 1), (2 * d, d), jnp.dtype(config.dtype))
    norm = full["final_norm"]
    plain_rms = target_config is None or not target_config.model_type.startswith("gemma")
    layout = jax.tree.structure(norm)
    same_layout = target_params is not None and jax.tree.structure(target_params.get("final_norm")) == layout
    if plain_rms and same_layout:
        norm = jax.tree.map(jnp.array, target_params["final_norm"])  # a copy: trained, and donated
    params = {"fc": fc, "layers": full["layers"], "final_norm": norm}
    if layers:
        params["reduce"] = _init_reduce(d, layers, fc.dtype, seed, target_params, target_config, plain_rms)
    return params


def _init_reduce(d: int, layers, dtype, seed: int, target_params, target_config, plain_rms: bool):
    """reduce [n * D, D] over the RMS-normalised block outputs. When the last block is among
    them and the target's final norm is a plain RMSNorm: zeros but the scale of that norm
    on the last block's rows, so g starts as exactly the final-norm feature f a one-layer
    head reads (the head starts where EAGLE starts and learns what the lower layers add);
    otherwise random, scaled so g has about unit size."""
    last = None if target_config is None else target_config.num_hidden_layers - 1
    norm = {} if target_params is None else target_params.get("final_norm", {})
    scale = norm.get("scale") if set(norm) == {"scale"} else None  # an RMSNorm (a LayerNorm has a bias too)
    if plain_rms and last in layers and scale is not None:
        reduce = jnp.zeros((len(layers), d, d), dtype).at[layers.index(last)].set(jnp.diag(scale.astype(dtype)))
        return reduce.reshape(len(layers) * d, d)
    return jax.random.normal(jax.random.key(seed + 2), (len(layers) * d, d), dtype) / np.sqrt(len(layers) * d)


def eagle_forward(
    config: ModelConfig,
    params: dict,
    target_params: dict,
    tokens,
    prev_features,
    positions,
    cache,
    tree=None,
    from_target: bool = False,
):
    """tokens [B, T], prev_features [B, T, D] (f at p - 1), positions [B, T]
    -> (logits [B, T, V], cache, predicted features [B, T, D]). `tree`: a TreeMask.

    `from_target`: prev_features are the target's own; a multi-layer head's are then
    [B, T, n * D], reduced to D here. Otherwise they are the head's own predictions [B, T, D].
    """
    if from_target and "reduce" in params:
        # Block outputs are residual-stream states, far larger than f (rms 9-25 against 1 on
        # stdlib-target) and of different sizes per layer: each is RMS-normalised (no weights)
        # before the reduce, so g and the head's own f̂ (fed at later steps) share one scale.
        b, t, width = prev_features.shape
        d = params["reduce"].shape[1]
        h = prev_features.reshape(b, t, width // d, d).astype(jnp.float32)
        h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6)
        h = h.reshape(b, t, width).astype(prev_features.dtype)
        prev_features = jnp.einsum("bte,ed->btd", h, params["reduce"].astype(h.dtype))  # [B, T, D]
    embed = target_params["embed"]
    x = jnp.concatenate([embed[tokens].astype(prev_features.dtype), prev_features], axis=-1)  # [B, T, 2D]
    x = jnp.einsum("bte,ed->btd", x, params["fc"].astype(x.dtype))
    merged = {"embed": embed, "layers": params["layers"], "final_norm": params["final_norm"]}
    if not config.tie_word_embeddings:
        merged["lm_head"] = target_params["lm_head"]
    module = nnx.merge(graphdef(config), merged)
    return decode(module, x, positions, cache, tree, features=True)


def teacher_forced(config: ModelConfig, params: dict, target_config: ModelConfig, target_params: dict, tokens):
    """The head over whole sequences with the target's true features (training, tuning).

    tokens [B, T] -> (target logits [B, T, V], target features [B, T, D], head logits
    [B, T, V], predicted features [B, T, D]); the target side carries no gradient.
    """
    target_logits, features = jax.lax.stop_gradient(full_forward(target_config, target_params, tokens, features=True))
    return target_logits, features, *head_passes(config, params, target_params, tokens, features)


def unrolled(config: ModelConfig, params: dict, target_config: ModelConfig, target_params: dict, tokens, layers):
    """A multi-layer head over whole sequences, unrolled one step (EAGLE-3's training-time test).

    tokens [B, T] -> (target logits [B, T, V], target final-norm features [B, T, D], head
    logits [2, B, T, V], predicted features [2, B, T, D]); see `head_passes`.
    """
    last = target_config.num_hidden_layers - 1
    asked = layers if last in layers else (*layers, last)  # the final block's output too, for f
    target_logits, hidden = jax.lax.stop_gradient(full_forward(target_config, target_params, tokens, features=asked))
    d = target_config.hidden_size
    multi = hidden[..., : len(layers) * d]  # [B, T, n * D]
    top = hidden[..., asked.index(last) * d : (asked.index(last) + 1) * d]  # [B, T, D]
    features = nnx.merge(graphdef(target_config), target_params).final_norm(top)  # what the LM head reads
    return target_logits, features, *head_passes(config, params, target_params, tokens, features, multi)


def head_passes(config: ModelConfig, params: dict, target_params: dict, tokens, features, multi=None):
    """The head's side of a training step, given the target's features (computed on the fly,
    or read from a feature cache): tokens [B, T], final-norm features [B, T, D].

    Without `multi`: one teacher-forced pass on f_{p-1} -> (head logits [B, T, V], predicted
    [B, T, D]). With multi-layer features `multi` [B, T, n * D]: two passes -> ([2, B, T, V],
    [2, B, T, D]). Pass 0 reads h_{p-1} (what the first draft step reads); pass 1 reads pass
    0's prediction f̂_{p-1} (what every later step reads); both predict f_p and the token at
    p + 1. Pass 1 attends to pass-1 keys of earlier positions where decoding sees keys fed
    with target features: a small mismatch, the price of running the unrolled step in parallel.
    """

    def shift(x):  # value at p - 1, zeros at p = 0
        return jnp.concatenate([jnp.zeros_like(x[:, :1]), x[:, :-1]], axis=1)

    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    cache = init_cache(config, b, t)
    step = functools.partial(eagle_forward, config, params, target_params, tokens)
    logits0, _, predicted0 = step(shift(features if multi is None else multi), positions, cache, from_target=True)
    if multi is None:
        return logits0, predicted0
    logits1, _, predicted1 = step(shift(predicted0), positions, cache)
    return jnp.stack([logits0, logits1]), jnp.stack([predicted0, predicted1])


@struct.dataclass
class EagleState:
    cache: KVCache  # the head's one-layer cache [1, B, S, n_kv, d_head]
    features: jax.Array  # [B, S, D] or [B, S, n * D] (feature_layers): the target's, by position (verified)


@dataclasses.dataclass(frozen=True)
class Eagle(Drafter):
    """An EAGLE-style head for one target; `config` is its one-layer Llama config.

    `feature_layers`: () reads the target's final-norm feature (EAGLE); block indices
    (i, j, k) read those blocks' outputs concatenated (EAGLE-3; module docstring).
    """

    params: dict | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)
    config: ModelConfig | None = None
    tree_candidates: str = "sample"  # as DraftModel.tree_candidates
    feature_layers: tuple[int, ...] = ()
    name = "eagle"
    supports_trees = True

    def __post_init__(self):
        if self.config is None:
            raise ValueError("Eagle needs its head config (see drafters/eagle.py head_config)")
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
        reduce = None if self.params is None else self.params.get("reduce")
        want = len(self.feature_layers) * self.config.hidden_size
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

    def init(self, weights, ctx: DraftContext, prompt, cache_length: int) -> EagleState:
        b, t = prompt.shape
        # [B, S, D] (final-norm) or [B, S, n * D] (multi-layer): the target features by position.
        features = jnp.zeros((b, cache_length, ctx.features.shape[-1]), ctx.features.dtype)
        features = features.at[:, :t].set(ctx.features)
        cache = init_cache(self.config, b, cache_length, dtype=ctx.cache.dtype, block_size=ctx.cache.block_size)
        # Every prompt position p gets (token_p, f_{p-1}); padding positions are rewritten later.
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        previous = _previous(features, positions)
        _, cache, _ = eagle_forward(
            self.config, weights, ctx.target_params, prompt, previous, positions, cache, from_target=True
        )
        return EagleState(cache=cache.replace(lengths=ctx.lengths), features=features)

    def _catch_up(self, weights, state: EagleState, ctx: DraftContext, accepted_max: int):
        """Re-feed positions L-A-1..L-1 with true features (A = the most a round can accept);
        the last one predicts the token at L. -> (logits [B, V], feature [B, D], cache)."""
        width = accepted_max + 1

        def feed_true(positions, cache):  # positions [B, W]: (token_p, true f_{p-1}) at each
            tokens, previous = gather_tokens(ctx.tokens, positions), _previous(state.features, positions)
            return eagle_forward(
                self.config, weights, ctx.target_params, tokens, previous, positions, cache, from_target=True
            )

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
            logits, cache, feature = eagle_forward(
                self.config, weights, ctx.target_params, token[:, None], feature[:, None], position[:, None], cache
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
            parent_logits, cache, features = eagle_forward(
                self.config, weights, ctx.target_params, tokens[:, parents], previous, positions, cache, mask
            )
            predicted = predicted.at[:, parents].set(features)
        return TreeProposal(tokens=tokens[:, 1:], q=q_all), state.replace(cache=cache)

    def update_tree(self, weights, state: EagleState, ctx: DraftContext, src, dst, num_accepted):
        state = state.replace(cache=state.cache.move(src, dst))
        return self.update(weights, state, ctx, num_accepted)

    def update(self, weights, state: EagleState, ctx: DraftContext, num_accepted):
        # Verified features: positions L_prev - 1 + j for j <= num_accepted (L_prev = new length
        # - num_accepted - 1, before any EOS/max cut; a cut row is done and never drafts again).
        width = ctx.features.shape[1]
        j = jnp.arange(width)[None, :]
        start = ctx.lengths - num_accepted - 2  # [B]
        slots = jnp.where(j <= num_accepted[:, None], start[:, None] + j, state.features.shape[1])
        rows = jnp.arange(slots.shape[0])[:, None]
        features = state.features.at[rows, slots].set(ctx.features.astype(state.features.dtype), mode="drop")
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
