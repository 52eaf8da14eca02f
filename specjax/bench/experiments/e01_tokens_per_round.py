"""E1: measured tokens per round against 1 + a + ... + a^K (a = per-position acceptance).

Acceptance is counted, not timed: one generation per prompt category at each K and
temperature. Beside the measurement, two predictions: the geometric series of the pooled
acceptance a, and the product of the per-position acceptances a_i measured at the largest K.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt

from specjax.bench import plots
from specjax.bench.context import BenchContext
from specjax.bench.cost_model import expected_tokens_per_round, geometric_tokens_per_round
from specjax.bench.experiments.shared import COUNTED, ONE_BATCH, Experiment, check_ks, one_or_swept, setting
from specjax.bench.measure import pooled


@dataclasses.dataclass(frozen=True)
class TokensPerRound:
    """E1: measured tokens per round vs 1 + a + ... + a^K."""

    ks: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 3, 4, 6, 8])
    temperatures: list[float] = dataclasses.field(default_factory=lambda: [0.0, 1.0])

    def __post_init__(self):
        check_ks(self.ks)


def _pooled_alpha(stats: dict) -> float:
    """The constant per-position acceptance that fits best: accepted / positions reached."""
    histogram = stats["rounds_accepting"]  # row-rounds that accepted exactly n, n = 0..K
    reached = sum(sum(histogram[i:]) for i in range(len(histogram) - 1))
    return stats["accepted_tokens"] / reached if reached else 0.0


def run(ctx: BenchContext) -> dict:
    cfg = ctx.config.tokens_per_round
    rows = []
    for temperature in cfg.temperatures:
        for category in ctx.categories:
            profile = ctx.profile(temperature, category)
            for k in cfg.ks:
                stats = ctx.acceptance(k, temperature, category)
                alpha = _pooled_alpha(stats)
                rows.append(
                    {
                        "category": category,
                        "temperature": temperature,
                        "num_speculative_tokens": k,
                        "measured_tokens_per_round": stats["mean_acceptance_length"],
                        "alpha": alpha,
                        "predicted_geometric": geometric_tokens_per_round(alpha, k),
                        "predicted_per_position": expected_tokens_per_round(profile, k),
                        "accepted_per_position": stats["accepted_per_position"],
                        "rounds": stats["rounds"],
                    }
                )
    worst = max(abs(r["predicted_geometric"] / r["measured_tokens_per_round"] - 1) for r in pooled(rows))
    return {
        "claim": "E[tokens per round] = 1 + a + ... + a^K (a = per-position acceptance)",
        "rows": rows,
        "summary": {"max_relative_error_geometric": worst},
    }


def describe(ctx: BenchContext) -> dict:
    cfg = ctx.config.tokens_per_round
    extra = [COUNTED, one_or_swept("K", cfg.ks, "=")[1]]
    return setting(ctx, ONE_BATCH, one_or_swept("temperature", cfg.temperatures), extra, counted=True)


def plot(result: dict, path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, temperature in enumerate(sorted({r["temperature"] for r in result["rows"]})):
        rows = [r for r in pooled(result["rows"]) if r["temperature"] == temperature]
        ks = [r["num_speculative_tokens"] for r in rows]
        color = f"C{i}"
        ax.plot(
            ks, [r["measured_tokens_per_round"] for r in rows], "o-", color=color, label=f"measured, T={temperature}"
        )
        ax.plot(ks, [r["predicted_geometric"] for r in rows], "--", color=color, label="1+a+...+a^K (pooled a)")
        ax.plot(ks, [r["predicted_per_position"] for r in rows], ":", color=color, label="product of measured a_i")
    ax.set(xlabel="K (draft tokens per round)", ylabel="tokens per round", title=title)
    plots._integer_x(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return plots._save(fig, path, result)


EXPERIMENT = Experiment(
    id="E1",
    name="tokens_per_round",
    section=TokensPerRound,
    run=run,
    plot=plot,
    setting=describe,
    ks=lambda cfg: cfg.ks,
    columns=[
        "temperature",
        "num_speculative_tokens",
        "measured_tokens_per_round",
        "alpha",
        "predicted_geometric",
        "predicted_per_position",
    ],
)
