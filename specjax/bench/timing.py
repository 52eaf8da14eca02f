"""Clocks read the right way, and what the machine can do at best.

Every timed call ends in `jax.block_until_ready` (dispatch is asynchronous, so a clock
read without it measures the launch, not the work), the first call of each program is
a warm-up that compiles, and configurations are timed round-robin so that a noisy
neighbour slows all of them alike; medians are reported.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from specjax.engine.clock import cpu_count, cpu_model, interleaved, median, timed, timed_warm  # noqa: F401 (re-exported)
from specjax.version import __version__


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def environment() -> dict:
    """Where the numbers came from: versions, backend, device and CPU."""
    import flax

    device = jax.devices()[0]
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "jax": jax.__version__,
        "flax": flax.__version__,
        "specjax": __version__,
        "git_commit": _git_commit(),
        "backend": jax.default_backend(),
        "device": getattr(device, "device_kind", str(device)),
        "device_count": jax.device_count(),
        "cpu": cpu_model(),
        "cpu_count": cpu_count(),
    }


def load_average() -> list[float] | None:
    """The machine's 1, 5 and 15-minute load averages (None where the OS keeps none).

    Above the CPU count, other processes were competing for the cores the timings ran on.
    """
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def machine_load() -> dict:
    """What results.json records of the machine's load (start and end; `end` is updated as a
    run goes on) beside its CPU count (the load counts every process of the machine) and the
    CPUs this process may use."""
    now = load_average()
    return {"start": now, "end": now, "cpu_count": os.cpu_count(), "cpus_available": cpu_count()}


def repeat_values(row: dict) -> list[float]:
    """Tokens/s of each timed repetition of a measured row, from its `latency_seconds` [R][Q]:
    every request's tokens over the time all requests took in that repetition (the row's
    `tokens_per_second` is their median)."""
    tokens = row["batch_size"] * row["max_new_tokens"] * row["requests"]
    return [tokens / sum(seconds) for seconds in row["latency_seconds"]]


@functools.partial(jax.jit, donate_argnums=0)
def _scale(x):
    return x * 1.0001


def memory_bandwidth(megabytes: int, repeats: int = 5) -> float:
    """Sustained bytes/s of a streaming read + write over an array far larger than caches.

    x * c reads and writes every byte once; the buffer is donated so it is updated in
    place instead of allocating a second array each call.
    """
    x = jnp.ones((megabytes * 2**20 // 4,), jnp.float32)
    x = _scale(x)  # compile
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        x = jax.block_until_ready(_scale(x))
        seconds.append(time.perf_counter() - start)
    return 2 * x.nbytes / min(seconds)


def matmul_flops(dtype: str, size: int | None = None, repeats: int = 5) -> float:
    """Dense matrix-product FLOP/s at `dtype`, the compute ceiling of the roofline."""
    size = size or (8192 if jax.default_backend() == "gpu" else 1024)
    a = jnp.ones((size, size), dtype) * 0.5
    product = jax.jit(lambda a: a @ a)
    jax.block_until_ready(product(a))
    best = min(timed(lambda: product(a)) for _ in range(repeats))
    return 2 * size**3 / best
