"""The cost model: what one forward costs, what it moves, and what a round should yield.

Measured: the wall time of one forward of width w (w tokens per row, the verify width is
K + 1) on a cache of a given length. Estimated analytically: the bytes a forward must
stream (the weights once, plus every row's KV cache) and its FLOPs, whose ratio is the
arithmetic intensity. Predicted: tokens per round from per-position acceptance, and the
speedup of speculative over plain decoding from the measured costs.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from specjax.models import ModelConfig, forward, init_cache

from specjax.bench.timing import interleaved, median, timed
from specjax.drafters import Drafter, as_drafter
from specjax.engine.acceptance import greedy_rule
from specjax.engine.decode import DecodeState, decode_step
from specjax.engine.decode import init_state as decode_init
from specjax.engine.sampling import SamplingConfig
from specjax.engine.speculative import SpecPlan, SpecState, speculative_round
from specjax.engine.speculative import init_state as spec_init
from specjax.io.model import Model

# Tables read by gathering a few rows, not streamed whole through a matrix product.
_LOOKUP_TABLES = ("embed", "position_embed")


def _itemsize(config: ModelConfig) -> int:
    return jnp.dtype(config.dtype).itemsize


def _head_dim(config: ModelConfig) -> int:
    return config.head_dim or config.hidden_size // config.num_attention_heads


def matmul_parameters(model: Model) -> int:
    """Parameters a forward multiplies by: all but lookup tables, plus a tied LM head."""
    sizes = {name: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(sub)) for name, sub in model.params.items()}
    total = sum(size for name, size in sizes.items() if name not in _LOOKUP_TABLES)
    if "lm_head" not in sizes:  # tied: the embedding table is the output projection
        total += model.config.vocab_size * model.config.hidden_size
    return total


def kv_cache_bytes(config: ModelConfig, batch: int, context: int) -> int:
    """2 (K and V) * layers * context * n_kv * d_head * bytes, per row, times rows."""
    kv_heads = config.num_attention_heads if config.model_type == "gpt2" else config.num_key_value_heads
    return 2 * config.num_hidden_layers * context * kv_heads * _head_dim(config) * _itemsize(config) * batch


def forward_estimate(model: Model, batch: int, width: int, context: int) -> dict:
    """FLOPs, bytes moved and arithmetic intensity of one forward of [batch, width] tokens.

    Attention here reads every slot of the static cache (masked), so its cost follows
    the cache length `context`, not the number of filled slots.
    """
    config = model.config
    tokens = batch * width
    weight_bytes = matmul_parameters(model) * _itemsize(config)
    kv_bytes = kv_cache_bytes(config, batch, context)
    # 2 FLOPs per multiply-add; attention: q.k and p.v over `context` slots for every head.
    attention = 4 * config.num_hidden_layers * tokens * context * config.num_attention_heads * _head_dim(config)
    flops = 2 * matmul_parameters(model) * tokens + attention
    moved = weight_bytes + kv_bytes
    return {
        "flops": flops,
        "weight_bytes": weight_bytes,
        "kv_cache_bytes": kv_bytes,
        "bytes_moved": moved,
        "arithmetic_intensity": flops / moved,
    }


@functools.partial(jax.jit, static_argnames=("config", "inner"), donate_argnums=3)
def _forwards(config: ModelConfig, params, tokens, cache, positions, inner: int):
    """`inner` dependent forwards of tokens [B, w] at positions [B, w] (each reads the cache the last wrote)."""

    def body_fn(_, carry):
        cache, checksum = carry
        logits, cache = forward(config, params, tokens, positions, cache)
        # Consuming the logits keeps XLA from dropping the LM head as dead code.
        return cache, checksum + logits[:, -1, 0].astype(jnp.float32)

    return jax.lax.fori_loop(0, inner, body_fn, (cache, jnp.zeros(tokens.shape[0], jnp.float32)))


@functools.partial(jax.jit, static_argnames=("config", "inner"), donate_argnums=1)
def _decode_steps(params, state: DecodeState, config: ModelConfig, inner: int):
    def body_fn(_, s):
        # Rewind after each step: the same slots are rewritten, so any number of steps fits the cache.
        return decode_step(config, _GREEDY, params, s).replace(lengths=state.lengths, done=state.done)

    return jax.lax.fori_loop(0, inner, body_fn, state)


@functools.partial(jax.jit, static_argnames=("inner",), donate_argnums=2)
def _rounds(target_params, draft_weights, state: SpecState, inner: int):
    def body_fn(_, s):
        return speculative_round(target_params, draft_weights, s).replace(lengths=state.lengths, done=state.done)

    return jax.lax.fori_loop(0, inner, body_fn, state)


_GREEDY = SamplingConfig(0.0)


def _iteration_key(target: Model, draft: Model | Drafter | None, batch: int, k: int, context: int) -> tuple:
    if draft is None:
        return ("iteration", id(target.params), None, batch, k, context)
    drafter = as_drafter(draft)
    weights = jax.tree.leaves(drafter.weights())
    return ("iteration", id(target.params), drafter.without_weights(), *map(id, weights), batch, k, context)


class CostTable:
    """Measured seconds per forward or per loop iteration, memoised by shape."""

    def __init__(self, inner: int, repeats: int):
        self.inner, self.repeats = inner, repeats
        self._seconds: dict[tuple, float] = {}

    def iteration_seconds(self, target: Model, draft: Model | None, batch: int, k: int, context: int) -> float:
        """One iteration of the generation loop exactly as it runs: a plain decode step
        (draft None) or a speculative round of K. Everything counts (draft steps, verify,
        acceptance, commit, per-op dispatch), and nothing depends on acceptance: shapes
        are static, so a round costs the same whether it accepts 0 or K drafts."""
        key = _iteration_key(target, draft, batch, k, context)
        if key not in self._seconds:
            self.measure_iterations([(target, draft, batch, k, context)])
        return self._seconds[key]

    def measure_iterations(self, shapes: list[tuple]) -> None:
        """Time many (target, draft | None, batch, K, context) iterations round-robin.

        A shared machine drifts over minutes; timing the configurations of one experiment
        in turn, as the end-to-end runs are, keeps their ratios honest.
        """
        calls = {_iteration_key(*shape): self._iteration_call(*shape) for shape in shapes}
        calls = {key: call for key, call in calls.items() if key not in self._seconds}
        times = interleaved(calls, self.repeats, warmup=1)
        self._seconds.update({key: median(t) / self.inner for key, t in times.items()})

    def _iteration_call(self, target: Model, draft: Model | Drafter | None, batch: int, k: int, context: int):
        prompt_length = context // 2  # the middle of the cache: the mask reads every slot anyway
        prompt = jnp.ones((batch, prompt_length), jnp.int32)
        lengths = jnp.full((batch,), prompt_length, jnp.int32)
        args = (prompt, lengths, jnp.int32(context), jnp.int32(-1), jax.random.key(0))
        if draft is None:
            state = jax.jit(decode_init, static_argnums=(6, 7))(target.params, *args, target.config, context)
        else:
            drafter = as_drafter(draft)
            weights = drafter.weights()
            plan = SpecPlan(target.config, drafter.without_weights(), k, _GREEDY, greedy_rule)
            state = jax.jit(spec_init, static_argnums=(7, 8))(target.params, weights, *args, plan, context)

        def call():
            nonlocal state
            if draft is None:
                state = _decode_steps(target.params, state, target.config, self.inner)
            else:
                state = _rounds(target.params, weights, state, self.inner)
            return state.tokens

        return call

    def seconds(self, model: Model, batch: int, width: int, context: int) -> float:
        key = (id(model.params), model.config, batch, width, context)
        if key not in self._seconds:
            self._seconds[key] = self._measure(model, batch, width, context)
        return self._seconds[key]

    def _measure(self, model: Model, batch: int, width: int, context: int) -> float:
        if width > context:
            raise ValueError(f"a forward of width {width} does not fit a cache of {context} slots")
        tokens = jnp.ones((batch, width), jnp.int32)
        # The last `width` slots: the widest attention this cache length allows.
        positions = jnp.broadcast_to(jnp.arange(context - width, context, dtype=jnp.int32), (batch, width))
        cache = init_cache(model.config, batch, context).replace(lengths=jnp.full((batch,), context - width))

        def call():
            nonlocal cache
            cache, checksum = _forwards(model.config, model.params, tokens, cache, positions, self.inner)
            return checksum

        jax.block_until_ready(call())  # compile
        return median([timed(call) for _ in range(self.repeats)]) / self.inner


def expected_tokens_per_round(per_position: Sequence[float], k: int) -> float:
    """1 + a_1 + a_1 a_2 + ... + a_1...a_K with measured conditional acceptances a_i."""
    if k > len(per_position):
        raise ValueError(f"per-position acceptance was measured for K <= {len(per_position)}, not {k}")
    return 1.0 + float(np.sum(np.cumprod(per_position[:k])))


def batch_tokens_per_round(
    per_position: Sequence[float], k: int, max_new_tokens: int, batch: int, samples: int = 400, seed: int = 0
) -> float:
    """Tokens per row per loop round when a batch of rows runs until its slowest row is done.

    Rows accept independently (per-position acceptance a_i), but one batched loop runs
    until every row has `max_new_tokens`: simulated, E[max over rows of rounds needed].
    This also counts the last round's tokens that overshoot the budget and are cut.
    """
    reach = np.concatenate([[1.0], np.cumprod(per_position[:k])])  # P(at least i drafts accepted)
    pmf = np.append(reach[:-1] - reach[1:], reach[-1])  # P(exactly n accepted), n = 0..K
    rng = np.random.default_rng(seed)
    # Each round yields n + 1 tokens >= 1, so max_new_tokens rounds always suffice.
    tokens = rng.choice(k + 1, size=(samples, batch, max_new_tokens), p=pmf / pmf.sum()).astype(np.int32) + 1
    rounds_needed = np.argmax(np.cumsum(tokens, axis=-1) >= max_new_tokens, axis=-1) + 1  # [samples, batch]
    return max_new_tokens / float(np.mean(rounds_needed.max(axis=1)))


def geometric_tokens_per_round(alpha: float, k: int) -> float:
    """1 + a + ... + a^K: the i.i.d. acceptance model of Leviathan et al."""
    return float(sum(alpha**i for i in range(k + 1)))


def round_seconds(costs: CostTable, target: Model, draft: Model, batch: int, k: int, context: int) -> dict:
    """What one speculative round and one plain step cost, two ways.

    From forwards alone: the draft runs a width-2 catch-up then K - 1 width-1 steps (see
    speculative._propose) and the target verifies K + 1 positions; this gives the draft's
    share of the round. As executed: whole loop iterations (`iteration_seconds`), which
    add sampling, acceptance, commit and dispatch; predictions use these.
    """
    draft_seconds = costs.seconds(draft, batch, 2, context) + (k - 1) * costs.seconds(draft, batch, 1, context)
    verify_seconds = costs.seconds(target, batch, k + 1, context)
    return {
        "plain_step_seconds": costs.iteration_seconds(target, None, batch, 0, context),
        "round_seconds": costs.iteration_seconds(target, draft, batch, k, context),
        "plain_forward_seconds": costs.seconds(target, batch, 1, context),
        "draft_forward_seconds": draft_seconds,
        "verify_forward_seconds": verify_seconds,
        "draft_share": draft_seconds / (draft_seconds + verify_seconds),
    }


def predicted_speedup(tokens_per_round: float, components: dict) -> float:
    """Tokens per round times (plain step time / round time), both measured as executed."""
    return tokens_per_round * components["plain_step_seconds"] / components["round_seconds"]
