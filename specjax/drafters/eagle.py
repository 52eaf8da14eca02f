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
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from specjax.drafters.base import DraftContext, Drafter, Proposal, TreeProposal
from specjax.drafters.draft_model import _draw
from specjax.engine.loop import gather_tokens
from specjax.engine.sampling import probabilities
from specjax.models import KVCache, ModelConfig, TreeMask, full_forward, graphdef, init_cache, init_params
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
    config: ModelConfig, target_params: dict | None = None, seed: int = 0, target_config: ModelConfig | None = None
) -> dict:
    """fc [2D, D], one layer and a final norm (a copy of the target's when it is a plain RMSNorm
    of the same layout; Gemma's scales by 1 + w, so its weights would mean something else)."""
    full = init_params(config, seed)
    d = config.hidden_size
    fc = 0.02 * jax.random.normal(jax.random.key(seed + 1), (2 * d, d), jnp.dtype(config.dtype))
    norm = full["final_norm"]
    plain_rms = target_config is None or not target_config.model_type.startswith("gemma")
    layout = jax.tree.structure(norm)
    same_layout = target_params is not None and jax.tree.structure(target_params.get("final_norm")) == layout
    if plain_rms and same_layout:
        norm = jax.tree.map(jnp.array, target_params["final_norm"])  # a copy: trained, and donated
    return {"fc": fc, "layers": full["layers"], "final_norm": norm}


def eagle_forward(
    config: ModelConfig, params: dict, target_params: dict, tokens, prev_features, positions, cache, tree=None
):
    """tokens [B, T], prev_features [B, T, D] (f at p - 1), positions [B, T]
    -> (logits [B, T, V], cache, predicted features [B, T, D]). `tree`: a TreeMask."""
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
    b, t, d = features.shape
    previous = jnp.concatenate([jnp.zeros((b, 1, d), features.dtype), features[:, :-1]], axis=1)  # f_{p-1}
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    cache = init_cache(config, b, t)
    head_logits, _, predicted = eagle_forward(config, params, target_params, tokens, previous, positions, cache)
    return target_logits, features, head_logits, predicted


@struct.dataclass
class EagleState:
    cache: KVCache  # the head's one-layer cache [1, B, S, n_kv, d_head]
    features: jax.Array  # [B, S, D]: the target's features by position (verified ones)


@dataclasses.dataclass(frozen=True)
class Eagle(Drafter):
    """An EAGLE-style head for one target; `config` is its one-layer Llama config."""

    params: dict | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)
    config: ModelConfig | None = None
    tree_candidates: str = "sample"  # as DraftModel.tree_candidates
    name = "eagle"
    needs_features = True
    supports_trees = True

    def __post_init__(self):
        if self.config is None:
            raise ValueError("Eagle needs its head config (see drafters/eagle.py head_config)")

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

    def init(self, weights, ctx: DraftContext, prompt, cache_length: int) -> EagleState:
        b, t = prompt.shape
        features = jnp.zeros((b, cache_length, self.config.hidden_size), ctx.features.dtype)
        features = features.at[:, :t].set(ctx.features)
        cache = init_cache(self.config, b, cache_length, dtype=ctx.cache.dtype, block_size=ctx.cache.block_size)
        # Every prompt position p gets (token_p, f_{p-1}); padding positions are rewritten later.
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        _, cache, _ = eagle_forward(
            self.config, weights, ctx.target_params, prompt, _previous(features, positions), positions, cache
        )
        return EagleState(cache=cache.replace(lengths=ctx.lengths), features=features)

    def _catch_up(self, weights, state: EagleState, ctx: DraftContext, accepted_max: int):
        """Re-feed positions L-A-1..L-1 with true features (A = the most a round can accept);
        the last one predicts the token at L. -> (logits [B, V], feature [B, D], cache)."""
        feed = jnp.maximum(ctx.lengths[:, None] + jnp.arange(-accepted_max - 1, 0), 0)  # [B, A+1]
        tokens, previous = gather_tokens(ctx.tokens, feed), _previous(state.features, feed)
        logits, cache, predicted = eagle_forward(
            self.config, weights, ctx.target_params, tokens, previous, feed, state.cache
        )
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
        return state.replace(features=features)


def _previous(features, positions):
    """f_{p-1} for positions [B, W] from features [B, S, D] (zeros at p = 0) -> [B, W, D]."""
    prev = jnp.take_along_axis(features, jnp.maximum(positions - 1, 0)[:, :, None], axis=1)
    return jnp.where((positions > 0)[:, :, None], prev, 0.0)


def count_parameters(params: dict) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
