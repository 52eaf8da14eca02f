"""Seconds per loop iteration at each K, for adaptive speculation (engine/adaptive.py).

A plain decode step for K = 0 and a speculative round of K otherwise, each timed as it
runs inside the generation loop (bench/loops.py), round-robin so that their ratios hold on a
noisy machine. Results are memoised per shape for the life of the process, so a second
generation of the same shape measures nothing.
"""

from __future__ import annotations

from specjax.bench.cost import CostTable
from specjax.drafters import Drafter
from specjax.engine.adaptive import AdaptiveConfig
from specjax.engine.loop import DEFAULT_CACHE
from specjax.io.model import Model

# Short on purpose: the policy needs ratios between K, not absolute times.
_TABLE = CostTable(inner=4, repeats=3)


def measure_round_costs(
    target: Model,
    draft: Model | Drafter,
    batch: int,
    config: AdaptiveConfig,
    context: int,
    temperature: float = 0.0,
    table: CostTable | None = None,
) -> dict:
    """{candidate label: seconds of one loop iteration} for a batch of `batch` rows and a cache
    of `context` slots: K for chains (0 = a plain step), "tree0", ... for the config's trees."""
    table = table or _TABLE
    trees = (None,) * len(config.labels) if not config.trees else (None, *config.trees)
    loops = {}
    for label, drafted, tree in zip(config.labels, config.drafted, trees, strict=True):
        room = max(context, 2 * (drafted + 2))  # room for the rounds on a half-filled cache
        part, drafter = ("step", None) if drafted == 0 else ("round", draft)
        loops[label] = (part, target, drafter, batch, drafted, room, temperature, None, DEFAULT_CACHE, tree)
    table.measure_loops(list(loops.values()))
    return {label: table.loop_seconds(loop) for label, loop in loops.items()}
