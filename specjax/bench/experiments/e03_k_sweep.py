"""E3: speedup against K at one batch size, measured beside the cost model's prediction.

Speedup vs K has an interior optimum: the draft's cost, the verify width and the wasted
positions all grow with K while the tokens per round saturate. Plain and speculative
decoding are timed round-robin (bench/measure.py); each row also carries the cost model's
prediction and the split of a measured loop iteration into its forwards and the rest.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt

from specjax.bench import plots
from specjax.bench.context import BenchContext
from specjax.bench.experiments.shared import (
    Experiment,
    add_overhead,
    check_ks,
    check_sizes,
    cost_prediction,
    one_or_swept,
    setting,
    timed_text,
)
from specjax.bench.measure import RunSpec, pooled


@dataclasses.dataclass(frozen=True)
class KSweep:
    """E3: speedup vs K at one batch size, measured beside the cost-model prediction."""

    ks: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 3, 4, 6, 8, 12])
    batch_size: int = 1
    temperature: float = 0.0

    def __post_init__(self):
        check_ks(self.ks)
        check_sizes([self.batch_size])


def run(ctx: BenchContext) -> dict:
    cfg = ctx.config.k_sweep
    specs = [RunSpec("speculative", cfg.batch_size, k, cfg.temperature) for k in cfg.ks]
    rows = ctx.measure(specs, "E3 K sweep")
    shapes = [(ctx.target, None, cfg.batch_size, 0, ctx.context)]
    ctx.costs.measure_iterations(shapes + [(ctx.target, ctx.draft, cfg.batch_size, k, ctx.context) for k in cfg.ks])
    for row in rows:
        if row["method"] == "speculative":
            k, category = row["num_speculative_tokens"], row["category"]
            predicted = cost_prediction(
                ctx, k, cfg.batch_size, cfg.temperature, ctx.target, ctx.draft, ctx.context, category
            )
            row.update(predicted)
        add_overhead(ctx, row, ctx.target, ctx.draft)
    # The sweep is the static K rows (`adaptive: true` adds an adaptive twin at the largest K:
    # it is no point of the sweep, so it is not the optimum either).
    spec_rows = [r for r in pooled(rows) if r["method"] == "speculative" and not r.get("adaptive")]
    best = max(spec_rows, key=lambda r: r["speedup_vs_plain"])
    best_predicted = max(spec_rows, key=lambda r: r["predicted_speedup"])
    return {
        "claim": "speedup vs K has an interior optimum (draft cost, verify width and waste grow with K)",
        "rows": rows,
        "summary": {
            "best_k_measured": best["num_speculative_tokens"],
            "best_speedup_measured": best["speedup_vs_plain"],
            "best_k_predicted": best_predicted["num_speculative_tokens"],
            "best_speedup_predicted": best_predicted["predicted_speedup"],
        },
    }


def describe(ctx: BenchContext) -> dict:
    cfg = ctx.config.k_sweep
    extra = [timed_text(ctx), one_or_swept("K", cfg.ks, "=")[1]]
    return setting(ctx, one_or_swept("batch", [cfg.batch_size]), one_or_swept("temperature", [cfg.temperature]), extra)


def plot(result: dict, path: Path, title: str) -> Path:
    """Measured (with the repeats' spread) and predicted speedup against K; a filled star on the
    measured optimum, a hollow one on the predicted; an adaptive twin (`adaptive: true`) as its
    own marker, outside the sweep."""
    spec = plots._spec(result["rows"])
    rows = [r for r in spec if not r.get("adaptive")]
    ks = [r["num_speculative_tokens"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 4.4))
    plots._plain_band(ax, result["rows"])
    plots._measured(ax, ks, rows, "speedup_vs_plain", "o-", color="C0", label="measured")
    ax.plot(ks, [r["predicted_speedup"] for r in rows], "s--", color="C1", label="predicted (cost model)")
    k, value = plots.optimum(rows, "num_speculative_tokens")
    ax.plot([k], [value], "r*", ms=15, zorder=4, label=f"measured optimum: K={k}, {value:.2f}x")
    k, value = plots.optimum(rows, "num_speculative_tokens", "predicted_speedup")
    label = f"predicted optimum: K={k}, {value:.2f}x"
    ax.plot([k], [value], "*", ms=15, mfc="none", mec="C1", mew=1.5, zorder=4, label=label)
    for r in (r for r in spec if r.get("adaptive")):
        label = f"adaptive (K <= {r['num_speculative_tokens']})"
        plots._measured(ax, [r["num_speculative_tokens"]], [r], "speedup_vs_plain", "D", color="C2", label=label)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(xlabel="K (draft tokens per round)", ylabel="speedup vs plain decoding", title=title)
    plots._integer_x(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return plots._save(fig, path, result)


EXPERIMENT = Experiment(
    id="E3",
    name="k_sweep",
    section=KSweep,
    run=run,
    plot=plot,
    setting=describe,
    ks=lambda cfg: cfg.ks,
    columns=[
        "method",
        "num_speculative_tokens",
        "tokens_per_second",
        "tpot_ms",
        "mean_acceptance_length",
        "speedup_vs_plain",
        "predicted_speedup",
        "draft_time_share",
        "ms_per_iteration",
        "cost_round_seconds",
        "non_forward_ms_per_iteration",
    ],
)
