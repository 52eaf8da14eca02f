"""The experiments of `specjax bench`, one module each, registered in one list: MODULES below.

REGISTRY holds what each listed module exports (its `EXPERIMENT`); the rest of the bench
reads only REGISTRY: BenchConfig's sections (bench_config.py), `specjax bench --help`,
the runner (runner.py) and summary.md's columns (report.py).

Adding an experiment (say E12, "draft_cache"):
  1. a new file here, e12_draft_cache.py, that defines
       - its config section, a frozen dataclass (`class DraftCache`): the YAML mapping under
         `draft_cache:` and the `--set draft_cache.field=...` overrides, checked field by field;
       - `run(ctx: BenchContext) -> dict`: {"claim", "rows", "summary", ...}; rows become
         e12_draft_cache.csv (and, when timed, rows of results.csv);
       - `plot(result, path, title) -> Path`: e12_draft_cache.png (bench/plots.py has the
         shared pieces: `_save` writes it with the setting line under it);
       - `describe(ctx) -> dict`: what its figure was measured at (shared.setting);
     and exports them as `EXPERIMENT = Experiment(id="E12", name="draft_cache",
     section=DraftCache, run=run, plot=plot, setting=describe, columns=[...])`, where
     `columns` are the row keys summary.md shows, and `ks` (optional) the K values that
     count toward BenchConfig.max_k, the K the acceptance profile is measured at;
  2. one line, "e12_draft_cache", at the end of MODULES below (id order).
Nothing else changes: BenchConfig gets its `draft_cache:` section and `experiments:` entry,
`specjax bench --help` lists it, the runner runs it and summary.md shows it. Helpers used by
several experiments live in shared.py (plot pieces in bench/plots.py), not in one
experiment's module.
"""

from __future__ import annotations

from importlib import import_module

from specjax.bench.experiments.shared import Experiment

# The registry: one line per experiment, in id order (its module in this package).
MODULES = [
    "e01_tokens_per_round",
    "e02_verify_cost",
    "e03_k_sweep",
    "e04_batch_sweep",
    "e05_context_sweep",
    "e06_waste",
    "e07_sampling",
    "e08_methods",
    "e09_trees",
    "e10_scaling",
    "e11_adaptive",
    "e12_protocol",
]

# What each module exports: everything else (config sections, CLI, runner, summary.md) reads this.
REGISTRY: list[Experiment] = [import_module(f"{__name__}.{module}").EXPERIMENT for module in MODULES]


def by_name(name: str) -> Experiment:
    """The registered experiment called `name` (its config section's key)."""
    for experiment in REGISTRY:
        if experiment.name == name:
            return experiment
    raise KeyError(f"no registered experiment {name!r}; registered: {', '.join(e.name for e in REGISTRY)}")


__all__ = ["REGISTRY", "Experiment", "by_name"]
