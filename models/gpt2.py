"""GPT-2 as a Flax NNX module, with the same functional contract as models/llama.py.

Pre-LayerNorm blocks with biases everywhere, learned absolute position embeddings, a
tanh-approximated GELU MLP, multi-head attention (n_kv = H). It writes and reads the
shared KVCache exactly as the Llama family does (`attend`), so the speculative engine
needs to know nothing about which family it runs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .attention import TreeMask, attend
from .cache import KVCache
from .config import ModelConfig
from .llama import Block, decode

_init = nnx.initializers.normal(stddev=0.02)


class LayerNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype):
        self.scale = nnx.Param(jnp.ones((dim,), dtype))
        self.bias = nnx.Param(jnp.zeros((dim,), dtype))
        self.eps = eps

    def __call__(self, x):  # [..., D]
        # Statistics in float32 whatever the parameter dtype, as torch's LayerNorm does.
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        return (y * self.scale.astype(jnp.float32) + self.bias.astype(jnp.float32)).astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs):
        d, h, hd = config.hidden_size, config.num_attention_heads, config.resolved_head_dim
        # HF fuses q, k, v into one Conv1D (`c_attn`); they are split at load time so the
        # cache receives k and v in the same layout as every other family.
        self.q_proj = nnx.Param(_init(rngs.params(), (d, h, hd), dtype))
        self.k_proj = nnx.Param(_init(rngs.params(), (d, h, hd), dtype))
        self.v_proj = nnx.Param(_init(rngs.params(), (d, h, hd), dtype))
        self.q_bias = nnx.Param(jnp.zeros((h, hd), dtype))
        self.k_bias = nnx.Param(jnp.zeros((h, hd), dtype))
        self.v_bias = nnx.Param(jnp.zeros((h, hd), dtype))
        self.o_proj = nnx.Param(_init(rngs.params(), (h, hd, d), dtype))
        self.o_bias = nnx.Param(jnp.zeros((d,), dtype))

    def __call__(self, x, positions, cache: KVCache, layer: int, tree: TreeMask | None = None):
        """x: [B, T, D]; positions: [B, T]. Returns ([B, T, D], cache with this layer written)."""
        q = jnp.einsum("btd,dhk->bthk", x, self.q_proj[...]) + self.q_bias[...]  # [B, T, H, d_head]
        k = jnp.einsum("btd,dhk->bthk", x, self.k_proj[...]) + self.k_bias[...]  # [B, T, H, d_head]
        v = jnp.einsum("btd,dhk->bthk", x, self.v_proj[...]) + self.v_bias[...]  # [B, T, H, d_head]
        out, cache = attend(q, k, v, positions, cache, layer, tree)
        return jnp.einsum("bthk,hkd->btd", out, self.o_proj[...]) + self.o_bias[...], cache


class MLP(nnx.Module):
    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs):
        d, f = config.hidden_size, config.intermediate_size
        self.up_proj = nnx.Param(_init(rngs.params(), (d, f), dtype))
        self.up_bias = nnx.Param(jnp.zeros((f,), dtype))
        self.down_proj = nnx.Param(_init(rngs.params(), (f, d), dtype))
        self.down_bias = nnx.Param(jnp.zeros((d,), dtype))

    def __call__(self, x):  # [B, T, D] -> [B, T, D]
        # HF "gelu_new": the tanh approximation of GELU.
        h = jax.nn.gelu(jnp.einsum("btd,df->btf", x, self.up_proj[...]) + self.up_bias[...], approximate=True)
        return jnp.einsum("btf,fd->btd", h, self.down_proj[...]) + self.down_bias[...]


class GPT2(nnx.Module):
    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        dtype = jnp.dtype(config.dtype)
        d = config.hidden_size
        self.embed = nnx.Param(_init(rngs.params(), (config.vocab_size, d), dtype))
        self.position_embed = nnx.Param(_init(rngs.params(), (config.max_position_embeddings, d), dtype))
        self.layers = nnx.List(
            [
                Block(config, dtype, rngs, norm=LayerNorm, attention=Attention, mlp=MLP)
                for _ in range(config.num_hidden_layers)
            ]
        )
        self.final_norm = LayerNorm(d, config.rms_norm_eps, dtype)
        if not config.tie_word_embeddings:
            self.lm_head = nnx.Param(_init(rngs.params(), (d, config.vocab_size), dtype))
        self.config = config

    def __call__(self, tokens, positions, cache: KVCache, tree: TreeMask | None = None, features=False):
        """tokens, positions: [B, T] int32 -> (logits [B, T, V] float32, updated cache[, features]);
        `features`: False, True or layer indices, as llama.decode takes them."""
        # Padding slots of a prompt bucket may lie past the learned table: clip them. Their
        # K/V is never visible (see KVCache), and real positions are checked by callers.
        pos = jnp.take(self.position_embed[...], positions, axis=0, mode="clip")  # [B, T, D]
        return decode(self, self.embed[...][tokens] + pos, positions, cache, tree, features)
