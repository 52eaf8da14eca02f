"""What tensor parallelism costs: bytes each forward all-reduces, bytes each device holds,
and the TP efficiency and speculative speedup those imply for a given link.

The layout (layout.py) makes every forward of [B, T] tokens all-reduce activations of
[B, T, D] in the params' dtype: once after attention (o_proj rows are split), once after
the MLP (down_proj rows, or the MoE mixing sum), per layer, plus once after the embedding
lookup when the table is vocab-split. The vocab-split LM head adds reductions of [B, T]
float32 (max and sum for a softmax, or an argmax), counted apart: they are tiny.

A ring all-reduce moves 2 (M - 1) / M of its payload through each device's link, so
  t_TP(M) = t_1 / M + n_allreduce * latency + ring_bytes / link_bandwidth,
with t_1 the single-device time (measured, or the roofline's bytes / HBM bandwidth in
decoding, where a forward is bound by reading the weights). TP efficiency is
t_1 / (M * t_TP(M)): 1 when communication is free. Links are stated by the caller; the E10
bench (specjax/bench/experiments/e10_scaling.py) measures one on the devices it runs on.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from specjax.models import ModelConfig, init_params
from specjax.parallel.layout import expand_kv_heads, param_specs, plan, sharded_config
from specjax.parallel.mesh import MODEL


def tp_allreduce_bytes(config: ModelConfig, batch: int, width: int, model: int, dtype: str | None = None) -> dict:
    """All-reduces of one forward of [batch, width] tokens over a "model" axis of `model` devices.

    Returns counts and bytes: `payload_bytes` (what is summed), `ring_bytes_per_device`
    (what each device's link carries, 2 (M - 1) / M of it) and the LM head's small
    float32 reductions (`logits_reduce_bytes`).
    """
    if model == 1:
        return {
            "allreduces": 0,
            "bytes_per_allreduce": 0,
            "payload_bytes": 0,
            "ring_bytes_per_device": 0.0,
            "logits_reduce_bytes": 0,
        }
    p = plan(config, model)
    activation = batch * width * config.hidden_size * jnp.dtype(dtype or config.dtype).itemsize
    count = 2 * config.num_hidden_layers + (1 if p.shard_vocab else 0)
    payload = count * activation
    return {
        "allreduces": count,
        "bytes_per_allreduce": activation,
        "payload_bytes": payload,
        "ring_bytes_per_device": 2 * (model - 1) / model * payload,
        "logits_reduce_bytes": 2 * batch * width * 4 if p.shard_vocab else 0,
    }


def per_device_bytes(config: ModelConfig, data: int, model: int, batch: int, context: int, cache_dtype=None) -> dict:
    """Weights and KV cache each device holds on a (data, model) mesh, from the layout itself.

    batch rows are split over "data" (rounded up), kv heads over "model" after GQA
    replication; params are replicated over "data".
    """
    p = plan(config, model)
    shapes = jax.eval_shape(lambda: expand_kv_heads(init_params(config, 0), p.kv_repeat))
    specs = param_specs(shapes, p)
    sizes = jax.tree.map(
        lambda x, spec: math.prod(x.shape) * x.dtype.itemsize // (model if MODEL in tuple(spec) else 1), shapes, specs
    )
    weights = sum(jax.tree.leaves(sizes))
    cfg = sharded_config(config, p)
    rows = -(-batch // data)
    item = jnp.dtype(cache_dtype or config.dtype).itemsize
    kv = 2 * cfg.num_hidden_layers * rows * context * (cfg.num_key_value_heads // model) * cfg.resolved_head_dim * item
    return {"weight_bytes": weights, "kv_cache_bytes": kv, "total_bytes": weights + kv, "kv_repeat": p.kv_repeat}


def decode_forward_bytes(config: ModelConfig, batch: int, context: int) -> int:
    """Bytes one decoding forward streams on one device: all weights plus the KV cache."""
    return per_device_bytes(config, 1, 1, batch, context)["total_bytes"]


def tp_forward_seconds(
    seconds_one_device: float,
    config: ModelConfig,
    batch: int,
    width: int,
    model: int,
    link_bytes_per_second: float,
    latency_seconds: float = 10e-6,
) -> float:
    """t_1 / M + the forward's all-reduces over a ring of M devices (see the module docstring)."""
    comm = tp_allreduce_bytes(config, batch, width, model)
    return (
        seconds_one_device / model
        + comm["allreduces"] * latency_seconds
        + comm["ring_bytes_per_device"] / link_bytes_per_second
    )


def tp_efficiency(seconds_one_device: float, seconds_tp: float, model: int) -> float:
    """t_1 / (M t_M): the fraction of perfect M-way scaling a forward achieves."""
    return seconds_one_device / (model * seconds_tp)


def predict_tp_speculative(
    target: ModelConfig,
    draft: ModelConfig,
    model: int,
    batch: int,
    k: int,
    context: int,
    tokens_per_round: float,
    hbm_bytes_per_second: float,
    link_bytes_per_second: float,
    latency_seconds: float = 10e-6,
    draft_layout: str = "replicated",
    catch_up: int = 2,
) -> dict:
    """Predicted plain and speculative decoding on an M-way TP mesh, weights-bound (decode) regime.

    Single-device forward times are bytes streamed / HBM bandwidth (the roofline of a
    decoding forward); TP adds the all-reduces. The draft runs replicated (no
    communication, no speed-up from M) or tensor-parallel like the target. A round is the
    draft's catch-up of width `catch_up` plus K - 1 single steps, then one verify of K + 1.
    """

    def seconds(cfg, width, tp):
        one = decode_forward_bytes(cfg, batch, context) / hbm_bytes_per_second
        if not tp or model == 1:
            return one
        return tp_forward_seconds(one, cfg, batch, width, model, link_bytes_per_second, latency_seconds)

    draft_tp = draft_layout == "sharded"
    plain_1 = seconds(target, 1, False)
    plain = seconds(target, 1, True)
    draft_seconds = seconds(draft, catch_up, draft_tp) + (k - 1) * seconds(draft, 1, draft_tp)
    round_seconds = draft_seconds + seconds(target, k + 1, True)
    return {
        "model": model,
        "plain_step_seconds": plain,
        "tp_efficiency": tp_efficiency(plain_1, plain, model),
        "round_seconds": round_seconds,
        "draft_share": draft_seconds / round_seconds,
        "speculative_speedup": tokens_per_round * plain / round_seconds,
        "plain_tokens_per_second_per_row": 1 / plain,
        "speculative_tokens_per_second_per_row": tokens_per_round / round_seconds,
    }
