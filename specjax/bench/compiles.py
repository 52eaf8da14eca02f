"""How many XLA programs this process has compiled: the number behind a known failure mode.

One process that compiles a few hundred programs (a sweep over K, batch sizes, contexts
and drafters) can die with SIGSEGV inside XLA:CPU's compiler (jax 0.10.2; it grows with
the number of live executables, not with any one shape). The bench logs the count per
experiment and, by default, clears JAX's caches between experiments so that the live
programs stay bounded by one experiment's.
"""

from __future__ import annotations

from jax import monitoring

_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_count = 0
_registered = False


def _listener(event: str, duration: float, **kwargs) -> None:
    global _count
    if event == _BACKEND_COMPILE:
        _count += 1


def compiled_programs() -> int:
    """Backend compilations in this process since the first call (cache hits do not count)."""
    global _registered
    if not _registered:
        monitoring.register_event_duration_secs_listener(_listener)
        _registered = True
    return _count
