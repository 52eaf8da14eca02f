"""`specjax generate`'s clock: compilation timed apart from decoding, and --speedup.

A first run compiles, and compiling a speculative loop takes longer than a plain one, so
tokens/s over a first call makes speculation look slower than it is. Here every phase is
timed on its own: preparing (checks, planning, adaptive K's cost measurement), compiling
ahead of time (`PreparedGeneration.compile`, which runs nothing but one prefill), and
decoding (prefill and rounds, what tokens/s is over). --speedup times plain decoding of the
same prompts the same way and divides the decode times; compilation is excluded on both
sides.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from specjax.engine.output import GenerationOutput, PreparedGeneration


@dataclasses.dataclass(frozen=True)
class TimedRun:
    """One generation and the seconds of each phase."""

    output: GenerationOutput
    prepare_seconds: float  # checks and planning, adaptive K's round-cost measurement included
    compile_seconds: float  # ahead-of-time compilation (and one prefill, to compile for its output)
    decode_seconds: float  # prefill and every round, compilation excluded
    warmup: bool  # whether one untimed decode ran before the timed one

    @property
    def tokens_per_second(self) -> float:
        return self.output.stats.generated_tokens / max(self.decode_seconds, 1e-9)

    def timing(self) -> dict:
        return {
            "prepare_seconds": self.prepare_seconds,
            "compile_seconds": self.compile_seconds,
            "decode_seconds": self.decode_seconds,
            "tokens_per_second": self.tokens_per_second,
        }


def timed_run(prepare: Callable[[], PreparedGeneration], warmup: bool = False) -> TimedRun:
    """Prepare, compile and decode, each timed apart. `warmup`: decode once, untimed, first."""
    began = time.perf_counter()
    prepared = prepare()
    planned = time.perf_counter()
    prepared.compile()
    compiled = time.perf_counter()
    if warmup:
        prepared.decode()
    start = time.perf_counter()
    state = prepared.decode()  # waits for the last chunk
    decoded = time.perf_counter()
    return TimedRun(
        output=prepared.collect(state),
        prepare_seconds=planned - began,
        compile_seconds=compiled - planned,
        decode_seconds=decoded - start,
        warmup=warmup,
    )


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
