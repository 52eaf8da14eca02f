"""One timed method of the peer comparison: who runs it, in which weights, and the call."""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Call:
    """One generation: the new tokens and the seconds they took (prefill included)."""

    tokens: list[int]
    seconds: float
    forwards: int | None = None  # target forward passes, prefill included, where the peer says
    extra: dict = dataclasses.field(default_factory=dict)  # peer-specific counters


@dataclasses.dataclass(frozen=True)
class Method:
    """`run(prompt_ids, n) -> Call` greedy-generates exactly n tokens after `prompt_ids`.

    peer:        specjax, transformers or llama.cpp
    name:        unique label, e.g. "specjax float32 lookup"
    kind:        plain, lookup, draft model, eagle3 head, ...
    weights:     the weights it reads, as stored (e.g. "GGUF Q4_1", "float32")
    computes_in: the format its products run in
    twin:        the specjax weight format whose plain greedy output its output is compared to
    bytes_per_step: bytes of weights one target forward reads (None: unknown)
    """

    peer: str
    name: str
    kind: str
    weights: str
    computes_in: str
    twin: str
    run: Callable[[list[int], int], Call]
    bytes_per_step: int | None = None
    notes: str = ""

    def describe(self) -> dict:
        return {
            key: getattr(self, key)
            for key in ("peer", "name", "kind", "weights", "computes_in", "twin", "bytes_per_step", "notes")
        }


def timed(fn: Callable[[], list[int]]) -> tuple[list[int], float]:
    start = time.perf_counter()
    tokens = fn()
    return tokens, time.perf_counter() - start


def failure(peer: str, what: str, error: BaseException) -> dict:
    """A peer (or one of its methods) that could not be set up or run, with its exact error."""
    return {
        "peer": peer,
        "what": what,
        "error": f"{type(error).__name__}: {error}",
        "traceback_tail": traceback.format_exception(error)[-3:],
    }
