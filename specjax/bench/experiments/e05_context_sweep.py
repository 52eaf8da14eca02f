"""E5: decode and verify cost against context length, beside the KV-cache bytes.

The KV cache grows linearly with context, and a decode step's cost with it. With
`fill_capacity`, a second part: what a decode step costs as the cache's fill and capacity
vary separately, with attention over the filled blocks only or over every slot, for each
KV-cache dtype; and what a narrower cache does to the trained pair's acceptance.

Before blockwise attention every forward read all S preallocated slots, so a call with a
large `max_new_tokens` paid for its whole capacity from the first token on. "full" below
reproduces that (one attention block as large as the cache); "blockwise" is the default.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt

from specjax.bench import plots
from specjax.bench.context import BenchContext
from specjax.bench.cost_model import forward_estimate, kv_cache_bytes
from specjax.bench.experiments.shared import (
    Experiment,
    check_ks,
    cost_prediction,
    costs_text,
    one_or_swept,
    setting,
)
from specjax.bench.measure import POOLED, acceptance
from specjax.core.loop import CacheConfig
from specjax.engine.timed_loops import draft_model_of


@dataclasses.dataclass(frozen=True)
class FillCapacity:
    """E5, second part: a decode step against fill and capacity varied separately, with
    attention over the filled blocks only ("blockwise") and over every slot ("full", the
    behaviour before blockwise attention), for each KV-cache dtype; and the trained pair's
    acceptance with each cache dtype."""

    capacities: list[int] = dataclasses.field(default_factory=lambda: [512, 2048, 8192])
    fills: list[int] = dataclasses.field(default_factory=lambda: [128, 512, 2048])
    cache_dtypes: list[str | None] = dataclasses.field(default_factory=lambda: [None, "bfloat16"])
    attention: list[str] = dataclasses.field(default_factory=lambda: ["blockwise", "full"])


@dataclasses.dataclass(frozen=True)
class ContextSweep:
    """E5: decode and verify cost vs context length, beside the KV-cache bytes."""

    contexts: list[int] = dataclasses.field(default_factory=lambda: [128, 256, 512, 1024, 2048])
    batch_size: int = 1
    num_speculative_tokens: int = 4
    fill_capacity: FillCapacity | None = None  # None: the context sweep alone

    def __post_init__(self):
        check_ks([self.num_speculative_tokens])


def run(ctx: BenchContext) -> dict:
    cfg = ctx.config.context_sweep
    target, draft, k, batch = ctx.cost_target, ctx.cost_draft, cfg.num_speculative_tokens, cfg.batch_size
    draft_model = draft_model_of(draft)
    limit = target.config.max_position_embeddings
    if draft_model is not None:
        limit = min(limit, draft_model.config.max_position_embeddings)
    contexts = [c for c in cfg.contexts if c <= limit]
    loops = ((None, 0), (draft, k))
    ctx.costs.measure_iterations([(target, d, batch, n, c) for c in contexts for d, n in loops])
    rows = []
    for context in contexts:
        estimate = forward_estimate(target, batch, 1, context)
        p = cost_prediction(ctx, k, batch, 0.0, target, draft, context)
        rows.append(
            {
                "context": context,
                "batch_size": batch,
                "num_speculative_tokens": k,
                "decode_seconds": p["cost_plain_step_seconds"],
                "verify_seconds": p["cost_verify_forward_seconds"],
                "round_seconds": p["cost_round_seconds"],
                "predicted_speedup": p["predicted_speedup"],
                "kv_cache_bytes": kv_cache_bytes(target.config, batch, context),
                "weight_bytes": estimate["weight_bytes"],
                "kv_share_of_bytes": estimate["kv_cache_bytes"] / estimate["bytes_moved"],
            }
        )
    for row in rows:
        row["kind"] = "context"
    summary = {"kv_bytes_per_token_per_row": kv_cache_bytes(target.config, 1, 1)}
    if cfg.fill_capacity is not None:
        fill_rows = fill_capacity_rows(ctx, cfg.fill_capacity, batch, k)
        summary.update(fill_summary(fill_rows))
        rows += fill_rows + cache_dtype_rows(ctx, cfg.fill_capacity, k)
    return {
        "claim": "the KV cache grows linearly with context, and decode cost with it (with the fill, not the capacity)",
        "rows": rows,
        "skipped_contexts": [c for c in cfg.contexts if c > limit],
        "summary": summary,
    }


# --- The second part: fill against capacity -------------------------------------------------


def _layout(attention: str, capacity: int, dtype: str | None) -> CacheConfig:
    if attention not in ("blockwise", "full"):
        raise ValueError(f"context_sweep.fill_capacity.attention entries are 'blockwise' or 'full', got {attention!r}")
    block = capacity if attention == "full" else CacheConfig().block_size
    return CacheConfig(dtype=dtype, block_size=block)


def _slots_read(layout: CacheConfig, capacity: int, fill: int) -> int:
    """Slots attention reads for a query at position `fill`: whole blocks up to it."""
    return min(capacity, (fill // layout.block_size + 1) * layout.block_size)


def fill_capacity_rows(ctx: BenchContext, cfg: FillCapacity, batch: int, k: int) -> list[dict]:
    target = ctx.cost_target
    shapes, meta = [], []
    for capacity in cfg.capacities:
        for fill in cfg.fills:
            if fill + k + 2 > capacity:
                continue
            for dtype in cfg.cache_dtypes:
                for attention in cfg.attention:
                    layout = _layout(attention, capacity, dtype)
                    shapes.append((capacity, fill, layout))
                    meta.append((capacity, fill, dtype, attention, layout))
    seconds = ctx.costs.step_seconds(target, batch, shapes)
    rows = []
    for (capacity, fill, dtype, attention, layout), s in zip(meta, seconds, strict=True):
        slots = _slots_read(layout, capacity, fill)
        rows.append(
            {
                "kind": "fill_capacity",
                "capacity": capacity,
                "fill": fill,
                "attention": attention,
                "block_size": layout.block_size,
                "cache_dtype": dtype or target.config.dtype,
                "batch_size": batch,
                "decode_seconds": s,
                "slots_read": slots,
                "kv_bytes_read": kv_cache_bytes(target.config, batch, slots, dtype),
            }
        )
    return rows


def cache_dtype_rows(ctx: BenchContext, cfg: FillCapacity, k: int) -> list[dict]:
    """Greedy acceptance of the trained pair with each KV-cache dtype (both models' caches)."""
    rows = []
    for dtype in cfg.cache_dtypes:
        workload = dataclasses.replace(ctx.workload, cache_config=CacheConfig(dtype=dtype))
        stats = acceptance(workload, k, 0.0)[POOLED]
        rows.append(
            {
                "kind": "cache_dtype_acceptance",
                "cache_dtype": dtype or ctx.target.config.dtype,
                "num_speculative_tokens": k,
                "temperature": 0.0,
                "mean_acceptance_length": stats["mean_acceptance_length"],
                "acceptance_rate": stats["acceptance_rate"],
            }
        )
    return rows


def fill_summary(rows: list[dict]) -> dict:
    """Capacity growth at a fixed fill, and fill growth at a fixed capacity, per attention."""
    out = {}
    dtype = rows[0]["cache_dtype"] if rows else None
    for attention in sorted({r["attention"] for r in rows}):
        mine = [r for r in rows if r["attention"] == attention and r["cache_dtype"] == dtype]
        fills = [r["fill"] for r in mine]
        fill = max(set(fills), key=fills.count)  # the fill measured at the most capacities
        at_fill = sorted((r for r in mine if r["fill"] == fill), key=lambda r: r["capacity"])
        if len(at_fill) > 1:
            low, high = at_fill[0], at_fill[-1]
            key = f"{attention}_capacity_{high['capacity']}_over_{low['capacity']}_at_fill_{fill}"
            out[key] = high["decode_seconds"] / low["decode_seconds"]
        capacity = max(r["capacity"] for r in mine)
        at_capacity = sorted((r for r in mine if r["capacity"] == capacity), key=lambda r: r["fill"])
        if len(at_capacity) > 1:
            low, high = at_capacity[0], at_capacity[-1]
            key = f"{attention}_fill_{high['fill']}_over_{low['fill']}_at_capacity_{capacity}"
            out[key] = high["decode_seconds"] / low["decode_seconds"]
    return out


def describe(ctx: BenchContext) -> dict:
    cfg = ctx.config.context_sweep
    extra = [f"K={cfg.num_speculative_tokens}", costs_text(ctx), one_or_swept("context", cfg.contexts, "=")[1]]
    return setting(ctx, one_or_swept("batch", [cfg.batch_size]), one_or_swept("temperature", [0.0]), extra)


def plot(result: dict, path: Path, title: str) -> Path:
    rows = [r for r in result["rows"] if r.get("kind", "context") == "context"]
    fill_rows = [r for r in result["rows"] if r.get("kind") == "fill_capacity"]
    contexts = [r["context"] for r in rows]
    fig, axes = plt.subplots(1, 3 if fill_rows else 2, figsize=(16 if fill_rows else 11, 4.2))
    ax, ax2 = axes[0], axes[1]
    ax.plot(contexts, [1e3 * r["decode_seconds"] for r in rows], "o-", label="plain decode step")
    ax.plot(contexts, [1e3 * r["verify_seconds"] for r in rows], "s-", label="verify forward (width K+1)")
    ax.plot(contexts, [1e3 * r["round_seconds"] for r in rows], "^-", label="speculative round (draft, verify, accept)")
    ax.set(xlabel="context (cache slots, half filled)", ylabel="ms per forward", title=title)
    ax2.plot(contexts, [r["kv_cache_bytes"] / 2**20 for r in rows], "o-", label="KV cache (all slots)")
    ax2.plot(contexts, [r["weight_bytes"] / 2**20 for r in rows], "--", label="weights read per step")
    ax2.set(xlabel="context (cache slots)", ylabel="MiB", title="bytes per decode step")
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    if fill_rows:
        ax3 = axes[2]
        dtype = fill_rows[0]["cache_dtype"]
        for i, capacity in enumerate(sorted({r["capacity"] for r in fill_rows})):
            for attention, style in (("blockwise", "o-"), ("full", "x--")):
                mine = [
                    r
                    for r in fill_rows
                    if r["capacity"] == capacity and r["attention"] == attention and r["cache_dtype"] == dtype
                ]
                mine.sort(key=lambda r: r["fill"])
                if mine:
                    fills = [r["fill"] for r in mine]
                    times = [1e3 * r["decode_seconds"] for r in mine]
                    ax3.plot(fills, times, style, color=f"C{i}", label=f"capacity {capacity}, {attention}")
        ax3.set(
            xlabel="fill (committed tokens)", ylabel="ms per decode step", title=f"fill vs capacity ({dtype} cache)"
        )
        ax3.set_xscale("log", base=2)
        ax3.set_yscale("log")
        ax3.grid(alpha=0.3)
        ax3.legend(fontsize=7)
    return plots._save(fig, path, result)


EXPERIMENT = Experiment(
    id="E5",
    name="context_sweep",
    section=ContextSweep,
    run=run,
    plot=plot,
    setting=describe,
    ks=lambda cfg: [cfg.num_speculative_tokens],
    columns=[
        "kind",
        "context",
        "capacity",
        "fill",
        "attention",
        "cache_dtype",
        "decode_seconds",
        "verify_seconds",
        "kv_cache_bytes",
        "kv_bytes_read",
        "weight_bytes",
        "mean_acceptance_length",
    ],
)
