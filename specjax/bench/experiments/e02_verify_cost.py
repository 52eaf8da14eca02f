"""E2: the cost of one target forward of width w (w tokens per row), relative to w = 1.

While decoding is memory-bound, a forward of width w (a verify of K = w - 1 drafts) costs
far less than w forwards of width 1: it streams the same weights and cache. Beside the
timings: the roofline estimate (bytes over bandwidth or FLOPs over peak, both measured on
this device) and each forward's arithmetic intensity.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt

from specjax.bench import plots
from specjax.bench.context import BenchContext
from specjax.bench.cost_model import forward_estimate
from specjax.bench.experiments.shared import Experiment, check_sizes, costs_text, one_or_swept, setting


@dataclasses.dataclass(frozen=True)
class VerifyCost:
    """E2: cost of one target forward of width w, relative to w = 1."""

    widths: list[int] = dataclasses.field(default_factory=lambda: list(range(1, 17)))
    batch_sizes: list[int] = dataclasses.field(default_factory=lambda: [1])
    context: int = 256  # cache slots of the forward (attention reads all of them)

    def __post_init__(self):
        check_sizes([*self.batch_sizes, *self.widths])


def run(ctx: BenchContext) -> dict:
    cfg = ctx.config.verify_cost
    model, machine = ctx.cost_target, ctx.machine()
    rows = []
    for batch in cfg.batch_sizes:
        base = ctx.costs.seconds(model, batch, 1, cfg.context)
        base_roofline = ctx.roofline_seconds(model, batch, 1, cfg.context)
        for width in cfg.widths:
            seconds = ctx.costs.seconds(model, batch, width, cfg.context)
            estimate = forward_estimate(model, batch, width, cfg.context)
            roofline = ctx.roofline_seconds(model, batch, width, cfg.context)
            rows.append(
                {
                    "batch_size": batch,
                    "width": width,
                    "context": cfg.context,
                    "seconds": seconds,
                    "relative_cost": seconds / base,
                    "roofline_relative_cost": roofline / base_roofline,
                    "fraction_of_memory_limit": estimate["bytes_moved"]
                    / machine["memory_bandwidth_bytes_per_second"]
                    / seconds,
                    "achieved_flops_per_second": estimate["flops"] / seconds,
                    **estimate,
                }
            )
    at_16 = [
        r["relative_cost"] for r in rows if r["width"] == max(cfg.widths) and r["batch_size"] == cfg.batch_sizes[0]
    ]
    return {
        "claim": "a forward of width w costs far less than w forwards of width 1 while decode is memory-bound",
        "rows": rows,
        "summary": {f"relative_cost_at_width_{max(cfg.widths)}": at_16[0], **machine},
    }


def describe(ctx: BenchContext) -> dict:
    cfg = ctx.config.verify_cost
    extra = [f"no prompts: forwards alone on a cache of {cfg.context} slots", costs_text(ctx)]
    extra.append(one_or_swept("width", cfg.widths, "=")[1])
    return setting(ctx, one_or_swept("batch", cfg.batch_sizes), (None, "no sampling"), extra, prompts=False)


def plot(result: dict, path: Path, title: str) -> Path:
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, batch in enumerate(sorted({r["batch_size"] for r in result["rows"]})):
        rows = [r for r in result["rows"] if r["batch_size"] == batch]
        widths = [r["width"] for r in rows]
        ax.plot(widths, [r["relative_cost"] for r in rows], "o-", color=f"C{i}", label=f"measured, batch {batch}")
        ax.plot(widths, [r["roofline_relative_cost"] for r in rows], "--", color=f"C{i}", label="roofline estimate")
        ax2.plot(widths, [r["arithmetic_intensity"] for r in rows], "o-", color=f"C{i}", label=f"batch {batch}")
    widths = sorted({r["width"] for r in result["rows"]})
    ax.plot(widths, widths, color="gray", lw=0.8, label="w separate forwards")
    ax.axhline(1.0, color="gray", lw=0.8, ls=":")
    ax.set(xlabel="forward width w (tokens per row)", ylabel="cost relative to w = 1", title=title)
    balance = result["summary"]["machine_balance_flops_per_byte"]
    ax2.axhline(balance, color="red", lw=0.8, ls="--", label=f"machine balance {balance:.0f} FLOP/B")
    ax2.set(xlabel="forward width w", ylabel="FLOPs per byte moved", title="arithmetic intensity (estimate)")
    ax2.set_yscale("log")
    plots._integer_x(ax, ax2)
    for a in (ax, ax2):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    return plots._save(fig, path, result)


EXPERIMENT = Experiment(
    id="E2",
    name="verify_cost",
    section=VerifyCost,
    run=run,
    plot=plot,
    setting=describe,
    columns=["batch_size", "width", "relative_cost", "roofline_relative_cost", "arithmetic_intensity"],
)
