"""The process's XLA runtime: bounding how many compiled programs stay alive.

Every XLA:CPU executable keeps its JIT-compiled code in memory mappings of its own (about
400 for a speculative loop of a tiny model) for as long as it lives, and JAX's caches keep
every executable alive. Linux caps the mappings of a process (vm.max_map_count, 65530 by
default); when a compile needs one more, LLVM fails to allocate section memory and the
process dies inside `backend_compile_and_load` (SIGABRT or SIGSEGV). A few hundred
distinct programs in one process are enough. So before a launch that may compile
(PreparedGeneration.launch calls `bound_live_programs`), once the mappings pass
(1 - MAP_HEADROOM) of the limit, JAX's caches are cleared: the live executables are freed
and later calls recompile what they need.

Counting compiles needs a listener on JAX's monitoring events; `install()` registers it,
once, and the engine calls it when it is imported (specjax/engine/output.py), so nothing
registers itself as a side effect of importing this module.
"""

from __future__ import annotations

import gc
from pathlib import Path

import jax
from jax import monitoring

MAP_HEADROOM = 0.25  # clear when fewer than this share of vm.max_map_count is left; 0 disables
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_guard = {"compiles": 0, "compile_seconds": 0.0, "checked": -1, "clears": 0, "installed": False}


def _count_compile(event: str, duration: float, **kwargs) -> None:
    if event == _BACKEND_COMPILE:
        _guard["compiles"] += 1
        _guard["compile_seconds"] += duration


def install() -> None:
    """Count XLA compiles from now on (idempotent)."""
    if not _guard["installed"]:
        monitoring.register_event_duration_secs_listener(_count_compile)
        _guard["installed"] = True


def compiled_programs() -> int:
    """XLA backend compilations in this process since `install` (cache hits do not count)."""
    install()
    return _guard["compiles"]


def compile_seconds() -> float:
    """Seconds those compilations took: how much of a slow sweep went to XLA rather than to
    what it measured (an int8 SmolLM2 compiles about twice as long as float32)."""
    install()
    return _guard["compile_seconds"]


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


def bound_live_programs(headroom: float = MAP_HEADROOM) -> bool:
    """Clear JAX's caches if this process's memory mappings near vm.max_map_count (fewer
    than `headroom` of it left).

    At the default headroom it is cheap when nothing compiled since the last check (an
    integer comparison), so timed launches pay nothing; another headroom always reads the
    mappings (the cost probe asks for more room before compiling a round-robin's programs).
    Returns whether it cleared.
    """
    if MAP_HEADROOM <= 0:
        return False
    if headroom == MAP_HEADROOM:  # the launch-time check: skipped while nothing compiled since the last
        if _guard["compiles"] == _guard["checked"]:
            return False
        _guard["checked"] = _guard["compiles"]
    mappings = memory_mappings()
    if mappings is None or mappings[0] < (1.0 - headroom) * mappings[1]:
        return False
    jax.block_until_ready(jax.live_arrays())  # no program may be running while it is freed
    jax.clear_caches()
    gc.collect()
    _guard["clears"] += 1
    return True
