"""What a generation call returns: the tokens and the counters behind every metric."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax import monitoring

from specjax.parallel.placement import gather_rows


@dataclasses.dataclass(frozen=True)
class GenerationStats:
    """Counters of one generation call, summed over the rows of the batch.

    Definitions (as in vLLM / EAGLE; see README "Metrics"):
      rounds: row-rounds, i.e. for every row the number of rounds (speculative) or
        decode steps (plain) in which it was still generating, summed over rows.
      target_forwards: batched target forward passes of the loop (one per round or step,
        however many rows it served); the prompt prefill is not counted.
      drafted_tokens: K (a tree: its N nodes) per row-round. accepted_tokens: draft tokens
        the target accepted.
      verify_width: tokens per row in each target forward: K + 1 (a tree: N + 1; plain: 1).
      acceptance_rate: accepted_tokens / drafted_tokens (a tree drafts N to accept at most
        its depth, so compare trees by mean_acceptance_length, not by this).
      mean_acceptance_length: 1 + accepted_tokens / rounds, pooled over rows, i.e. tokens a
        round yields counting the correction/bonus token (gpt-fast reports it without +1).
      accepted_per_position: for i = 1..K, P(draft token i accepted | tokens 1..i-1 were);
        for a tree, i is the depth.
      accepted_counts: for i = 1..K, the row-rounds in which draft token i was accepted
        (acceptance is a prefix, so rounds that accepted exactly n tokens are
        accepted_counts[n-1] - accepted_counts[n]).
      position_rounds: for i = 1..K, the row-rounds that drafted position i and reached it
        (every earlier one accepted): accepted_per_position[i] is
        accepted_counts[i] / position_rounds[i].
      emitted_tokens: tokens the rounds produced, rounds + accepted_tokens (each round
        commits its accepted draft tokens plus one correction/bonus token).
      truncated_tokens: emitted_tokens - generated_tokens, the emitted tokens cut because
        a row reached max_new_tokens or EOS mid-round; so the summary adds up.
      stopped_at_eos: per row, whether it ended at the EOS token (else at max_new_tokens).
    """

    rounds: int
    target_forwards: int
    drafted_tokens: int
    verify_width: int
    accepted_tokens: int
    generated_tokens: int
    acceptance_rate: float
    mean_acceptance_length: float
    accepted_per_position: list[float]
    accepted_counts: list[int]
    per_row_mean_acceptance_length: list[float]
    position_rounds: list[int] = dataclasses.field(default_factory=list)
    emitted_tokens: int = 0
    truncated_tokens: int = 0
    stopped_at_eos: list[bool] = dataclasses.field(default_factory=list)
    drafter: dict = dataclasses.field(default_factory=dict)
    # Adaptive speculation only: the K set, rounds per K, plain steps, and per round the K
    # chosen and the estimated acceptance of position 1 (engine/adaptive.py).
    adaptive: dict | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class GenerationOutput:
    tokens: list[list[int]]  # generated ids per prompt, prompt excluded, cut after EOS
    stats: GenerationStats
    text: list[str] | None = None  # decoded `tokens`, when the prompts were text

    def with_text(self, tokenizer) -> GenerationOutput:
        decoded = [tokenizer.decode(t, skip_special_tokens=True) for t in self.tokens]
        return dataclasses.replace(self, text=decoded)


def _ratio(num, den) -> float:
    return float(num) / float(den) if den else 0.0


def collect_output(
    tokens,
    prompt_lengths,
    lengths,
    row_rounds,
    target_forwards,
    accepted_at=None,
    num_rows=None,
    drafted_per_round=None,
    eos_token_id: int | None = None,
):
    """Host-side assembly from final loop state arrays (numpy).

    tokens [B, S]; prompt_lengths, lengths, row_rounds [B]; accepted_at [B, K] counts how
    often draft position i (a tree: depth i) was accepted (None for plain decoding).
    `num_rows`: keep only the first num_rows rows (the rest pad the batch to its bucket);
    None keeps all. `drafted_per_round`: tokens drafted per row-round when it is not K
    (a tree's node count N); the verify width is drafted_per_round + 1. `eos_token_id`
    (None or < 0: none) marks the rows that stopped at EOS.
    """
    if num_rows is not None:
        tokens, prompt_lengths, lengths, row_rounds = (
            np.asarray(x)[:num_rows] for x in (tokens, prompt_lengths, lengths, row_rounds)
        )
        accepted_at = None if accepted_at is None else np.asarray(accepted_at)[:num_rows]
    generated = [tokens[b, prompt_lengths[b] : lengths[b]].tolist() for b in range(tokens.shape[0])]
    row_rounds = np.asarray(row_rounds, np.int64)
    rounds = int(row_rounds.sum())
    if accepted_at is None:
        accepted_at = np.zeros((len(generated), 0), np.int64)
    accepted_at = np.asarray(accepted_at, np.int64)
    k = accepted_at.shape[1]
    drafted = k if drafted_per_round is None else drafted_per_round
    row_accepted = accepted_at.sum(axis=1)
    accepted = int(row_accepted.sum())
    reached = np.concatenate([[rounds], accepted_at.sum(axis=0)])  # rounds that got to position i
    generated_tokens = sum(len(g) for g in generated)
    eos = -1 if eos_token_id is None else int(eos_token_id)
    stats = GenerationStats(
        rounds=rounds,
        target_forwards=int(target_forwards),
        drafted_tokens=drafted * rounds,
        verify_width=drafted + 1,
        accepted_tokens=accepted,
        generated_tokens=generated_tokens,
        acceptance_rate=_ratio(accepted, drafted * rounds),
        mean_acceptance_length=1.0 + _ratio(accepted, rounds),
        accepted_per_position=[_ratio(reached[i + 1], reached[i]) for i in range(k)],
        accepted_counts=[int(c) for c in reached[1:]],
        per_row_mean_acceptance_length=[1.0 + _ratio(a, r) for a, r in zip(row_accepted, row_rounds, strict=True)],
        position_rounds=[int(c) for c in reached[:k]],
        emitted_tokens=rounds + accepted,
        truncated_tokens=rounds + accepted - generated_tokens,
        stopped_at_eos=[eos >= 0 and bool(g) and g[-1] == eos for g in generated],
    )
    return GenerationOutput(tokens=generated, stats=stats)


@dataclasses.dataclass(frozen=True)
class PreparedGeneration:
    """A checked, padded and planned generation call that has not run yet.

    `launch(n)` starts the compiled loop for n <= max_new_tokens new tokens and returns
    the final loop state without waiting for it (JAX dispatch is asynchronous), so a
    benchmark can time `jax.block_until_ready(launch(n))`. Every n runs the same compiled
    program: the token budget is a traced value and the cache is sized for
    `max_new_tokens`. `run()` is what `generate` / `speculative_generate` return.
    """

    max_new_tokens: int
    batch_size: int
    cache_length: int
    launch_fn: Callable[[int], Any]  # n -> final loop state (device arrays)
    collect_fn: Callable[[Any], GenerationOutput]  # final loop state -> host-side output
    tokenizer: Any = None  # set when the prompts were text: outputs are decoded too

    def launch(self, max_new_tokens: int | None = None):
        n = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        if not 1 <= n <= self.max_new_tokens:
            raise ValueError(f"max_new_tokens must lie in [1, {self.max_new_tokens}] for this prepared call, got {n}")
        bound_live_programs()
        return self.launch_fn(n)

    def collect(self, state) -> GenerationOutput:
        out = self.collect_fn(gather_rows(state))  # multi-host: rows other processes hold (specjax/parallel)
        return out if self.tokenizer is None else out.with_text(self.tokenizer)

    def run(self, max_new_tokens: int | None = None) -> GenerationOutput:
        return self.collect(self.launch(max_new_tokens))


# --- Bounding live compiled programs ---------------------------------------------------
#
# Every XLA:CPU executable keeps its JIT-compiled code in memory mappings of its own (about
# 400 for a speculative loop of a tiny model) for as long as it lives, and JAX's caches keep
# every executable alive. Linux caps the mappings of a process (vm.max_map_count, 65530 by
# default); when a compile needs one more, LLVM fails to allocate section memory and the
# process dies inside `backend_compile_and_load` (SIGABRT or SIGSEGV). A few hundred
# distinct programs in one process are enough. So before a launch that may compile, once
# the mappings pass (1 - MAP_HEADROOM) of the limit, JAX's caches are cleared: the live
# executables are freed and later calls recompile what they need.

MAP_HEADROOM = 0.25  # clear when fewer than this share of vm.max_map_count is left; 0 disables
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_guard = {"compiles": 0, "checked": -1, "clears": 0}


def _count_compile(event: str, duration: float, **kwargs) -> None:
    if event == _BACKEND_COMPILE:
        _guard["compiles"] += 1


monitoring.register_event_duration_secs_listener(_count_compile)


def memory_mappings() -> tuple[int, int] | None:
    """(memory mappings of this process, the kernel's limit vm.max_map_count), or None off Linux."""
    try:
        with open("/proc/self/maps", "rb") as f:
            count = f.read().count(b"\n")
        return count, int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return None


def cache_clears() -> int:
    """How often `bound_live_programs` has cleared JAX's caches in this process."""
    return _guard["clears"]


def bound_live_programs() -> bool:
    """Clear JAX's caches if this process's memory mappings near vm.max_map_count.

    Cheap when nothing compiled since the last check (an integer comparison), so timed
    launches pay nothing. Returns whether it cleared.
    """
    if MAP_HEADROOM <= 0 or _guard["compiles"] == _guard["checked"]:
        return False
    _guard["checked"] = _guard["compiles"]
    mappings = memory_mappings()
    if mappings is None or mappings[0] < (1.0 - MAP_HEADROOM) * mappings[1]:
        return False
    jax.block_until_ready(jax.live_arrays())  # no program may be running while it is freed
    jax.clear_caches()
    gc.collect()
    _guard["clears"] += 1
    return True
