"""The Llama-family decoder every rotary family shares, as Flax NNX modules.

Llama, Mistral, Qwen2 and Phi-3 run `Llama` itself; Qwen3, Gemma 2/3, Mixtral and
Qwen3-MoE are subclasses in their own small files that swap in what differs through the
class hooks of `Llama` (the norm, a q/k norm, the MLP, sandwich norms, the embedding
scale). Per-layer attention options (rotary variant and base, sliding window, score
soft-capping and scale) are read from the config by `Attention`.

The module is only ever used functionally, through `specjax.models.forward`, which
merges a cached graph definition with a plain params pytree, so the same code serves
prefill (T = prompt length), drafting (T = 1 or 2) and verification (T = K + 1), for the
draft and for the target. `attend` (attention.py) is the cache write + attention every
family shares.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .attention import TreeMask, attend
from .cache import KVCache
from .config import ModelConfig
from .fixed_order import tree_mean
from .quant import project, quantize, weight_axes
from .rope import frequencies, rotary

_init = nnx.initializers.normal(stddev=0.02)

# Each matrix param's product (its einsum), by name: `project` runs it in the config's
# weight format, and the int8 scale of a matrix is over that product's contraction axes
# (`weight_axes`). "embed" is the tied LM head's product: a scale per vocabulary row, which
# the token lookup reads too.
PROJECTIONS = {
    "q_proj": "btd,dhk->bthk",
    "k_proj": "btd,dgk->btgk",
    "v_proj": "btd,dgk->btgk",
    "o_proj": "bthk,hkd->btd",
    "gate_proj": "btd,df->btf",
    "up_proj": "btd,df->btf",
    "down_proj": "btf,fd->btd",
    "embed": "btd,vd->btv",
    "lm_head": "btd,dv->btv",
}


def _matrix(module: nnx.Module, name: str, rng, shape: tuple[int, ...], dtype, config: ModelConfig) -> None:
    """Set module.<name> (drawn in `dtype`) stored in the config's weight format, plus
    module.<name>_scale for int8. The draw is the same whatever the format."""
    w = _init(rng, shape, dtype)
    if config.weights == "int8":
        q, scale = quantize(w, weight_axes(PROJECTIONS[name]))
        setattr(module, name, nnx.Param(q))
        setattr(module, f"{name}_scale", nnx.Param(scale))
    elif config.weights == "bfloat16":
        setattr(module, name, nnx.Param(w.astype(jnp.bfloat16)))
    else:
        setattr(module, name, nnx.Param(w))


def _project(module: nnx.Module, name: str, x):
    """x through module.<name>'s product (PROJECTIONS) in the module's weight format."""
    fmt = module.config.weights
    scale = getattr(module, f"{name}_scale")[...] if fmt == "int8" else None
    return project(x, getattr(module, name)[...], scale, PROJECTIONS[name], fmt)


def embedding(model: nnx.Module, tokens):
    """model.embed's rows for tokens [B, T] -> [B, T, D] (see `embedding_rows`)."""
    scale = model.embed_scale[...] if model.config.weights == "int8" else None
    return embedding_rows(model.config, model.embed[...], scale, tokens)


def embedding_rows(config: ModelConfig, embed, scale, tokens):
    """Rows of the stored embedding [V, D] for tokens [B, T] -> [B, T, D]: int8 rows times
    their scale [V] (float32), bfloat16 rows in the config's dtype, float32-format rows as stored."""
    rows = embed[tokens]
    if config.weights == "int8":
        return rows.astype(jnp.float32) * scale[tokens][..., None]
    if config.weights == "bfloat16":
        return rows.astype(jnp.dtype(config.dtype))
    return rows


def lm_head(model: nnx.Module, x):
    """Final-norm states [B, T, D] -> logits [B, T, V] through the (tied) LM head."""
    return _project(model, "embed" if model.config.tie_word_embeddings else "lm_head", x)


def params_embedding(config: ModelConfig, params: dict, tokens):
    """`embedding` from a params dict (a draft head reading its target's): [B, T] -> [B, T, D]."""
    return embedding_rows(config, params["embed"], params.get("embed_scale"), tokens)


def params_lm_head(config: ModelConfig, params: dict, hidden):
    """The LM head from a params dict in the config's weight format: hidden [..., D] -> [..., V]
    (the float32 format: today's einsum over the stored dtype)."""
    name = "embed" if config.tie_word_embeddings else "lm_head"
    return head_product(params, name, hidden, config.weights)


def head_product(params: dict, name: str, hidden, fmt: str):
    """hidden [..., D] through params[name] (the tied "embed" or "lm_head") in format `fmt`."""
    rows = hidden.reshape(-1, 1, hidden.shape[-1])  # [N, 1, D]: project's [B, T, D]
    out = project(rows, params[name], params.get(f"{name}_scale"), PROJECTIONS[name], fmt)
    return out.reshape(*hidden.shape[:-1], out.shape[-1])


class RMSNorm(nnx.Module):
    """`fixed`: the mean as a fixed-order sum (models/fixed_order.py), whose bits for a row do
    not depend on how many rows run with it (the bfloat16 and int8 weight formats)."""

    def __init__(self, dim: int, eps: float, dtype, fixed: bool = False):
        self.scale = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps
        self.fixed = fixed

    def __call__(self, x):  # [..., D]
        # Normalise in float32 whatever the parameter dtype, as HF does.
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(mean_square(x32, self.fixed) + self.eps)
        return (x32 * self.scale.astype(jnp.float32)).astype(x.dtype)


def mean_square(x32, fixed: bool):
    """mean(x * x) over the last axis, keepdims; `fixed`: in a fixed order (see RMSNorm)."""
    return tree_mean(x32 * x32, axis=-1, keepdims=True) if fixed else jnp.mean(x32 * x32, axis=-1, keepdims=True)


def fixed_order(config: ModelConfig) -> bool:
    """Whether a model's row sums run in a fixed order (models/fixed_order.py): in the bfloat16
    and int8 formats, whose promise is a row's logits independent of the verify width."""
    return config.weights != "float32"


class Attention(nnx.Module):
    """Grouped-query attention. `qk_norm` (a norm class, or None) normalises each head of q
    and k over d_head before the rotation (Qwen3, Gemma 3)."""

    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs, qk_norm=None):
        d, hd = config.hidden_size, config.resolved_head_dim
        h, kv = config.num_attention_heads, config.num_key_value_heads
        _matrix(self, "q_proj", rngs.params(), (d, h, hd), dtype, config)
        _matrix(self, "k_proj", rngs.params(), (d, kv, hd), dtype, config)
        _matrix(self, "v_proj", rngs.params(), (d, kv, hd), dtype, config)
        _matrix(self, "o_proj", rngs.params(), (h, hd, d), dtype, config)
        if config.attention_bias:
            self.q_bias = nnx.Param(jnp.zeros((h, hd), dtype))
            self.k_bias = nnx.Param(jnp.zeros((kv, hd), dtype))
            self.v_bias = nnx.Param(jnp.zeros((kv, hd), dtype))
        if config.o_proj_bias:
            self.o_bias = nnx.Param(jnp.zeros((d,), dtype))
        if qk_norm is not None:
            self.q_norm = qk_norm(hd, config.rms_norm_eps, dtype)
            self.k_norm = qk_norm(hd, config.rms_norm_eps, dtype)
        self.has_qk_norm = qk_norm is not None
        self.config = config

    def __call__(self, x, positions, cache: KVCache, layer: int, tree: TreeMask | None = None, packed=None):
        """x: [B, T, D]; positions: [B, T]. Returns ([B, T, D], cache with this layer written).
        `packed` (attention.Packed): x is the admitted tokens [1, N, D], positions the call's
        [B, T]; the products run on [1, N], attention on [B, T] (Packed's docstring)."""
        cfg = self.config
        mine = positions if packed is None else packed.gather(positions)  # [B, T] or [1, N]
        q = _project(self, "q_proj", x)  # [B, T, H, d_head]
        if cfg.attention_bias:
            q = q + self.q_bias[...]
        if self.has_qk_norm:
            q = self.q_norm(q)
        # The layer's rotary variant: Gemma 3 uses another base on its sliding layers.
        inv_freq, attention_factor = frequencies(cfg.resolved_head_dim, *cfg.layer_rope(layer))
        q = rotary(q, mine, inv_freq, attention_factor)
        k, v = self.keys_values(x, mine, layer)
        if cfg.query_pre_attn_scalar is not None:
            # attend divides scores by sqrt(d_head); Gemma divides them by sqrt(query_pre_attn_scalar).
            q = q * jnp.asarray((cfg.resolved_head_dim / cfg.query_pre_attn_scalar) ** 0.5, q.dtype)
        if packed is not None:
            q, k, v = packed.scatter(q), packed.scatter(k), packed.scatter(v)  # [B, T, heads, d_head]
        window, softcap = cfg.layer_window(layer), cfg.attn_logit_softcapping
        fixed = fixed_order(cfg)
        out, cache = attend(q, k, v, positions, cache, layer, tree, window=window, softcap=softcap, fixed=fixed)
        out = _project(self, "o_proj", out if packed is None else packed.gather(out))  # [B, T, D] or [1, N, D]
        if cfg.o_proj_bias:
            out = out + self.o_bias[...]
        return out, cache

    def keys_values(self, x, positions, layer: int):
        """x [B, T, D], positions [B, T] -> (k, v) [B, T, n_kv, d_head] as this layer caches
        them (biased, k normed and rotated). A DFlash-style block head projects the target's
        context features through it (models/block_net.py)."""
        cfg = self.config
        k = _project(self, "k_proj", x)  # [B, T, n_kv, d_head]
        v = _project(self, "v_proj", x)  # [B, T, n_kv, d_head]
        if cfg.attention_bias:
            k, v = k + self.k_bias[...], v + self.v_bias[...]
        if self.has_qk_norm:
            k = self.k_norm(k)
        inv_freq, attention_factor = frequencies(cfg.resolved_head_dim, *cfg.layer_rope(layer))
        return rotary(k, positions, inv_freq, attention_factor), v


class MLP(nnx.Module):
    """Gated MLP: down(act(gate(x)) * up(x)); subclasses change `act` (Gemma: GELU-tanh)."""

    act = staticmethod(jax.nn.silu)

    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs):
        d, f = config.hidden_size, config.intermediate_size
        _matrix(self, "gate_proj", rngs.params(), (d, f), dtype, config)
        _matrix(self, "up_proj", rngs.params(), (d, f), dtype, config)
        _matrix(self, "down_proj", rngs.params(), (f, d), dtype, config)
        if config.mlp_bias:
            self.gate_bias = nnx.Param(jnp.zeros((f,), dtype))
            self.up_bias = nnx.Param(jnp.zeros((f,), dtype))
            self.down_bias = nnx.Param(jnp.zeros((d,), dtype))
        self.bias = config.mlp_bias
        self.config = config

    def __call__(self, x):  # [B, T, D] -> [B, T, D]
        gate = _project(self, "gate_proj", x)
        up = _project(self, "up_proj", x)
        if self.bias:
            gate, up = gate + self.gate_bias[...], up + self.up_bias[...]
        out = _project(self, "down_proj", self.act(gate) * up)
        return out + self.down_bias[...] if self.bias else out


class Block(nnx.Module):
    """Pre-norm residual block; families differ only in the norm, attention and MLP they plug in.

    `post_attention_norm` is the norm in front of the MLP (HF Llama's post_attention_layernorm).
    `sandwich` (Gemma) adds a norm on each sub-layer's output before its residual add:
    `attn_out_norm` (HF Gemma's post_attention_layernorm) and `mlp_out_norm`.
    """

    def __init__(
        self, config: ModelConfig, dtype, rngs: nnx.Rngs, norm=RMSNorm, attention=None, mlp=None, sandwich=False
    ):
        d, eps = config.hidden_size, config.rms_norm_eps
        self.input_norm = norm(d, eps, dtype)
        self.attn = (attention or Attention)(config, dtype, rngs)
        self.post_attention_norm = norm(d, eps, dtype)
        self.mlp = (mlp or MLP)(config, dtype, rngs)
        if sandwich:
            self.attn_out_norm = norm(d, eps, dtype)
            self.mlp_out_norm = norm(d, eps, dtype)
        self.sandwich = sandwich

    def __call__(self, x, positions, cache: KVCache, layer: int, tree: TreeMask | None = None, packed=None):
        # `packed` only when given: GPT-2's attention, plugged into this block, takes none.
        attn = self.attn if packed is None else functools.partial(self.attn, packed=packed)
        h, cache = attn(self.input_norm(x), positions, cache, layer, tree)
        x = x + (self.attn_out_norm(h) if self.sandwich else h)
        h = self.mlp(self.post_attention_norm(x))
        return x + (self.mlp_out_norm(h) if self.sandwich else h), cache


def feature_layers(features, num_layers: int) -> tuple[int, ...] | None:
    """The layer selection in `features` (a bool, or layer indices), checked against a model
    of `num_layers` blocks: None for False/True (no features, or the final-norm state)."""
    if features is None or isinstance(features, bool):
        return None
    try:
        layers = tuple(features)
    except TypeError:
        raise ValueError(f"features must be a bool or a tuple of layer indices, got {features!r}") from None
    if not layers:
        raise ValueError("features=() selects no layer: pass False, True (the final-norm state) or layer indices")
    bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int | np.integer) or not 0 <= i < num_layers]
    if bad:
        raise ValueError(
            f"feature layers {bad} do not exist: the model has {num_layers} layers, indices 0..{num_layers - 1}"
        )
    if len(set(layers)) != len(layers):
        raise ValueError(f"feature layers {list(layers)} repeat an index")
    return tuple(int(i) for i in layers)


def feature_width(config: ModelConfig, features) -> int:
    """The last-axis width of the features `forward(..., features=features)` returns."""
    layers = feature_layers(features, config.num_hidden_layers)
    return config.hidden_size * (1 if layers is None else len(layers))


def decode(
    model: nnx.Module, x, positions, cache: KVCache, tree: TreeMask | None = None, features=False, head=None,
    packed=None,
):  # fmt: skip
    """The part every family shares: blocks, final norm, (tied) LM head, cache lengths.

    x: embedded tokens [B, T, D] -> (logits [B, T, V] float32, updated cache), plus with
    `features` hidden states (what draft heads such as Medusa and EAGLE are conditioned on;
    free, since they are computed anyway):
      True: the final-norm states the LM head reads, [B, T, D];
      layer indices (i0, i1, ..): the residual stream after each of those blocks (block i's
        output, before any final norm), concatenated in that order, [B, T, len * D]:
        EAGLE-3 reads a low, a middle and a high layer this way.
    `packed` (attention.Packed): x holds the admitted tokens [1, N, D]; the logits and
    features come back in the call's [B, T] layout, zeros at the tokens left out.
    """
    layers = feature_layers(features, len(model.layers))
    taken = {}  # layer -> [B, T, D]; only the selected ones are kept alive
    for layer, block in enumerate(model.layers):
        x, cache = (
            block(x, positions, cache, layer, tree)
            if packed is None
            else block(x, positions, cache, layer, tree, packed)
        )
        if layers is not None and layer in layers:
            taken[layer] = x
    x = model.final_norm(x)
    # `head`: another LM head on the final-norm states (a draft head borrowing an int8 target's).
    logits = (lm_head(model, x) if head is None else head(x)).astype(jnp.float32)
    cap = model.config.final_logit_softcapping
    if cap is not None:  # Gemma 2: squash the logits into (-cap, cap)
        logits = cap * jnp.tanh(logits / cap)
    # Every position written by this call now holds valid K/V. A tree call writes slots past
    # its positions, and which of them become committed is the caller's to say.
    if tree is None:
        cache = cache.replace(lengths=jnp.max(positions, axis=1).astype(jnp.int32) + 1)
    laid = (lambda a: a) if packed is None else packed.scatter  # back to [B, T, ...]
    if layers is not None:
        return laid(logits), cache, laid(jnp.concatenate([taken[i] for i in layers], axis=-1))  # [B, T, len * D]
    if features:
        return laid(logits), cache, laid(x)
    return laid(logits), cache


class Llama(nnx.Module):
    """The shared decoder. A family subclass overrides only these hooks:"""

    norm = RMSNorm  # every RMSNorm of the model
    qk_norm = None  # a norm over d_head of each q and k head, or None
    mlp = MLP  # the feed-forward of every block
    sandwich = False  # norms on the attention and MLP outputs too (Gemma)

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        dtype = jnp.dtype(config.dtype)
        _matrix(self, "embed", rngs.params(), (config.vocab_size, config.hidden_size), dtype, config)
        fixed = fixed_order(config)
        norm = functools.partial(self.norm, fixed=fixed)
        qk_norm = None if self.qk_norm is None else functools.partial(self.qk_norm, fixed=fixed)
        attention = functools.partial(Attention, qk_norm=qk_norm)
        self.layers = nnx.List(
            [
                Block(config, dtype, rngs, norm=norm, attention=attention, mlp=self.mlp, sandwich=self.sandwich)
                for _ in range(config.num_hidden_layers)
            ]
        )
        self.final_norm = norm(config.hidden_size, config.rms_norm_eps, dtype)
        if not config.tie_word_embeddings:
            _matrix(self, "lm_head", rngs.params(), (config.hidden_size, config.vocab_size), dtype, config)
        self.config = config

    def __call__(
        self, tokens, positions, cache: KVCache, tree: TreeMask | None = None, features=False, packed=None
    ):  # fmt: skip
        """tokens, positions: [B, T] int32 -> (logits [B, T, V] float32, updated cache[, features]);
        `features`: False, True or layer indices, as `decode` takes them; `packed`: the
        tokens to compute (attention.Packed), the others' logits zero."""
        if packed is None:
            return decode(self, self.embed_tokens(tokens), positions, cache, tree, features)
        return decode(self, self.embed_tokens(packed.gather(tokens)), positions, cache, tree, features, packed=packed)

    def embed_tokens(self, tokens):  # [B, T] -> [B, T, D]
        return embedding(self, tokens)
