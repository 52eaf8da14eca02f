"""Clocks read the right way (the engine's round-cost measurement and the bench share them).

Every timed call ends in `jax.block_until_ready` (dispatch is asynchronous, so a clock read
without it measures the launch, not the work), the first call of each program is a warm-up
that compiles, and configurations are timed round-robin so that a noisy neighbour slows all
of them alike; medians are reported. A sample never holds a compile: a program evicted
between its warm-up and its timed call (runtime.bound_live_programs clears JAX's caches when
a process nears vm.max_map_count, which an int8 SmolLM2 round-robin of a dozen speculative
programs does) is timed again once it has compiled.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax

from specjax.runtime import compiled_programs

_RETRIES = 3  # a launch that compiled this many times in a row is timed as it is


def timed(fn: Callable[[], object]) -> float:
    """Seconds until everything `fn` returns is computed."""
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def timed_warm(fn: Callable[[], object]) -> float:
    """Seconds of fn(), timed again when the try compiled: a round-robin with more programs
    than the process keeps alive has JAX's caches cleared under it, and the next launch of a
    program it had warmed then compiles inside the timed call."""
    for _ in range(_RETRIES):
        before = compiled_programs()
        seconds = timed(fn)
        if compiled_programs() == before:
            break
    return seconds


def interleaved(fns: dict, repeats: int, warmup: int, progress=None) -> dict[object, list[float]]:
    """Time every callable `repeats` times, round-robin, after `warmup` untimed calls each;
    a call that compiled is timed again (`timed_warm`)."""
    for fn in fns.values():
        for _ in range(warmup):
            jax.block_until_ready(fn())
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed_warm(fn))
            if progress is not None:
                progress.update(1)
    return times


def median(values) -> float:
    return float(statistics.median(values))


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
