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

from specjax.bench.timing import interleaved, median, timed
from specjax.core.loop import CacheConfig
from specjax.drafters import Drafter, as_drafter
from specjax.engine.timed_loops import TimedLoop, draft_model_of
from specjax.io.model import Model
from specjax.models import ModelConfig, forward, init_cache
from specjax.runtime import bound_live_programs

# Tables read by gathering a few rows, not streamed whole through a matrix product.
_LOOKUP_TABLES = ("embed", "position_embed")


def _matrices(model: Model) -> list[tuple[str, jax.Array]]:
    """(top-level name, leaf) of every matrix a forward multiplies by: all params but lookup
    tables and an int8 format's scales (models/quant.py), plus a tied LM head (the embedding)."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(model.params)[0]:
        keys = [str(getattr(k, "key", k)) for k in path]
        if keys[0] not in _LOOKUP_TABLES and not keys[-1].endswith("_scale"):
            out.append((keys[0], leaf))
    if "lm_head" not in model.params:  # tied: the embedding table is the output projection
        out.append(("embed", model.params["embed"]))
    return out


def matmul_parameters(model: Model) -> int:
    """Parameters a forward multiplies by: all but lookup tables, plus a tied LM head."""
    return sum(int(np.prod(x.shape)) for _, x in _matrices(model))


def matmul_bytes(model: Model) -> int:
    """Bytes of those parameters as stored (a weight format's: 1 per int8 weight, 2 per bfloat16)."""
    return sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for _, x in _matrices(model))


def kv_cache_bytes(config: ModelConfig, batch: int, context: int, dtype: str | None = None) -> int:
    """2 (K and V) * layers * context * n_kv * d_head * bytes, per row, times rows.

    dtype: the cache's element dtype when it differs from the params' (CacheConfig.dtype).
    """
    kv_heads = config.num_attention_heads if config.model_type == "gpt2" else config.num_key_value_heads
    itemsize = jnp.dtype(dtype or config.dtype).itemsize
    return 2 * config.num_hidden_layers * context * kv_heads * config.resolved_head_dim * itemsize * batch


def forward_estimate(model: Model, batch: int, width: int, context: int) -> dict:
    """FLOPs, bytes moved and arithmetic intensity of one forward of [batch, width] tokens.

    Attention reads the cache up to the highest query position (models/attention.py); the
    forwards timed beside this estimate sit at the end of a cache of `context` slots, so
    it counts all `context` of them.
    """
    config = model.config
    tokens = batch * width
    weight_bytes = matmul_bytes(model)
    kv_bytes = kv_cache_bytes(config, batch, context)
    # 2 FLOPs per multiply-add; attention: q.k and p.v over `context` slots for every head.
    attention = 4 * config.num_hidden_layers * tokens * context * config.num_attention_heads * config.resolved_head_dim
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


class CostTable:
    """Measured seconds per forward, per loop iteration or per proposal, memoised by shape."""

    def __init__(self, inner: int, repeats: int):
        self.inner, self.repeats = inner, repeats
        self._seconds: dict[tuple, float] = {}

    def iteration_seconds(
        self, target: Model, draft: Model | Drafter | None, batch: int, k: int, context: int, temperature: float = 0.0
    ) -> float:
        """One iteration of the generation loop exactly as it runs: a plain decode step
        (draft None) or a speculative round of K. Everything counts (draft steps, verify,
        acceptance, commit, per-op dispatch), and nothing depends on acceptance: shapes
        are static, so a round costs the same whether it accepts 0 or K drafts."""
        part = "step" if draft is None else "round"
        return self._loop_seconds(part, target, draft, batch, k, context, temperature)

    def propose_seconds(
        self, target: Model, draft: Model | Drafter, batch: int, k: int, context: int, temperature: float = 0.0
    ) -> float:
        """One `drafter.propose` of K tokens alone (loops.py), for any drafter."""
        return self._loop_seconds("propose", target, draft, batch, k, context, temperature)

    def step_seconds(self, target: Model, batch: int, shapes: list[tuple[int, int, CacheConfig]]) -> list[float]:
        """Plain decode steps at (capacity, fill, cache layout) shapes, timed round-robin."""
        loops = [("step", target, None, batch, 0, capacity, 0.0, fill, cache) for capacity, fill, cache in shapes]
        self._measure_loops(loops)
        return [self._seconds[TimedLoop(*loop).key] for loop in loops]

    def _loop_seconds(self, part, target, draft, batch, k, context, temperature) -> float:
        key = TimedLoop(part, target, draft, batch, k, context, temperature).key
        if key not in self._seconds:
            self._measure_loops([(part, target, draft, batch, k, context, temperature)])
        return self._seconds[key]

    def measure_iterations(self, shapes: list[tuple], proposals: str = "auto") -> None:
        """Time many (target, draft | None, batch, K, context[, temperature]) iterations round-robin.

        A shared machine drifts over minutes; timing the configurations of one experiment
        in turn, as the end-to-end runs are, keeps their ratios honest. `proposals`: also
        time the drafter's propose alone, side by side with its round, for the drafters
        whose draft share needs it ("auto": those that are not a draft model), for "all"
        speculative shapes, or "none".
        """
        loops = []
        for target, draft, batch, k, context, *rest in shapes:
            temperature = rest[0] if rest else 0.0
            loops.append(("step" if draft is None else "round", target, draft, batch, k, context, temperature))
            if draft is None:
                continue
            if proposals == "all" or (proposals == "auto" and draft_model_of(draft) is None):
                loops.append(("propose", target, draft, batch, k, context, temperature))
        self._measure_loops(loops)

    def _measure_loops(self, loops: list[tuple]) -> None:
        timed_loops = {loop.key: loop for loop in map(lambda spec: TimedLoop(*spec), loops)}
        # Every program of a round-robin must be alive at once, and nothing frees them while
        # it runs: free what earlier runs left (an experiment's end-to-end generations) before
        # compiling them, unless most of vm.max_map_count is still free. SmolLM2's E8 probe
        # (11 rounds, 10 proposals) died in LLVM's section allocator without this.
        bound_live_programs(headroom=0.75)
        calls = {key: loop.call(self.inner) for key, loop in timed_loops.items() if key not in self._seconds}
        times = interleaved(calls, self.repeats, warmup=1)
        self._seconds.update({key: median(t) / self.inner for key, t in times.items()})

    def seconds(self, model: Model, batch: int, width: int, context: int, fill: int | None = None) -> float:
        """One forward of [batch, width] tokens on a cache of `context` slots holding `fill`
        tokens (None: the last `width` slots, the widest attention the cache allows; a loop
        iteration is timed at half the cache, engine/timed_loops.py)."""
        key = (id(model.params), model.config, batch, width, context, fill)
        if key not in self._seconds:
            self._seconds[key] = self._measure(model, batch, width, context, fill)
        return self._seconds[key]

    def _measure(self, model: Model, batch: int, width: int, context: int, fill: int | None) -> float:
        start = context - width if fill is None else fill
        if not 0 <= start <= context - width:
            raise ValueError(f"a forward of width {width} after {start} tokens does not fit a cache of {context} slots")
        tokens = jnp.ones((batch, width), jnp.int32)
        positions = jnp.broadcast_to(jnp.arange(start, start + width, dtype=jnp.int32), (batch, width))
        cache = init_cache(model.config, batch, context).replace(lengths=jnp.full((batch,), start))

        def call():
            nonlocal cache
            cache, checksum = _forwards(model.config, model.params, tokens, cache, positions, self.inner)
            return checksum

        # Two warm-up calls: the first compiles for the fresh cache, the second for the cache
        # the first returns (donated and committed, another jit key). With one, the first timed
        # call compiled too, and a median of 2 repeats came out 1000x a forward.
        jax.block_until_ready(call())
        jax.block_until_ready(call())
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


def round_seconds(
    costs: CostTable,
    target: Model,
    draft: Model | Drafter,
    batch: int,
    k: int,
    context: int,
    temperature: float = 0.0,
    share: str = "auto",
    fill: int | None = None,
) -> dict:
    """What one speculative round and one plain step cost, and the draft's share of a round.

    fill: the cache fill the forwards are timed at (CostTable.seconds; None: a full cache).

    As executed: whole loop iterations (`iteration_seconds`), which add sampling,
    acceptance, commit and dispatch; predictions use these. The draft share, two ways
    (`draft_share_definition` says which):
      "forwards" (a draft model, share "auto"): from forwards alone, the draft's width-W
        catch-up then K - 1 width-1 steps (drafters/draft_model.py) over those plus the
        target's width-(K + 1) verify;
      "propose" (any other drafter, or share "propose"): `drafter.propose` timed alone
        over the whole round, both timed side by side (measure_iterations).
    """
    drafter = as_drafter(draft)
    model = draft_model_of(drafter)
    if share not in ("auto", "propose", "forwards"):
        raise ValueError(f"share must be 'auto', 'propose' or 'forwards', got {share!r}")
    if share == "forwards" and model is None:
        raise ValueError(f"a forward-based draft share needs a draft model, not {drafter.name}")
    out = {
        "plain_step_seconds": costs.iteration_seconds(target, None, batch, 0, context, temperature),
        "round_seconds": costs.iteration_seconds(target, drafter, batch, k, context, temperature),
        "plain_forward_seconds": costs.seconds(target, batch, 1, context, fill),
        "verify_forward_seconds": costs.seconds(target, batch, k + 1, context, fill),
    }
    if share == "forwards" or (share == "auto" and model is not None):
        catch_up = costs.seconds(model, batch, drafter.catch_up, context, fill)
        forwards = catch_up + (k - 1) * costs.seconds(model, batch, 1, context, fill)
        share_of_round = forwards / (forwards + out["verify_forward_seconds"])
        out.update(draft_forward_seconds=forwards, draft_share=share_of_round, draft_share_definition="forwards")
    else:
        propose = costs.propose_seconds(target, drafter, batch, k, context, temperature)
        share_of_round = propose / out["round_seconds"]
        out.update(draft_propose_seconds=propose, draft_share=share_of_round, draft_share_definition="propose")
    return out


def draft_seconds(components: dict) -> float:
    """The draft's seconds per round, whichever way round_seconds measured them."""
    return components.get("draft_forward_seconds", components.get("draft_propose_seconds"))


def predicted_speedup(tokens_per_round: float, components: dict) -> float:
    """Tokens per round times (plain step time / round time), both measured as executed."""
    return tokens_per_round * components["plain_step_seconds"] / components["round_seconds"]
