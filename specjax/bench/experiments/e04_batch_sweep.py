"""E4: speedup and total tokens/s against batch size at one K.

Batching makes the target's forward compute-bound, so the verify of K + 1 positions stops
being nearly free: the gain shrinks, and can invert. The cost model predicts every batch
size (on cost_target/cost_draft when the config names them, e.g. a large random-weight
target); `end_to_end` also times real generations of the pair beside plain decoding.
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
    costs_text,
    one_or_swept,
    setting,
    timed_text,
)
from specjax.bench.measure import POOLED, RunSpec, pooled


@dataclasses.dataclass(frozen=True)
class BatchSweep:
    """E4: speedup and total tokens/s vs batch size at one K."""

    batch_sizes: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    num_speculative_tokens: int = 4
    temperature: float = 0.0
    end_to_end: bool = True  # also time real generations (needs a trained pair to mean much)

    def __post_init__(self):
        check_ks([self.num_speculative_tokens])
        check_sizes(self.batch_sizes)


def run(ctx: BenchContext) -> dict:
    cfg = ctx.config.batch_sweep
    k, temperature = cfg.num_speculative_tokens, cfg.temperature
    rows = []
    if cfg.end_to_end:
        specs = [RunSpec("speculative", b, k, temperature) for b in cfg.batch_sizes]
        rows = ctx.measure(specs, "E4 batch sweep")
    loops = ((None, 0), (ctx.cost_draft, k))  # plain steps and rounds of K
    ctx.costs.measure_iterations([(ctx.cost_target, d, b, n, ctx.context) for b in cfg.batch_sizes for d, n in loops])
    predictions = []
    for batch in cfg.batch_sizes:
        p = cost_prediction(ctx, k, batch, temperature, ctx.cost_target, ctx.cost_draft, ctx.context)
        plain_tps = batch / p["cost_plain_step_seconds"]
        predictions.append(
            {
                "batch_size": batch,
                "num_speculative_tokens": k,
                "predicted_plain_tokens_per_second": plain_tps,
                "predicted_speculative_tokens_per_second": plain_tps * p["predicted_speedup"],
                **p,
            }
        )
    for row in rows:
        if row["method"] == "speculative" and row["category"] == POOLED:  # predictions use pooled acceptance
            match = next(p for p in predictions if p["batch_size"] == row["batch_size"])
            if not ctx.separate_cost_models:
                row.update({key: match[key] for key in ("predicted_speedup", "predicted_tokens_per_round")})
        if not ctx.separate_cost_models:
            add_overhead(ctx, row, ctx.target, ctx.draft)
    return {
        "claim": "the gain shrinks, and can invert, as batching makes the target compute-bound",
        "rows": rows,
        "predictions": predictions,
        "prediction_models": "cost_target/cost_draft" if ctx.separate_cost_models else "target/draft",
        "summary": {
            "predicted_speedup_by_batch": {p["batch_size"]: p["predicted_speedup"] for p in predictions},
            "measured_speedup_by_batch": {
                r["batch_size"]: r["speedup_vs_plain"] for r in pooled(rows) if r["method"] == "speculative"
            },
        },
    }


def describe(ctx: BenchContext) -> dict:
    cfg = ctx.config.batch_sweep
    extra = [
        f"K={cfg.num_speculative_tokens}",
        timed_text(ctx) if cfg.end_to_end else "predicted only",
        costs_text(ctx),
    ]
    return setting(ctx, one_or_swept("batch", cfg.batch_sizes), one_or_swept("temperature", [cfg.temperature]), extra)


def plot(result: dict, path: Path, title: str) -> Path:
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    predictions = result["predictions"]
    batches = [p["batch_size"] for p in predictions]
    label = f"predicted ({result['prediction_models']})"
    ax.plot(batches, [p["predicted_speedup"] for p in predictions], "s--", color="C0", label=label)
    ax2.plot(
        batches,
        [p["predicted_plain_tokens_per_second"] for p in predictions],
        "--",
        color="C0",
        label="plain, predicted",
    )
    ax2.plot(
        batches,
        [p["predicted_speculative_tokens_per_second"] for p in predictions],
        "--",
        color="C1",
        label="spec, predicted",
    )
    spec = [r for r in plots._spec(result["rows"]) if not r.get("adaptive")]
    if spec:
        plain = [r for r in pooled(result["rows"]) if r["method"] == "plain"]
        if all("speedup_vs_plain_repeats" in r for r in plain):  # plain's own noise around 1
            lows = [min(r["speedup_vs_plain_repeats"]) for r in plain]
            highs = [max(r["speedup_vs_plain_repeats"]) for r in plain]
            batches = [r["batch_size"] for r in plain]
            ax.fill_between(batches, lows, highs, color="0.5", alpha=0.18, lw=0, label="plain: min-max of repeats")
        x = [r["batch_size"] for r in spec]
        plots._measured(ax, x, spec, "speedup_vs_plain", "o-", color="C1", label="measured")
        x = [r["batch_size"] for r in plain]
        plots._measured(ax2, x, plain, "tokens_per_second", "o-", color="C0", label="plain, measured")
        x = [r["batch_size"] for r in spec]
        plots._measured(ax2, x, spec, "tokens_per_second", "o-", color="C1", label="spec, measured")
        adaptive = [r for r in plots._spec(result["rows"]) if r.get("adaptive")]
        if adaptive:
            x = [r["batch_size"] for r in adaptive]
            plots._measured(ax, x, adaptive, "speedup_vs_plain", "D", color="C2", label="adaptive, measured")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(xlabel="batch size", ylabel="speedup vs plain decoding", title=title)
    ax2.set(xlabel="batch size", ylabel="total tokens/s", title="throughput")
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    ax2.set_yscale("log")
    return plots._save(fig, path, result)


EXPERIMENT = Experiment(
    id="E4",
    name="batch_sweep",
    section=BatchSweep,
    run=run,
    plot=plot,
    setting=describe,
    ks=lambda cfg: [cfg.num_speculative_tokens],
    columns=["method", "batch_size", "tokens_per_second", "tpot_ms", "speedup_vs_plain", "predicted_speedup"],
)
