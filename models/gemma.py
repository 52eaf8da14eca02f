"""Gemma 2 and Gemma 3 (text): the shared decoder with Gemma's norms, MLP and embedding.

What differs from Llama, and where it lives:
  here:      RMSNorm scaling by (1 + weight) (weights stored as HF stores them, init 0);
             the GELU-tanh gated MLP; embeddings scaled by sqrt(hidden_size); sandwich
             norms (Block(sandwich=True): a norm on each sub-layer's output as well);
             Gemma 3's q/k norm.
  config:    query_pre_attn_scalar (the score scale), attn_logit_softcapping and
             final_logit_softcapping (Gemma 2), the local/global `layer_types` with their
             `sliding_window`, and Gemma 3's local rotary base (rope_local_base_freq);
             llama.Attention, attention.attend and llama.decode apply them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from .llama import MLP, Llama, embedding, mean_square


class GemmaRMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype, fixed: bool = False):
        # HF's weight w, the norm multiplying by (1 + w): zeros are the identity scale.
        self.scale = nnx.Param(jnp.zeros((dim,), dtype))
        self.eps = eps
        self.fixed = fixed  # the mean in a fixed order (llama.RMSNorm)

    def __call__(self, x):  # [..., D]
        # float32 throughout, cast once at the end (HF Gemma: (x * (1 + w)).to(dtype)).
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(mean_square(x32, self.fixed) + self.eps)
        return (x32 * (1.0 + self.scale.astype(jnp.float32))).astype(x.dtype)


class GeluMLP(MLP):
    # HF "gelu_pytorch_tanh": the tanh approximation of GELU.
    act = staticmethod(functools.partial(jax.nn.gelu, approximate=True))


class Gemma2(Llama):
    norm = GemmaRMSNorm
    mlp = GeluMLP
    sandwich = True

    def embed_tokens(self, tokens):  # [B, T] -> [B, T, D]
        # sqrt(hidden_size) in the params' dtype, as HF rounds it (55.5, not 55.43, in bfloat16).
        x = embedding(self, tokens)  # the params' dtype in float32 format; float32 in the others
        return x * jnp.asarray(self.config.hidden_size**0.5, x.dtype)


class Gemma3(Gemma2):
    qk_norm = GemmaRMSNorm
