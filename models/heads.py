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

Published heads (EAGLE-1/2, EAGLE-3, Medusa-1 as their authors ship them; read by
specjax/drafters/formats/published.py) run these same networks with the options of `HeadOptions`
(EAGLE) and the optional Medusa params below, never a copy of them.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from . import full_forward, graphdef, init_params
from .cache import init_cache
from .config import ModelConfig
from .llama import decode, head_product

# --- EAGLE ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HeadOptions:
    """How an EAGLE-style head computes, beyond its layer config. Static (part of the jit key:
    another value compiles anew); the defaults are specjax's own head, the other values what
    the published formats need (their readers in drafters/formats/published.py set them).

    fc_bias: a bias on fc, params["fc_bias"] [D] (EAGLE-1 heads for Vicuna and LLaMA 2).
    input_norm: the layer normalises its input (EAGLE-1's layer 0 does not; EAGLE-3's
      `input_layernorm` normalises the token embedding).
    final_norm: a norm between the layer and the LM head (EAGLE-1 has none).
    feed_normed: later draft steps are fed the normed output (specjax), or the layer's own
      output before the norm (EAGLE-3).
    hide_first: position 0's entry (token_0, f_-1 = 0) is hidden from every later position.
      The published heads never saw it: their first entry is (token_1, f_0). The head's
      cache then holds position p at slot p - 1 (`_hidden_first`).
    eagle3: EAGLE-3's layer. fc [n * D, D] maps the raw concatenated target states to g
      (later steps are fed the head's own output as g, without fc); attention reads
      [input_norm(embed); hidden_norm(g)] through 2D-wide q/k/v kernels [2D, heads, d_head];
      the residual is g.
    draft_vocab_size: 0 uses the target's LM head. Otherwise the head's own LM head,
      params["lm_head"] [D, Vd], over a draft vocabulary whose token i is target token
      i + params["d2t"][i] (d2t [Vd] int32, present whenever the mapping is not the identity).
      Its logits are scattered into the target vocabulary (-inf elsewhere) before anything
      samples or accepts them, so q is a distribution over target tokens and exactness holds.
    """

    fc_bias: bool = False
    input_norm: bool = True
    final_norm: bool = True
    feed_normed: bool = True
    hide_first: bool = False
    eagle3: bool = False
    draft_vocab_size: int = 0

    def __post_init__(self):
        if self.draft_vocab_size < 0:
            raise ValueError(f"HeadOptions.draft_vocab_size must be >= 0, got {self.draft_vocab_size}")


SPECJAX_HEAD = HeadOptions()


def head_config(
    target: ModelConfig, num_attention_heads: int, num_key_value_heads: int, intermediate_size: int, **overrides
):
    """The head's one-layer Llama config: the target's width, vocabulary and rotary
    embedding (base and scaling: a Llama 3.1 target's positions rotate the same way).
    `overrides`: ModelConfig fields a published head sets itself (its rope_theta, head_dim, ...)."""
    head_dim = target.resolved_head_dim
    config = ModelConfig(
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
    return config.replace(**overrides) if overrides else config


def layer_head_config(target: ModelConfig, layer: ModelConfig) -> ModelConfig:
    """head_config for a published head whose file gives its own layer (`layer`, read from its
    config.json): the target's positions, vocabulary and LM head with the layer's attention
    shape, rotary embedding, eps and biases."""
    return head_config(
        target,
        layer.num_attention_heads,
        layer.num_key_value_heads,
        layer.intermediate_size,
        head_dim=layer.resolved_head_dim,
        rope_theta=layer.rope_theta,
        rope_scaling=layer.rope_scaling,
        rms_norm_eps=layer.rms_norm_eps,
        attention_bias=layer.attention_bias,
        o_proj_bias=layer.o_proj_bias,
        mlp_bias=layer.mlp_bias,
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
    options: HeadOptions = SPECJAX_HEAD,
    draft_logits: bool = False,
):
    """tokens [B, T], prev_features [B, T, D] (f at p - 1), positions [B, T]
    -> (logits [B, T, V], cache, predicted features [B, T, D]). `tree`: a TreeMask.
    `draft_logits` (a head with its own draft vocabulary only): the logits over the draft
    vocabulary [B, T, Vd], not scattered into the target's: training reads them so, and the
    scatter to 49k tokens and its gradient cost more than the head's layer on a CPU.

    `from_target`: prev_features are the target's own; a multi-layer head's are then
    [B, T, n * D], reduced to D here. Otherwise they are the head's own predictions [B, T, D].
    `options`: the variant (HeadOptions); logits are over the target vocabulary whatever it is.
    """
    if options != SPECJAX_HEAD:
        return _published_forward(
            config,
            options,
            params,
            target_params,
            tokens,
            prev_features,
            positions,
            cache,
            tree,
            from_target,
            draft_logits,
        )
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
    x = jnp.concatenate([target_embedding(target_params, tokens, prev_features.dtype), prev_features], axis=-1)
    x = jnp.einsum("bte,ed->btd", x, params["fc"].astype(x.dtype))  # [B, T, 2D] -> [B, T, D]
    merged = {"embed": embed, "layers": params["layers"], "final_norm": params["final_norm"]}
    if not config.tie_word_embeddings:
        merged["lm_head"] = target_params["lm_head"]
    module = nnx.merge(graphdef(config), merged)
    head = functools.partial(target_logits, config, target_params) if _int8(target_params) else None
    return decode(module, x, positions, cache, tree, features=True, head=head)


def _published_forward(
    config, options, params, target_params, tokens, prev, positions, cache, tree, from_target, draft_logits=False
):
    """eagle_forward for options other than specjax's own: the same Block's modules, run
    piece by piece (models/llama.decode runs a block whole, with its input norm)."""
    embed = target_params["embed"]
    e = target_embedding(target_params, tokens, prev.dtype)  # [B, T, D]
    if options.eagle3:
        g = prev  # the head's own output, or (first step) fc over the raw target states
        if from_target:
            g = jnp.einsum("bte,ed->btd", prev, params["fc"].astype(prev.dtype))  # [B, T, n * D] -> [B, T, D]
    else:
        g = jnp.einsum("bte,ed->btd", jnp.concatenate([e, prev], axis=-1), params["fc"].astype(prev.dtype))
    if options.fc_bias and (from_target or not options.eagle3):
        g = g + params["fc_bias"].astype(g.dtype)
    d = config.hidden_size
    ((key, layer),) = params["layers"].items()
    ones = jnp.ones((d,), g.dtype)  # the norms a variant lacks: merged only to complete the module, never run
    layer = {"input_norm": {"scale": ones}, **layer}
    merged = {"embed": embed, "layers": {key: layer}, "final_norm": params.get("final_norm", {"scale": ones})}
    if not config.tie_word_embeddings:
        merged["lm_head"] = target_params["lm_head"]
    module = nnx.merge(graphdef(config), merged)
    block = module.layers[0]
    if options.eagle3:
        hidden = _rms_norm(g, params["hidden_norm"]["scale"], config.rms_norm_eps)
        attn_in = jnp.concatenate([block.input_norm(e), hidden], axis=-1)  # [B, T, 2D]
    else:
        attn_in = block.input_norm(g) if options.input_norm else g
    slot_positions, slot_tree = _hidden_first(positions, tree, cache) if options.hide_first else (positions, tree)
    h, cache = block.attn(attn_in, slot_positions, cache, 0, slot_tree)
    y = g + h  # [B, T, D]
    y = y + block.mlp(block.post_attention_norm(y))
    normed = module.final_norm(y) if options.final_norm else y
    if options.draft_vocab_size:
        logits = jnp.einsum("btd,dv->btv", normed, params["lm_head"].astype(normed.dtype)).astype(jnp.float32)
        if not draft_logits:  # [B, T, Vd] -> [B, T, V]
            logits = to_target_vocab(logits, params.get("d2t"), config.vocab_size)
    else:
        logits = target_logits(config, target_params, normed)  # [B, T, V]
    if tree is None:  # as decode: the committed length, by position (whatever slot holds it)
        cache = cache.replace(lengths=jnp.max(positions, axis=1).astype(jnp.int32) + 1)
    return logits, cache, normed if options.feed_normed else y


def _rms_norm(x, scale, eps: float):
    """models/llama.RMSNorm as a function, for EAGLE-3's hidden_norm (a norm outside the Block)."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * scale.astype(jnp.float32)).astype(x.dtype)


def _hidden_first(positions, tree, cache):
    """(positions, tree) for attention with position 0's entry hidden: position p lives at
    slot p - 1, so slot 0 holds position 1 and nothing any query sees holds position 0.
    A chain call sends position 0 to slot S (past the cache end: attend drops the write; its
    own output, seeing stale slots, is meaningless, and nothing reads it). Rotary angles
    depend only on position differences, so the shift leaves every score unchanged.
    A tree call never holds position 0 (its nodes sit at depth >= 1)."""
    if tree is None:
        return jnp.where(positions > 0, positions - 1, cache.max_length), None
    return positions - 1, tree.replace(start=tree.start - 1, slots=tree.slots - 1)


def head_slots(slots, cache, options: HeadOptions):
    """Cache slots [B, n] of positions -> the head cache's slots for them (`_hidden_first`);
    slots past the cache end (a dropped move) stay past it."""
    if not options.hide_first:
        return slots
    return jnp.where(slots >= cache.max_length, slots, slots - 1)


def to_target_vocab(draft_logits, d2t, vocab_size: int):
    """Draft-vocabulary logits [..., Vd] -> target-vocabulary logits [..., V]: draft token i
    is target token i + d2t[i] (d2t None: the identity); other target tokens get -inf."""
    vd = draft_logits.shape[-1]
    if d2t is None and vd == vocab_size:
        return draft_logits
    ids = jnp.arange(vd, dtype=jnp.int32) + (0 if d2t is None else d2t.astype(jnp.int32))  # [Vd]
    full = jnp.full((*draft_logits.shape[:-1], vocab_size), -jnp.inf, draft_logits.dtype)
    return full.at[..., ids].set(draft_logits)


def teacher_forced(
    config: ModelConfig,
    params: dict,
    target_config: ModelConfig,
    target_params: dict,
    tokens,
    options: HeadOptions = SPECJAX_HEAD,
):
    """The head over whole sequences with the target's true features (training, tuning).

    tokens [B, T] -> (target logits [B, T, V], target features [B, T, D], head logits
    [B, T, V], predicted features [B, T, D]); the target side carries no gradient.
    """
    logits, features = jax.lax.stop_gradient(full_forward(target_config, target_params, tokens, features=True))
    return logits, features, *head_passes(config, params, target_params, tokens, features, options=options)


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


def head_passes(
    config: ModelConfig,
    params: dict,
    target_params: dict,
    tokens,
    features,
    multi=None,
    options: HeadOptions = SPECJAX_HEAD,
):
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
    step = functools.partial(eagle_forward, config, params, target_params, tokens, options=options)
    logits0, _, predicted0 = step(shift(features if multi is None else multi), positions, cache, from_target=True)
    if multi is None:
        return logits0, predicted0  # [B, T, V], [B, T, D]
    logits1, _, predicted1 = step(shift(predicted0), positions, cache)
    return jnp.stack([logits0, logits1]), jnp.stack([predicted0, predicted1])  # [2, B, T, V], [2, B, T, D]


# --- Medusa --------------------------------------------------------------------------------


def _int8(target_params: dict) -> bool:
    """Whether the target's params are in the int8 weight format (models/quant.py): its
    embedding (tied) or LM head carries a scale. Static: the pytree's keys."""
    return "embed_scale" in target_params or "lm_head_scale" in target_params


def target_embedding(target_params: dict, tokens, dtype) -> jax.Array:
    """The target's embedding rows for tokens [B, T] -> [B, T, D] in `dtype`, in any weight
    format: an int8 target's rows are codes, times their per-row scale."""
    rows = target_params["embed"][tokens]
    if "embed_scale" in target_params:
        rows = rows.astype(jnp.float32) * target_params["embed_scale"][tokens][..., None]
    return rows.astype(dtype)


def target_logits(config: ModelConfig, params: dict, hidden: jax.Array) -> jax.Array:
    """The target's LM head on hidden states [..., D] -> float32 logits [..., V], in the
    target's weight format (an int8 target's through its int8 product; others as stored)."""
    name = "embed" if config.tie_word_embeddings else "lm_head"
    if f"{name}_scale" in params:
        return head_product(params, name, hidden.astype(jnp.float32), "int8")
    if config.tie_word_embeddings:
        return jnp.einsum("...d,vd->...v", hidden, params["embed"]).astype(jnp.float32)
    return jnp.einsum("...d,dv->...v", hidden, params["lm_head"]).astype(jnp.float32)


def init_medusa_params(hidden_size: int, num_heads: int, seed: int = 0, dtype=jnp.float32) -> dict:
    """{"w": [H, D, D], "b": [H, D]}. Zero-initialised heads start as the target's LM head
    itself (Medusa's initialisation), plus a little noise so that heads differ."""
    w = 1e-3 * jax.random.normal(jax.random.key(seed), (num_heads, hidden_size, hidden_size), dtype)
    return {"w": w, "b": jnp.zeros((num_heads, hidden_size), dtype)}


def medusa_hidden(params: dict, feature: jax.Array) -> jax.Array:
    """feature [B, D] -> every head's hidden state [B, H, D].

    w [H, D, D], b [H, D]: one residual block per head. w [H, L, D, D], b [H, L, D]: L blocks
    per head, in order (Medusa's medusa_num_layers; its reference ties them, which is the
    special case of equal weights)."""
    w, b = params["w"].astype(feature.dtype), params["b"].astype(feature.dtype)
    if w.ndim == 3:
        h = jnp.einsum("bd,hde->bhe", feature, w) + b
        return feature[:, None, :] + jax.nn.silu(h)  # [B, H, D]
    h = jnp.broadcast_to(feature[:, None, :], (feature.shape[0], w.shape[0], feature.shape[-1]))  # [B, H, D]
    for layer in range(w.shape[1]):
        h = h + jax.nn.silu(jnp.einsum("bhd,hde->bhe", h, w[:, layer]) + b[:, layer])
    return h  # [B, H, D]


def medusa_logits(params: dict, feature: jax.Array, target_config: ModelConfig, target_params: dict) -> jax.Array:
    """feature [B, D] -> float32 logits [B, H, V]: through each head's own LM head,
    params["lm_head"] [H, D, V] (Medusa-1), or else the target's (Medusa-2, specjax)."""
    hidden = medusa_hidden(params, feature)  # [B, H, D]
    if "lm_head" in params:
        return jnp.einsum("bhd,hdv->bhv", hidden, params["lm_head"].astype(hidden.dtype)).astype(jnp.float32)
    return target_logits(target_config, target_params, hidden)


__all__ = [
    "SPECJAX_HEAD",
    "HeadOptions",
    "eagle_forward",
    "head_config",
    "head_passes",
    "head_slots",
    "init_eagle_params",
    "init_medusa_params",
    "medusa_hidden",
    "medusa_logits",
    "target_logits",
    "teacher_forced",
    "to_target_vocab",
    "unrolled",
]
