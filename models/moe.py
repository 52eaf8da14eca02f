"""Top-k mixture-of-experts MLP (Mixtral, Qwen3-MoE) in a static-shape formulation.

The router matches transformers: softmax over the experts in float32, the top k
probabilities, renormalised to sum to 1 when `norm_topk_prob` (always for Mixtral). Ties
go to the lower expert index (jax.lax.top_k); exactly k experts are picked even when
probabilities tie at the k-th place.

Formulation: every expert runs on every token, and a [B, T, E] weight matrix that is zero
outside each token's top k mixes their outputs. Shapes stay static and the program has no
gather, scatter or capacity to tune, at the price of E / k times the MLP FLOPs of a
sparse dispatch (4x for Mixtral's 8 experts, top 2; 16x for Qwen3-MoE's 128, top 8) and a
[B, T, E, F] activation. In decoding (T = 1 to K + 1 tokens per row) the MLP is bound by
reading the expert weights, which a batch touches nearly all of anyway; a prefill pays
the FLOPs. Every expert tensor has the experts axis first ([E, D, F], [E, F, D]), the
natural axis to shard over a mesh: each device then runs its own experts and the mixing
einsum becomes a sum across devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .config import ModelConfig
from .llama import Llama

_init = nnx.initializers.normal(stddev=0.02)


class MoE(nnx.Module):
    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs):
        d, f, e = config.hidden_size, config.intermediate_size, config.num_experts
        self.router = nnx.Param(_init(rngs.params(), (d, e), dtype))
        self.gate_proj = nnx.Param(_init(rngs.params(), (e, d, f), dtype))
        self.up_proj = nnx.Param(_init(rngs.params(), (e, d, f), dtype))
        self.down_proj = nnx.Param(_init(rngs.params(), (e, f, d), dtype))
        self.config = config

    def routing(self, x):
        """x [B, T, D] -> mixing weights [B, T, E] float32, nonzero on each token's top k."""
        cfg = self.config
        router_logits = jnp.einsum("btd,de->bte", x, self.router[...])
        probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
        top, experts = jax.lax.top_k(probs, cfg.num_experts_per_tok)  # [B, T, k]
        if cfg.norm_topk_prob:
            top = top / jnp.sum(top, axis=-1, keepdims=True)
        # A one-hot per pick, not a threshold on the k-th probability: a tie there must
        # still select exactly k experts.
        picked = jax.nn.one_hot(experts, cfg.num_experts, dtype=jnp.float32)  # [B, T, k, E]
        return jnp.einsum("btke,btk->bte", picked, top)

    def __call__(self, x):  # [B, T, D] -> [B, T, D]
        weights = self.routing(x).astype(x.dtype)  # [B, T, E]
        gate = jnp.einsum("btd,edf->btef", x, self.gate_proj[...])  # [B, T, E, F]
        up = jnp.einsum("btd,edf->btef", x, self.up_proj[...])
        out = jnp.einsum("btef,efd->bted", jax.nn.silu(gate) * up, self.down_proj[...])  # [B, T, E, D]
        return jnp.einsum("bted,bte->btd", out, weights)


class Mixtral(Llama):
    mlp = MoE
