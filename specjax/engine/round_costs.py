"""Seconds per loop iteration at each K, for adaptive speculation (engine/adaptive_policy.py).

A plain decode step for K = 0 and a speculative round of K otherwise, each run as it runs
inside the generation loop (engine/timed_loops.py), round-robin so that their ratios hold on a
noisy machine. What the policy needs is the *marginal* cost of one more iteration: a timed
call also pays a fixed dispatch cost (about 4 ms on the 2-core CPU, three plain steps of the
embedded pair at batch 1), which divided over a few iterations compresses every ratio
towards 1. So each loop is timed at two lengths and the cost is the slope,
(t(long) - t(short)) / (long - short). Results are memoised per shape for the life of the
process, so a second generation of the same shape measures nothing; engine/cost_cache.py
keeps them on disk for later processes. Measuring compiles two loops per candidate and
takes about a minute for the embedded pair at K <= 8, so it shows a progress bar.
"""

from __future__ import annotations

import jax
from tqdm.auto import tqdm

from specjax.core.loop import DEFAULT_CACHE, CacheConfig
from specjax.core.sampling import SamplingConfig
from specjax.drafters import Drafter
from specjax.engine.adaptive_policy import AdaptiveConfig
from specjax.engine.clock import interleaved, median
from specjax.engine.timed_loops import TimedLoop
from specjax.io.model import Model

SHORT, LONG, REPEATS = 2, 10, 7
_SECONDS: dict[tuple, float] = {}  # TimedLoop.key -> marginal seconds per iteration


def measure_round_costs(
    target: Model,
    draft: Model | Drafter,
    batch: int,
    config: AdaptiveConfig,
    context: int,
    sampling: SamplingConfig | float = 0.0,
    repeats: int | None = None,
    cache: CacheConfig = DEFAULT_CACHE,
    progress: bool | None = False,
    remeasure: bool = False,
) -> dict:
    """{candidate label: marginal seconds of one loop iteration} for a batch of `batch` rows
    and a cache of `context` slots: K for chains (0 = a plain step), "tree0", ... for the
    config's trees. sampling: the generation's SamplingConfig (or a bare temperature).

    repeats: timed calls per loop (None: REPEATS). progress: a bar on stderr over the
    compiles and timed calls; None shows it only when stderr is a terminal. remeasure:
    ignore what this process measured before.
    """
    repeats = REPEATS if repeats is None else repeats
    trees = (None,) * len(config.labels) if not config.trees else (None, *config.trees)
    loops = {}
    for label, drafted, tree in zip(config.labels, config.drafted, trees, strict=True):
        room = max(context, 2 * (drafted + 2))  # room for the rounds on a half-filled cache
        part, drafter = ("step", None) if drafted == 0 else ("round", draft)
        loops[label] = TimedLoop(part, target, drafter, batch, drafted, room, sampling, cache=cache, tree=tree)
    todo = {loop.key: (label, loop) for label, loop in loops.items() if remeasure or loop.key not in _SECONDS}
    if todo:
        names = ",".join(str(label) for label, _ in todo.values())
        steps = 2 * len(todo) * (1 + repeats)  # a compile and the timed calls of each loop length
        bar = tqdm(total=steps, desc=f"measuring round costs (K={names})", disable=_disabled(progress), leave=False)
        with bar:
            calls = {}
            for key, (_, loop) in todo.items():
                for n in (SHORT, LONG):
                    calls[(key, n)] = call = loop.call(n)
                    jax.block_until_ready(call())  # the warm-up that compiles
                    bar.update(1)
            times = interleaved(calls, repeats, warmup=0, progress=bar)
        for key in todo:
            short, long = median(times[(key, SHORT)]), median(times[(key, LONG)])
            # Noise can make the slope tiny or negative; a quarter of the long call's average is a
            # floor no real iteration goes under (the fixed cost is below three quarters of it).
            _SECONDS[key] = max((long - short) / (LONG - SHORT), 0.25 * long / LONG)
    return {label: _SECONDS[loop.key] for label, loop in loops.items()}


def _disabled(progress: bool | None) -> bool | None:
    """tqdm's `disable`: None leaves it to tqdm, which draws only on a terminal."""
    return None if progress is None else not progress
