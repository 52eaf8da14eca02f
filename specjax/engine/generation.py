"""The compiled loop: prefill, then rounds in one `lax.while_loop` until every row is done.

One loop for every kind of generation. The round is chosen by the static plan: a plain step
(no drafter), a chain of K, a token tree, or the adaptive policy's choice among them; all
read and write one LoopState and end in `finish_round` (state.py). A chain may also verify
only part of its drafts (confidence-scheduled verification, verify_schedule.py).

Two ways to run it, with the same rounds and so the same output bit for bit (the RNG stream
is in the state): `launch` is one compiled program, prefill and every round, that never
returns to the host midway (what benchmarks time); `run` prefills, then runs the rounds in
chunks of one compiled program (`jit_rounds`, a traced round budget, the state donated) and
returns to the host between chunks, so Ctrl-C stops a generation within about a chunk's
time (CHUNK_SECONDS) however long it would run.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core.loop import empty_cache, prefill, token_buffer
from specjax.core.state import LoopState, Plan
from specjax.engine.adaptive import adaptive_round, adaptive_stats
from specjax.engine.adaptive_policy import init_adaptive
from specjax.engine.output import GenerationOutput, PreparedGeneration, collect_output
from specjax.engine.prompts import PromptBatch
from specjax.engine.rounds import chain_round, draft_context, plain_round
from specjax.engine.schedule_policy import init_schedule
from specjax.engine.tree_round import tree_round
from specjax.engine.verify_schedule import schedule_round, schedule_stats


def loop_round(target_params, draft_weights, state: LoopState) -> LoopState:
    """One round (the while-loop body), of the kind the plan names."""
    plan = state.plan
    if plan.drafter is None:
        return plain_round(target_params, draft_weights, state)
    if plan.adaptive is not None:
        return adaptive_round(target_params, draft_weights, state)
    if plan.tree is not None:
        return tree_round(target_params, draft_weights, state)
    if plan.verify_schedule is not None:
        return schedule_round(target_params, draft_weights, state)
    return chain_round(target_params, draft_weights, state)


def init_state(
    target_params,
    draft_weights,
    prompt,
    prompt_lengths,
    max_new_tokens,
    eos_token_ids,
    rng,
    plan: Plan,
    cache_length: int,
    done=None,
    costs=None,
    kv=None,
    grammar=None,
) -> LoopState:
    """Prefill the target, set up the drafter, and return the state before the first round.

    prompt [B, T_bucket] right-padded; prompt_lengths [B]; eos_token_ids [E]. `done` [B]
    bool marks rows finished from the start (padding rows of a batch bucket); None: every
    row generates. `costs` [n]: seconds per iteration at each adaptive K. `kv`: the target's
    empty cache (core.loop.empty_cache), donated (None: made inside, which XLA:CPU fills out
    of place: see empty_cache). `grammar`: a GrammarState (core/grammar.py) when the
    output is constrained, its states [B] at each row's start state.
    """
    batch = prompt.shape[0]
    wants = plan.wants_features
    filled = prefill(
        plan.target, target_params, prompt, prompt_lengths, cache_length, plan.cache, features=wants, kv=kv
    )
    target_cache, features = filled if wants else (filled, None)  # features [B, T_bucket, D]
    state = LoopState(
        tokens=token_buffer(prompt, cache_length),
        lengths=prompt_lengths,
        prompt_lengths=prompt_lengths,
        done=jnp.zeros((batch,), bool) if done is None else done,
        target_cache=target_cache,
        draft_state=None,
        rng=rng,
        max_new_tokens=max_new_tokens,
        eos_token_ids=eos_token_ids,
        row_rounds=jnp.zeros((batch,), jnp.int32),
        accepted_at=jnp.zeros((batch, plan.accepted_width), jnp.int32),
        forwards=jnp.zeros((), jnp.int32),
        plan=plan,
        grammar=grammar,
    )
    if plan.drafter is None:
        return state
    if plan.adaptive is not None:
        # A round commits at least one token per live row, so cache_length bounds the rounds.
        groups = 1 + len(plan.adaptive.trees or ())
        key = jax.random.fold_in(rng, 1)  # the policy's own stream: sampling's is left as it was
        ad = init_adaptive(costs, batch, plan.accepted_width, max_rounds=cache_length, groups=groups, key=key)
        state = state.replace(adaptive=ad)
    if plan.verify_schedule is not None:
        state = state.replace(schedule=init_schedule(batch, plan.num_speculative_tokens, plan.verify_schedule))
    ctx = draft_context(state, target_params).replace(features=features, target_cache=target_cache)
    return state.replace(draft_state=plan.drafter.init(draft_weights, ctx, prompt, cache_length))


jit_init_state = jax.jit(init_state, static_argnames=("plan", "cache_length"), donate_argnames=("kv",))
jit_round = jax.jit(loop_round, donate_argnums=2)

# A chunk of rounds should take about this long: short enough that Ctrl-C (seen by Python
# only between chunks) stops a generation within about a second, long enough that the
# host round trip between chunks (tens of microseconds) stays lost in the noise.
CHUNK_SECONDS = 0.2
_MAX_GROWTH = 8  # a chunk is at most this many times the rounds of the one before


def run_rounds(target_params, draft_weights, state: LoopState, budget):
    """At most `budget` ([] int32) more rounds, fewer once every row is done.

    The budget is traced, so one compiled program serves every chunk size. Returns the
    state and whether every row is done ([] bool, apart from the state so that the host
    can read it while the donated state moves on).
    """

    def more(carry):
        s, i = carry
        return (i < budget) & ~jnp.all(s.done)

    def one(carry):
        s, i = carry
        return loop_round(target_params, draft_weights, s), i + 1

    state, _ = jax.lax.while_loop(more, one, (state, jnp.zeros((), jnp.int32)))
    return state, jnp.all(state.done)


jit_rounds = jax.jit(run_rounds, donate_argnums=2)


def next_chunk(rounds: int, seconds: float, current: int = 1, target: float = CHUNK_SECONDS) -> int:
    """Rounds for the next chunk, from a finished chunk's rounds and wall time: scaled toward
    `target` seconds, growing at most _MAX_GROWTH-fold past that chunk and the `current`
    budget (the first chunk also holds the prefill, and round times vary), never below 1."""
    scaled = int(rounds * target / max(seconds, 1e-6))
    return max(1, min(scaled, max(rounds, current) * _MAX_GROWTH, 2**30))  # 2**30: the budget is an int32


def decode_in_chunks(
    start: Callable[[], LoopState], rounds: Callable, chunk_rounds: int | None = None, pace: dict | None = None
) -> LoopState:
    """Prefill (`start()`), then `rounds(state, budget) -> (state, all_done)` until every row
    is done; returns the final state, computed. Each chunk runs `chunk_rounds` rounds, or
    (None) as many as take about CHUNK_SECONDS.

    `pace["round_seconds"]`, when known (an earlier decode or the compile step timed one),
    sizes the first chunk; without it chunks start at one round and grow. Each chunk's
    timing updates it. Every chunk is a host round trip and costs about a round (XLA:CPU,
    the embedded pair), so fewer, longer chunks are cheaper, up to the interrupt latency.

    A KeyboardInterrupt surfaces while the host waits for a chunk, and what is then still
    in flight (and would hold the device, and the process's exit, until it ends) is that
    chunk and the one queued behind it: the next chunk is dispatched before waiting on this
    one's all_done flag, so that the device never idles for a host round trip.
    """
    if chunk_rounds is not None and chunk_rounds < 1:
        raise ValueError(f"chunk_rounds must be >= 1, got {chunk_rounds}")
    pace = {} if pace is None else pace
    known = pace.get("round_seconds")
    budget = chunk_rounds or (1 if known is None else next_chunk(1, known, _MAX_GROWTH**3))
    first = budget  # the first chunk holds the prefill too: its time is not a round's
    pending = rounds(start(), jnp.int32(budget))
    waited_on, last = budget, time.perf_counter()  # the rounds of the chunk waited on next
    while True:
        state, finished = pending
        pending = rounds(state, jnp.int32(budget))  # queued; no rounds left to run once all are done
        queued = budget
        if bool(finished):  # waits for the earlier chunk
            return jax.block_until_ready(pending[0])
        now = time.perf_counter()
        if chunk_rounds is None:
            budget = next_chunk(waited_on, now - last, budget)  # it ran from the earlier chunk's end to now
            if waited_on != first or known is None:
                pace["round_seconds"] = (now - last) / waited_on
        waited_on, last, first = queued, now, None


@functools.partial(jax.jit, static_argnames=("plan", "cache_length"), donate_argnames=("kv",))
def _generate(
    target_params, draft_weights, prompt, prompt_lengths, done, max_new_tokens, eos_token_ids, rng, costs, kv, plan,
    cache_length, grammar=None,
):  # fmt: skip
    state = init_state(
        target_params, draft_weights, prompt, prompt_lengths, max_new_tokens, eos_token_ids, rng, plan, cache_length,
        done, costs, kv, grammar,
    )  # fmt: skip
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done), lambda s: loop_round(target_params, draft_weights, s), state)


def state_output(state: LoopState, num_rows: int | None = None) -> GenerationOutput:
    """Tokens and statistics of a (possibly unfinished) state. `num_rows`: report only the
    first num_rows rows (the rest pad a batch bucket)."""
    plan = state.plan
    drafter_stats = {} if plan.drafter is None else plan.drafter.stats(state.draft_state)
    tokens, prompt_lengths, lengths, row_rounds, accepted_at, forwards, eos, drafter_stats = jax.device_get(
        (
            state.tokens,
            state.prompt_lengths,
            state.lengths,
            state.row_rounds,
            state.accepted_at,
            state.forwards,
            state.eos_token_ids,
            drafter_stats,
        )
    )
    out = collect_output(
        np.asarray(tokens),
        prompt_lengths,
        lengths,
        row_rounds,
        forwards,
        None if plan.drafter is None else accepted_at,
        num_rows=num_rows,
        drafted_per_round=plan.num_speculative_tokens if plan.drafter is not None else None,
        eos_token_id=[int(i) for i in np.asarray(eos) if i >= 0],
    )
    if plan.drafter is None:
        return out
    counters = {k: int(np.sum(np.asarray(v)[:num_rows])) for k, v in drafter_stats.items()}
    stats = dataclasses.replace(out.stats, drafter={"kind": plan.drafter.name, **counters})
    if plan.adaptive is not None:
        stats = adaptive_stats(stats, state, num_rows)
    if plan.verify_schedule is not None:
        stats = schedule_stats(stats, state, num_rows)
    return dataclasses.replace(out, stats=stats)


def target_cache_buffer(plan: Plan, batch: PromptBatch):
    """The target's empty cache, donated to the call that fills it (core.loop.empty_cache);
    None on a mesh, where the prefill lays its own cache out over the devices."""
    if batch.mesh is not None:
        return None
    return empty_cache(plan.target, batch.bucket_rows, batch.cache_length, plan.cache)


def prepared_generation(
    target, batch: PromptBatch, plan: Plan, weights, costs, max_new_tokens: int, eos_token_id, seed: int, grammar=None
) -> PreparedGeneration:
    """A planned call, ready to launch or run (repeatedly, for n <= max_new_tokens new tokens).
    `grammar`: the GrammarState of a constrained call (one state per bucket row), or None."""
    prompt, prompt_lengths, done, eos, rng = batch.loop_inputs(eos_token_id, seed)

    def kv():
        return target_cache_buffer(plan, batch)

    def launch(n: int) -> LoopState:
        return _generate(
            target.params, weights, prompt, prompt_lengths, done, jnp.int32(n), eos, rng, costs, kv(), plan=plan,
            cache_length=batch.cache_length, grammar=grammar,
        )  # fmt: skip

    def start_args(n: int) -> tuple[tuple, dict]:
        args = (target.params, weights, prompt, prompt_lengths, jnp.int32(n), eos, rng)
        return args, dict(plan=plan, cache_length=batch.cache_length, done=done, costs=costs, kv=kv(), grammar=grammar)

    pace: dict = {}  # {"round_seconds": ...} once timed: sizes the next decode's first chunk

    def decode(n: int, chunk_rounds: int | None = None) -> LoopState:
        if chunk_rounds is None and jax.process_count() > 1:
            # Every process must run the same programs in the same order, and chunks sized by
            # each process's own clock would differ (and hang the collectives): one program.
            return launch(n)
        args, kwargs = start_args(n)
        rounds = functools.partial(jit_rounds, target.params, weights)
        return decode_in_chunks(lambda: jit_init_state(*args, **kwargs), rounds, chunk_rounds, pace)

    def compile_programs() -> None:
        # Compile by calling: jit's cache keeps the executables, so `decode` then compiles
        # nothing. A call, not just lower().compile(): XLA finishes preparing a program on
        # its first execution (a tiny model's first decode took 6x its next), and on a mesh
        # a round may leave a counter sharded that the prefill left replicated, so the
        # second chunk presents other shardings and needs a program of its own. One prefill
        # and two rounds run, on a state that is then dropped; the second round's time
        # sizes the first chunk of the next decode (an overestimate, if anything: safe).
        args, kwargs = start_args(max_new_tokens)
        state, _ = jit_rounds(target.params, weights, jit_init_state(*args, **kwargs), jnp.int32(1))
        jax.block_until_ready(state)
        began = time.perf_counter()
        state, finished = jit_rounds(target.params, weights, state, jnp.int32(1))
        if not bool(finished):  # a round ran: its time is a round's
            pace.setdefault("round_seconds", time.perf_counter() - began)

    return PreparedGeneration(
        max_new_tokens=max_new_tokens,
        batch_size=batch.batch_size,
        cache_length=batch.cache_length,
        launch_fn=launch,
        decode_fn=decode,
        compile_fn=compile_programs,
        # Padding rows of the batch bucket, and their drafter counters, are dropped.
        collect_fn=functools.partial(state_output, num_rows=batch.num_rows),
        tokenizer=target.tokenizer if batch.is_text else None,
    )
