"""E5, second part: what a decode step costs as the cache's fill and capacity vary
separately, with attention over the filled blocks only or over every slot, for each
KV-cache dtype; and what a narrower cache does to the trained pair's acceptance.

Before blockwise attention every forward read all S preallocated slots, so a call with a
large `max_new_tokens` paid for its whole capacity from the first token on. "full" below
reproduces that (one attention block as large as the cache); "blockwise" is the default.
"""

from __future__ import annotations

import dataclasses

from specjax.bench.config import FillCapacity
from specjax.bench.context import BenchContext
from specjax.bench.cost import kv_cache_bytes
from specjax.bench.measure import POOLED, acceptance
from specjax.core.loop import CacheConfig


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
