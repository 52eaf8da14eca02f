"""`specjax generate`'s clock: compilation timed apart from decoding, and --speedup.

A first run compiles, and compiling a speculative loop takes longer than a plain one, so
tokens/s over a first call makes speculation look slower than it is. Here every phase is
timed on its own: preparing (checks, planning, adaptive K's cost measurement), compiling
(`PreparedGeneration.compile`, which runs one prefill and two rounds besides), and decoding
(prefill and rounds, what tokens/s is over). --speedup times plain decoding of the same
prompts the same way and divides the decode times, compilation excluded on both sides;
as one decode of a short generation is at the mercy of the machine's other work, each side
then decodes once untimed and SPEEDUP_REPEATS times timed, round-robin, and the medians
are compared.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

from specjax.engine.output import GenerationOutput, PreparedGeneration

SPEEDUP_REPEATS = 3  # timed decodes per side for --speedup (median), after one untimed each


@dataclasses.dataclass(frozen=True)
class TimedRun:
    """One generation and the seconds of each phase."""

    output: GenerationOutput
    prepare_seconds: float  # checks and planning, adaptive K's round-cost measurement included
    compile_seconds: float  # compilation (and one prefill and two rounds, to compile for their outputs)
    decode_seconds: float  # prefill and every round, compilation excluded (the median of decode_repeats)
    decode_repeats: tuple[float, ...]  # each timed decode's seconds
    warmup: bool  # whether one untimed decode ran before the timed ones

    @property
    def tokens_per_second(self) -> float:
        return self.output.stats.generated_tokens / max(self.decode_seconds, 1e-9)

    def timing(self) -> dict:
        return {
            "prepare_seconds": self.prepare_seconds,
            "compile_seconds": self.compile_seconds,
            "decode_seconds": self.decode_seconds,
            "decode_repeats": list(self.decode_repeats),
            "tokens_per_second": self.tokens_per_second,
        }


def timed_runs(prepares: dict[str, Callable[[], PreparedGeneration]], warmup: bool = False, repeats: int = 1):
    """Prepare and compile each call, timed apart; with `warmup` decode each once, untimed;
    then decode each `repeats` times, round-robin so that a noisy neighbour slows all alike.
    Returns {name: TimedRun}, decode_seconds the median of the repeats."""
    prepared, phases = {}, {}
    for name, prepare in prepares.items():
        began = time.perf_counter()
        prepared[name] = prepare()
        planned = time.perf_counter()
        prepared[name].compile()
        phases[name] = (planned - began, time.perf_counter() - planned)
    if warmup:
        for call in prepared.values():
            call.decode()
    seconds: dict[str, list[float]] = {name: [] for name in prepared}
    states = {}
    for _ in range(repeats):
        for name, call in prepared.items():
            start = time.perf_counter()
            states[name] = call.decode()  # waits for the last chunk
            seconds[name].append(time.perf_counter() - start)
    return {
        name: TimedRun(
            output=call.collect(states[name]),
            prepare_seconds=phases[name][0],
            compile_seconds=phases[name][1],
            decode_seconds=statistics.median(seconds[name]),
            decode_repeats=tuple(seconds[name]),
            warmup=warmup,
        )
        for name, call in prepared.items()
    }


def first_difference(a: list[list[int]], b: list[list[int]]) -> tuple[int, int] | None:
    """(row, token index) of the first token where two batches of outputs differ, or None."""
    for row, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            at = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
            return row, at
    return None


def speedup_record(speculative: TimedRun, plain: TimedRun, temperature: float) -> dict:
    """What --speedup reports: plain decode time / speculative decode time, both tokens/s,
    and, when greedy (temperature 0), whether the outputs are equal token for token (a
    sampled run follows the target's distribution but draws other tokens, so it is not
    compared)."""
    checked = temperature == 0
    differ = first_difference(plain.output.tokens, speculative.output.tokens) if checked else None
    return {
        "speedup": plain.decode_seconds / max(speculative.decode_seconds, 1e-9),
        "speculative": speculative.timing(),
        "plain": plain.timing(),
        "greedy_checked": checked,
        "greedy_equal": (differ is None) if checked else None,
        "first_difference": None if differ is None else {"row": differ[0], "token": differ[1]},
    }
