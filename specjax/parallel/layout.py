"""Where every param, cache and state array lives on a ("data", "model") mesh.

The layout is Megatron's tensor parallelism, written as PartitionSpecs; the SPMD
partitioner derives the communication from them:
  q/k/v kernels [D, heads, d_head]: heads over "model" (each device owns whole heads);
  o_proj [heads, d_head, D]: rows (heads) over "model", so attention costs one all-reduce;
  gate/up [D, F]: F over "model"; down [F, D]: rows over "model" (one all-reduce per MLP);
  MoE experts [E, D, F]: the experts axis over "model" when E divides (each device runs its
  experts, the mixing einsum is the all-reduce), else F as for a dense MLP;
  lm_head [D, V]: the vocabulary over "model" (the logits come out vocab-sharded; argmax
  and softmax reduce across devices);
  embed [V, D]: the vocabulary over "model" too. With tied weights it *is* the LM head, and
  untied it is the largest replicated tensor otherwise (1 GiB of a 7B in bf16); a lookup
  in a vocab-sharded table costs one all-reduce of [B, T, D], the size of one layer's.
  A vocabulary the "model" axis does not divide (GPT-2's 50257) is replicated instead.
  Norms, biases on D, routers, position tables: replicated (tiny).
KV caches [layers, B, S, n_kv, d_head]: rows over "data", kv heads over "model"; token
buffers and per-row state [B, ...]: rows over "data". Params are replicated over "data".

GQA with fewer kv heads than the "model" axis (Llama-3-8B: 8 kv heads on 16 devices):
each kv head is repeated r = model / n_kv times in k_proj/v_proj (and their biases), and
the config says n_kv * r heads. Query head h still reads original kv head h // G, so the
outputs are unchanged; every device then holds exactly the one kv head its query heads
need, as vLLM does, and the cache per device is that of one head, not all n_kv.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from specjax.models import ModelConfig
from specjax.parallel.mesh import DATA, MODEL


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a model of a given config is split over a "model" axis of `model` devices."""

    model: int  # size of the "model" axis
    kv_repeat: int  # each kv head is stored this many times (1: no GQA replication)
    shard_vocab: bool  # embed and lm_head are split over the vocabulary
    moe_axis: str | None  # "experts" or "hidden" for MoE models, None for dense ones


def plan(config: ModelConfig, model: int) -> Plan:
    """Check that `config` can be split `model` ways; raise ValueError naming the numbers if not."""
    h, kv = config.num_attention_heads, config.num_key_value_heads
    if h % model:
        raise ValueError(
            f"a 'model' mesh axis of {model} devices needs num_attention_heads divisible by {model}, "
            f"but this model has {h} heads; use a model axis that divides {h}"
        )
    if kv % model == 0:
        repeat = 1
    elif model % kv == 0:
        repeat = model // kv
    else:
        raise ValueError(
            f"a 'model' mesh axis of {model} devices cannot split {kv} kv heads: {model} must divide {kv} "
            f"or be a multiple of it (kv heads are then replicated {model}/{kv} ways)"
        )
    moe_axis = None
    f = config.intermediate_size
    if config.num_experts:
        if config.num_experts % model == 0:
            moe_axis = "experts"
        elif f % model == 0:
            moe_axis = "hidden"
        else:
            raise ValueError(
                f"a 'model' mesh axis of {model} devices divides neither the {config.num_experts} experts nor "
                f"their intermediate_size {f}"
            )
    elif f % model:
        raise ValueError(
            f"a 'model' mesh axis of {model} devices needs intermediate_size divisible by {model}, got {f}"
        )
    return Plan(model=model, kv_repeat=repeat, shard_vocab=config.vocab_size % model == 0, moe_axis=moe_axis)


def sharded_config(config: ModelConfig, p: Plan) -> ModelConfig:
    """The config the sharded params run with: n_kv * kv_repeat kv heads (see the module docstring)."""
    if p.kv_repeat == 1:
        return config
    return dataclasses.replace(config, num_key_value_heads=config.num_key_value_heads * p.kv_repeat)


def param_spec(path: tuple[str, ...], shape: tuple[int, ...], p: Plan) -> P:
    """The PartitionSpec of one param, from its path in the params dict and its shape.

    Unknown names are replicated, so params of draft heads sharded with the same function
    stay correct, only not split.
    """
    name = path[-1]
    vocab = MODEL if p.shard_vocab else None
    if name == "embed":
        return P(vocab, None)
    if name == "lm_head":
        return P(None, vocab)
    parent = path[-2] if len(path) > 1 else ""
    if parent == "attn":
        if name in ("q_proj", "k_proj", "v_proj"):
            return P(None, MODEL, None)
        if name in ("q_bias", "k_bias", "v_bias"):
            return P(MODEL, None)
        if name == "o_proj":
            return P(MODEL, None, None)
    if parent == "mlp":
        if len(shape) == 3:  # MoE experts [E, D, F] / [E, F, D]
            if p.moe_axis == "experts":
                return P(MODEL, None, None)
            return P(None, None, MODEL) if name != "down_proj" else P(None, MODEL, None)
        if name in ("gate_proj", "up_proj"):
            return P(None, MODEL)
        if name in ("gate_bias", "up_bias"):
            return P(MODEL)
        if name == "down_proj":
            return P(MODEL, None)
    return P()


def _fits(spec: P, shape: tuple[int, ...], model: int) -> P:
    """`spec`, or replication if a dimension it splits is not divisible (a head with odd shapes)."""
    if len(spec) > len(shape):
        return P()
    for dim, axis in zip(shape, spec, strict=False):
        if axis is not None and dim % model:
            return P()
    return spec


def _key(entry) -> str:
    return str(getattr(entry, "key", getattr(entry, "idx", entry)))


def param_specs(params, p: Plan):
    """A pytree of PartitionSpecs matching `params` (arrays or ShapeDtypeStructs)."""

    def spec(path, x):
        keys = tuple(_key(k) for k in path)
        return _fits(param_spec(keys, tuple(x.shape), p), tuple(x.shape), p.model)

    return jax.tree_util.tree_map_with_path(spec, params)


def param_shardings(params, mesh: Mesh, p: Plan):
    """NamedShardings matching `params` on `mesh`."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(params, p))


def expand_kv_heads(params, repeat: int):
    """Repeat every kv head `repeat` times in k_proj/v_proj [D, n_kv, d] and k_bias/v_bias [n_kv, d]."""
    if repeat == 1:
        return params

    def expand(path, x):
        keys = tuple(_key(k) for k in path)
        if len(keys) > 1 and keys[-2] == "attn":
            if keys[-1] in ("k_proj", "v_proj"):
                return jnp.repeat(x, repeat, axis=1)
            if keys[-1] in ("k_bias", "v_bias"):
                return jnp.repeat(x, repeat, axis=0)
        return x

    return jax.tree_util.tree_map_with_path(expand, params)


# Caches and per-row state: rows over "data", kv heads over "model".
CACHE_KV = P(None, DATA, None, MODEL, None)  # k, v [layers, B, S, n_kv, d_head]
ROWS = P(DATA)  # [B] per-row state (lengths, done, counters)
ROW_TOKENS = P(DATA, None)  # [B, S] token buffers, [B, T] prompts
