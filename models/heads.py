"""The draft-head networks: EAGLE's one-layer head and Medusa's heads, as pure functions.

Parameter init, the forward passes and the teacher-forced / unrolled training passes live
here; the drafters that run them inside a decoding round (drafters/eagle.py and
drafters/medusa.py) and head training (training/train_heads.py) import them. Like the rest of
models/, this file imports only jax, flax, numpy and its sibling modules.

EAGLE-style head (Li et al. 2024): at position p the head reads x_p = fc([embed(token_p);
f_{p-1}]), where f_{p-1} is the target's hidden state (the LM head's input) at p - 1, runs
one decoder layer (the same Block every model here uses, with its own small KV cache) and a
final norm, and predicts f̂_p; the target's own LM head (shared, never copied) turns f̂_p
into a guess for token p + 1. The target's embedding and LM head are read from the target
at run time; a head's params hold only fc, its layer and its norm. The head's first
position has no previous feature: f_{-1} = 0, in training and decoding.

Multi-layer features (EAGLE-3, Li et al. 2025): the head reads the outputs of target blocks
i, j, k concatenated, h [.., 3D]. A `reduce` matrix [3D, D] (EAGLE-3's fc) maps them, each
RMS-normalised first, to g in the head's D-dim feature space, and the head reads
fc([embed; g]) as above. Only the first draft step is fed target features; every later
step is fed the head's own predicted feature f̂ [D] in place of g, as EAGLE-3 does. So the
head needs no extra target output: f̂ is trained to regress the target's final-norm
feature (EAGLE's feature loss), and training unrolls one step on f̂ (EAGLE-3's
training-time test, `unrolled`) so the layer learns both inputs: g from the target, f̂
from itself.

Medusa heads (Cai et al. 2024): head k maps the target's hidden state h [D] to
h + SiLU(h W_k + b_k) [D], which the target's own LM head turns into logits.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from . import full_forward, graphdef, init_params
from .cache import init_cache
from .config import ModelConfig
from .llama import decode

# --- EAGLE ---------------------------------------------------------------------------------


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
    fc = 0.02 * jax.random.normal(jax.random.key(seed + 1), (2 * d, d), jnp.dtype(config.dtype))  # [2D, D]
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
        return reduce.reshape(len(layers) * d, d)  # [n * D, D]
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
        h = prev_features.reshape(b, t, width // d, d).astype(jnp.float32)  # [B, T, n, D]
        h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6)
        h = h.reshape(b, t, width).astype(prev_features.dtype)  # [B, T, n * D]
        prev_features = jnp.einsum("bte,ed->btd", h, params["reduce"].astype(h.dtype))  # [B, T, D]
    embed = target_params["embed"]
    x = jnp.concatenate([embed[tokens].astype(prev_features.dtype), prev_features], axis=-1)  # [B, T, 2D]
    x = jnp.einsum("bte,ed->btd", x, params["fc"].astype(x.dtype))  # [B, T, D]
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
    features = nnx.merge(graphdef(target_config), target_params).final_norm(top)  # [B, T, D]: what the LM head reads
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

    def shift(x):  # value at p - 1, zeros at p = 0: [B, T, ..] -> [B, T, ..]
        return jnp.concatenate([jnp.zeros_like(x[:, :1]), x[:, :-1]], axis=1)

    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))  # [B, T]
    cache = init_cache(config, b, t)
    step = functools.partial(eagle_forward, config, params, target_params, tokens)
    logits0, _, predicted0 = step(shift(features if multi is None else multi), positions, cache, from_target=True)
    if multi is None:
        return logits0, predicted0  # [B, T, V], [B, T, D]
    logits1, _, predicted1 = step(shift(predicted0), positions, cache)
    return jnp.stack([logits0, logits1]), jnp.stack([predicted0, predicted1])  # [2, B, T, V], [2, B, T, D]


# --- Medusa --------------------------------------------------------------------------------


def target_logits(config: ModelConfig, params: dict, hidden: jax.Array) -> jax.Array:
    """The target's LM head on hidden states [..., D] -> float32 logits [..., V]."""
    if config.tie_word_embeddings:
        return jnp.einsum("...d,vd->...v", hidden, params["embed"]).astype(jnp.float32)
    return jnp.einsum("...d,dv->...v", hidden, params["lm_head"]).astype(jnp.float32)


def init_medusa_params(hidden_size: int, num_heads: int, seed: int = 0, dtype=jnp.float32) -> dict:
    """{"w": [H, D, D], "b": [H, D]}. Zero-initialised heads start as the target's LM head
    itself (Medusa's initialisation), plus a little noise so that heads differ."""
    w = 1e-3 * jax.random.normal(jax.random.key(seed), (num_heads, hidden_size, hidden_size), dtype)
    return {"w": w, "b": jnp.zeros((num_heads, hidden_size), dtype)}


def medusa_hidden(params: dict, feature: jax.Array) -> jax.Array:
    """feature [B, D] -> every head's hidden state [B, H, D]."""
    h = jnp.einsum("bd,hde->bhe", feature, params["w"].astype(feature.dtype)) + params["b"].astype(feature.dtype)
    return feature[:, None, :] + jax.nn.silu(h)  # [B, H, D]


__all__ = [
    "eagle_forward",
    "head_config",
    "head_passes",
    "init_eagle_params",
    "init_medusa_params",
    "medusa_hidden",
    "target_logits",
    "teacher_forced",
    "unrolled",
]
