"""A Llama-family decoder (Llama, Mistral, Qwen2) as a Flax NNX module.

The module is only ever used functionally, through `specjax.models.forward`, which
merges a cached graph definition with a plain params pytree, so the same code serves
prefill (T = prompt length), drafting (T = 1 or 2) and verification (T = K + 1), for the
draft and for the target. `attend` (attention.py) is the cache write + attention every
family shares.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .attention import TreeMask, attend
from .cache import KVCache
from .config import ModelConfig

_init = nnx.initializers.normal(stddev=0.02)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype):
        self.scale = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    def __call__(self, x):  # [..., D]
        # Normalise in float32 whatever the parameter dtype, as HF does.
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (x32 * self.scale.astype(jnp.float32)).astype(x.dtype)


def rotary(x, positions, theta: float):
    """Rotate-half rotary embedding (HF convention), computed in float32.

    x: [B, T, heads, d_head]; positions: [B, T] absolute positions of the tokens.
    """
    d_half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (jnp.arange(0, d_half, dtype=jnp.float32) * 2 / x.shape[-1]))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, d_half]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs):
        d, hd = config.hidden_size, config.resolved_head_dim
        h, kv = config.num_attention_heads, config.num_key_value_heads
        self.q_proj = nnx.Param(_init(rngs.params(), (d, h, hd), dtype))
        self.k_proj = nnx.Param(_init(rngs.params(), (d, kv, hd), dtype))
        self.v_proj = nnx.Param(_init(rngs.params(), (d, kv, hd), dtype))
        self.o_proj = nnx.Param(_init(rngs.params(), (h, hd, d), dtype))
        if config.attention_bias:
            self.q_bias = nnx.Param(jnp.zeros((h, hd), dtype))
            self.k_bias = nnx.Param(jnp.zeros((kv, hd), dtype))
            self.v_bias = nnx.Param(jnp.zeros((kv, hd), dtype))
        if config.o_proj_bias:
            self.o_bias = nnx.Param(jnp.zeros((d,), dtype))
        self.config = config

    def __call__(self, x, positions, cache: KVCache, layer: int, tree: TreeMask | None = None):
        """x: [B, T, D]; positions: [B, T]. Returns ([B, T, D], cache with this layer written)."""
        cfg = self.config
        q = jnp.einsum("btd,dhk->bthk", x, self.q_proj[...])  # [B, T, H, d_head]
        k = jnp.einsum("btd,dgk->btgk", x, self.k_proj[...])  # [B, T, n_kv, d_head]
        v = jnp.einsum("btd,dgk->btgk", x, self.v_proj[...])  # [B, T, n_kv, d_head]
        if cfg.attention_bias:
            q, k, v = q + self.q_bias[...], k + self.k_bias[...], v + self.v_bias[...]
        q = rotary(q, positions, cfg.rope_theta)
        k = rotary(k, positions, cfg.rope_theta)
        out, cache = attend(q, k, v, positions, cache, layer, tree)
        out = jnp.einsum("bthk,hkd->btd", out, self.o_proj[...])  # [B, T, D]
        if cfg.o_proj_bias:
            out = out + self.o_bias[...]
        return out, cache


class MLP(nnx.Module):
    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs):
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nnx.Param(_init(rngs.params(), (d, f), dtype))
        self.up_proj = nnx.Param(_init(rngs.params(), (d, f), dtype))
        self.down_proj = nnx.Param(_init(rngs.params(), (f, d), dtype))
        if config.mlp_bias:
            self.gate_bias = nnx.Param(jnp.zeros((f,), dtype))
            self.up_bias = nnx.Param(jnp.zeros((f,), dtype))
            self.down_bias = nnx.Param(jnp.zeros((d,), dtype))
        self.bias = config.mlp_bias

    def __call__(self, x):  # [B, T, D] -> [B, T, D]
        gate = jnp.einsum("btd,df->btf", x, self.gate_proj[...])
        up = jnp.einsum("btd,df->btf", x, self.up_proj[...])
        if self.bias:
            gate, up = gate + self.gate_bias[...], up + self.up_bias[...]
        out = jnp.einsum("btf,fd->btd", jax.nn.silu(gate) * up, self.down_proj[...])
        return out + self.down_bias[...] if self.bias else out


class Block(nnx.Module):
    """Pre-norm residual block; families differ only in the norm, attention and MLP they plug in."""

    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs, norm=RMSNorm, attention=None, mlp=None):
        self.input_norm = norm(config.hidden_size, config.rms_norm_eps, dtype)
        self.attn = (attention or Attention)(config, dtype, rngs)
        self.post_attention_norm = norm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = (mlp or MLP)(config, dtype, rngs)

    def __call__(self, x, positions, cache: KVCache, layer: int, tree: TreeMask | None = None):
        h, cache = self.attn(self.input_norm(x), positions, cache, layer, tree)
        x = x + h
        return x + self.mlp(self.post_attention_norm(x)), cache


def decode(model: nnx.Module, x, positions, cache: KVCache, tree: TreeMask | None = None, features: bool = False):
    """The part every family shares: blocks, final norm, (tied) LM head, cache lengths.

    x: embedded tokens [B, T, D] -> (logits [B, T, V] float32, updated cache), plus with
    `features` the final-norm hidden states [B, T, D] the LM head reads (what draft heads
    such as Medusa and EAGLE are conditioned on; free, since they are computed anyway).
    """
    for layer, block in enumerate(model.layers):
        x, cache = block(x, positions, cache, layer, tree)
    x = model.final_norm(x)
    if model.config.tie_word_embeddings:
        logits = jnp.einsum("btd,vd->btv", x, model.embed[...])
    else:
        logits = jnp.einsum("btd,dv->btv", x, model.lm_head[...])
    # Every position written by this call now holds valid K/V. A tree call writes slots past
    # its positions, and which of them become committed is the caller's to say.
    if tree is None:
        cache = cache.replace(lengths=jnp.max(positions, axis=1).astype(jnp.int32) + 1)
    if features:
        return logits.astype(jnp.float32), cache, x
    return logits.astype(jnp.float32), cache


class Llama(nnx.Module):
    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        dtype = jnp.dtype(config.dtype)
        self.embed = nnx.Param(_init(rngs.params(), (config.vocab_size, config.hidden_size), dtype))
        self.layers = nnx.List([Block(config, dtype, rngs) for _ in range(config.num_hidden_layers)])
        self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        if not config.tie_word_embeddings:
            self.lm_head = nnx.Param(_init(rngs.params(), (config.hidden_size, config.vocab_size), dtype))
        self.config = config

    def __call__(self, tokens, positions, cache: KVCache, tree: TreeMask | None = None, features: bool = False):
        """tokens, positions: [B, T] int32 -> (logits [B, T, V] float32, updated cache)."""
        return decode(self, self.embed[...][tokens], positions, cache, tree, features)
