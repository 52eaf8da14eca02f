"""Seconds per loop iteration at each K, for adaptive speculation (engine/adaptive.py).

A plain decode step for K = 0 and a speculative round of K otherwise, each timed as it
runs inside the generation loop (bench/loops.py), round-robin so that their ratios hold on a
noisy machine. Results are memoised per shape for the life of the process, so a second
generation of the same shape measures nothing.
"""

from __future__ import annotations

from specjax.bench.cost import CostTable
from specjax.drafters import Drafter
from specjax.io.model import Model

# Short on purpose: the policy needs ratios between K, not absolute times.
_TABLE = CostTable(inner=4, repeats=3)


def measure_round_costs(
    target: Model,
    draft: Model | Drafter,
    batch: int,
    ks,
    context: int,
    temperature: float = 0.0,
    table: CostTable | None = None,
) -> dict[int, float]:
    """{K: seconds of one loop iteration} for a batch of `batch` rows and a cache of `context` slots."""
    table = table or _TABLE
    context = max(context, 2 * (max(ks) + 2))  # room for the rounds on a half-filled cache
    shapes = [(target, None if k == 0 else draft, batch, k, context, temperature) for k in ks]
    table.measure_iterations(shapes, proposals="none")
    return {k: table.iteration_seconds(target, None if k == 0 else draft, batch, k, context, temperature) for k in ks}
