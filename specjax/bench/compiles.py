"""How many XLA programs this process has compiled, and how long that took: the numbers
behind a known failure mode and behind slow sweeps.

One process that compiles a few hundred programs (a sweep over K, batch sizes, contexts
and drafters) can die with SIGSEGV inside XLA:CPU's compiler (jax 0.10.2; it grows with
the number of live executables, not with any one shape). The bench logs the count per
experiment and, by default, clears JAX's caches between experiments so that the live
programs stay bounded by one experiment's. It also logs the seconds spent compiling: an
int8 SmolLM2 sweep on the EPYC machine spent 414 of its 698 s in XLA. The counter itself is
kept once, in specjax/runtime.py.
"""

from specjax.runtime import compile_seconds, compiled_programs

__all__ = ["compile_seconds", "compiled_programs"]
