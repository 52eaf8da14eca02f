"""`specjax bench`: config-driven experiments E1-E9 with timing, a cost model and plots."""

from specjax.bench.config import EXPERIMENTS, BenchConfig
from specjax.bench.runner import run_bench

__all__ = ["EXPERIMENTS", "BenchConfig", "run_bench"]
