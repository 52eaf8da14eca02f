"""E6: drafted, accepted, correction/bonus and wasted positions per round.

Every position verified after the first rejection is wasted work: a round of K verifies
K + 1 positions and keeps the accepted prefix plus one correction (or bonus) token.
Counted, not timed, per K and prompt category; the figure adds the share of rounds that
accepted exactly n = 0..K drafts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt

from specjax.bench import plots
from specjax.bench.context import BenchContext
from specjax.bench.experiments.shared import COUNTED, ONE_BATCH, Experiment, check_ks, one_or_swept, setting
from specjax.bench.measure import pooled


@dataclasses.dataclass(frozen=True)
class Waste:
    """E6: drafted, accepted, correction/bonus and wasted positions per round."""

    ks: list[int] = dataclasses.field(default_factory=lambda: [2, 4, 8])
    temperature: float = 0.0

    def __post_init__(self):
        check_ks(self.ks)


def run(ctx: BenchContext) -> dict:
    cfg = ctx.config.waste
    rows = []
    for category in ctx.categories:
        for k in cfg.ks:
            rows.append(_waste_row(ctx.acceptance(k, cfg.temperature, category), k, cfg.temperature, category))
    return {
        "claim": "every position verified after the first rejection is wasted work",
        "rows": rows,
        "summary": {f"wasted_per_round_k{r['num_speculative_tokens']}": r["wasted_per_round"] for r in pooled(rows)},
    }


def _waste_row(stats: dict, k: int, temperature: float, category: str) -> dict:
    rounds = stats["rounds"]
    histogram = stats["rounds_accepting"]
    return {
        "category": category,
        "num_speculative_tokens": k,
        "temperature": temperature,
        "rounds": rounds,
        "verified_positions_per_round": k + 1,
        "drafted_per_round": k,
        "accepted_per_round": stats["accepted_tokens"] / rounds,
        "correction_per_round": sum(histogram[:k]) / rounds,
        "bonus_per_round": histogram[k] / rounds,
        "wasted_per_round": stats["wasted_positions"] / rounds,
        "kept_fraction_of_verified": (stats["accepted_tokens"] + rounds) / ((k + 1) * rounds),
        "rounds_accepting": histogram,
    }


def describe(ctx: BenchContext) -> dict:
    cfg = ctx.config.waste
    extra = [COUNTED, one_or_swept("K", cfg.ks, "=")[1]]
    return setting(ctx, ONE_BATCH, one_or_swept("temperature", [cfg.temperature]), extra, counted=True)


def acceptance_histogram(rows: list[dict]) -> dict[str, list[float]]:
    """E6's bars: per K, the share of row-rounds that accepted exactly n = 0..K draft tokens."""
    return {
        f"K={r['num_speculative_tokens']}": [h / r["rounds"] if r["rounds"] else 0.0 for h in r["rounds_accepting"]]
        for r in rows
    }


def plot(result: dict, path: Path, title: str) -> Path:
    rows = pooled(result["rows"])
    labels = [f"K={r['num_speculative_tokens']}" for r in rows]
    parts = [
        ("accepted_per_round", "accepted drafts"),
        ("correction_per_round", "correction"),
        ("bonus_per_round", "bonus"),
        ("wasted_per_round", "wasted (after first rejection)"),
    ]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    bottom = [0.0] * len(rows)
    for key, name in parts:
        values = [r[key] for r in rows]
        ax.bar(labels, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set(ylabel="verified positions per round", title=title)
    ax.legend(fontsize=7)
    shares = acceptance_histogram(rows)
    width = 0.8 / max(len(shares), 1)
    colors = plt.cm.viridis([i / max(len(shares) - 1, 1) for i in range(len(shares))])
    for i, (label, share) in enumerate(shares.items()):
        x = [n + (i - (len(shares) - 1) / 2) * width for n in range(len(share))]
        ax2.bar(x, share, width, color=colors[i], label=label)
    ax2.set(xlabel="draft tokens accepted in the round", ylabel="share of rounds", title="acceptance per round")
    plots._integer_x(ax2)
    ax2.grid(alpha=0.3, axis="y")
    ax2.legend(fontsize=7)
    return plots._save(fig, path, result)


EXPERIMENT = Experiment(
    id="E6",
    name="waste",
    section=Waste,
    run=run,
    plot=plot,
    setting=describe,
    ks=lambda cfg: cfg.ks,
    columns=[
        "num_speculative_tokens",
        "accepted_per_round",
        "correction_per_round",
        "bonus_per_round",
        "wasted_per_round",
        "kept_fraction_of_verified",
    ],
)
