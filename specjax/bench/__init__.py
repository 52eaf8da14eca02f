"""`specjax bench`: config-driven experiments E1-E11 with timing, a cost model and plots.

One module per experiment in experiments/ (experiments/__init__.py says how to add one);
beside it, what they share: the config (bench_config.py), the run context, measurements,
the cost model, prompts, plots and reports.
"""

from specjax.bench.bench_config import EXPERIMENTS, BenchConfig
from specjax.bench.runner import run_bench

__all__ = ["EXPERIMENTS", "BenchConfig", "run_bench"]
