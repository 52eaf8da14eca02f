"""E10: generation throughput against mesh shape, draft replicated or tensor-parallel.

For each mesh of the config ("data=D,model=M"), the bench's target is laid out with
`shard_model` (Megatron tensor parallelism over "model", rows over "data") and its draft
either replicated on every device (no communication in its K sequential steps) or sharded
like the target; plain and speculative decoding of the same requests are then timed
round-robin (bench/measure.py), so each mesh's speedup is a side-by-side ratio. Rows also
carry the all-reduce bytes of a plain step and of a verify forward (parallel/cost.py) and,
per "model" axis size, an all-reduce bandwidth measured on these devices; with it the cost
model predicts the TP efficiency of a plain step from the 1 x 1 step time.

On CPU host devices (XLA_FLAGS=--xla_force_host_platform_device_count=8) the "devices"
share the machine's cores, so only relative figures mean anything: they show that every
layout runs and what its communication costs, not what a GPU or TPU slice would gain.
scripts/gpu_scaling.py runs the same sweep on real accelerators.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from specjax.bench import plots
from specjax.bench.context import BenchContext
from specjax.bench.experiments.shared import Experiment, one_or_swept, setting, timed_text
from specjax.bench.measure import RunSpec, pooled
from specjax.drafters import DraftModel
from specjax.engine.timed_loops import draft_model_of
from specjax.io.sharding import replicate_model, shard_model
from specjax.parallel.cost import tp_allreduce_bytes, tp_efficiency, tp_forward_seconds
from specjax.parallel.layout import plan
from specjax.parallel.mesh import MODEL, mesh_from, mesh_shape, parse_mesh

_DEFAULT_MESHES = ("data=1,model=1", "data=1,model=2", "data=1,model=4", "data=2,model=2", "data=8,model=1")


@dataclasses.dataclass(frozen=True)
class Scaling:
    """E10: tokens/s against mesh shape ("data=D,model=M"), the draft replicated or sharded.

    Needs as many devices as the largest mesh: on CPU, run the bench with
    XLA_FLAGS=--xla_force_host_platform_device_count=8 (figures are then relative only).
    A mesh the target cannot use (heads not divisible) is skipped with the reason recorded.
    """

    meshes: list[str] = dataclasses.field(default_factory=lambda: list(_DEFAULT_MESHES))
    batch_size: int = 8
    num_speculative_tokens: int = 4
    draft_layouts: list[str] = dataclasses.field(default_factory=lambda: ["replicated", "sharded"])
    max_new_tokens: int | None = None  # None: the bench's max_new_tokens
    link_megabytes: float = 4.0  # all-reduce size of the link measurement (0: none)

    def __post_init__(self):
        for mesh in self.meshes:
            parse_mesh(mesh)
        bad = [x for x in self.draft_layouts if x not in ("replicated", "sharded")]
        if bad or not self.draft_layouts:
            raise ValueError(f"scaling.draft_layouts must be 'replicated' and/or 'sharded', got {self.draft_layouts}")
        if self.batch_size < 1 or self.num_speculative_tokens < 1:
            raise ValueError("scaling.batch_size and num_speculative_tokens must be >= 1")


def measure_allreduce(mesh, megabytes: float, repeats: int = 5) -> dict:
    """Bus bandwidth of an all-reduce over the "model" axis: 2 (M - 1) / M * bytes / seconds.

    x [M, n] float32 split over "model" is summed over its first axis into a replicated
    [n]: the collective a tensor-parallel layer ends with.
    """
    m = mesh_shape(mesh)[1]
    n = max(int(megabytes * 2**20 / 4), 1)
    x = jax.device_put(jnp.ones((m, n), jnp.float32), NamedSharding(mesh, P(MODEL, None)))
    reduce = jax.jit(lambda a: jnp.sum(a, axis=0), out_shardings=NamedSharding(mesh, P()))
    jax.block_until_ready(reduce(x))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(reduce(x))
        times.append(time.perf_counter() - start)
    seconds = float(np.median(times))
    return {"model": m, "bytes": 4 * n, "seconds": seconds, "bus_bytes_per_second": 2 * (m - 1) / m * 4 * n / seconds}


def _drafters(ctx: BenchContext, mesh, layouts: list[str]) -> tuple[dict, list[dict]]:
    """label -> drafter on `mesh` for each draft layout that applies, and notes on those skipped."""
    model = draft_model_of(ctx.draft)
    if model is None:  # a drafter without a model (prompt lookup): its weights, if any, follow the target
        return {"draft": ctx.draft}, []
    out, skipped = {}, []
    for layout in layouts:
        if layout == "sharded":
            try:
                placed = shard_model(model, mesh)
            except ValueError as e:
                skipped.append({"draft_layout": layout, "skipped": str(e)})
                continue
        else:
            placed = replicate_model(model, mesh)
        out[f"draft {layout}"] = (
            dataclasses.replace(ctx.draft, model=placed) if isinstance(ctx.draft, DraftModel) else placed
        )
    return out, skipped


def run(ctx: BenchContext) -> dict:
    cfg = ctx.config.scaling
    k, batch = cfg.num_speculative_tokens, cfg.batch_size
    meshes = [mesh_from(m) for m in cfg.meshes]  # fails now, naming the devices needed
    workload = dataclasses.replace(ctx.workload, max_new_tokens=cfg.max_new_tokens or ctx.workload.max_new_tokens)
    links = {}
    rows, skipped = [], []
    for mesh in meshes:
        d, m = mesh_shape(mesh)
        try:
            target = shard_model(ctx.target, mesh)
        except ValueError as e:
            skipped.append({"mesh": f"{d}x{m}", "skipped": str(e)})
            continue
        drafters, notes = _drafters(ctx, mesh, cfg.draft_layouts)
        skipped += [{"mesh": f"{d}x{m}", **n} for n in notes]
        if m > 1 and m not in links and cfg.link_megabytes:
            links[m] = measure_allreduce(mesh, cfg.link_megabytes)
        specs = [RunSpec("plain", batch, 0, 0.0, "none")]
        specs += [RunSpec("speculative", batch, k, 0.0, label) for label in drafters]
        mesh_rows = pooled(
            ctx.measure(specs, f"E10 mesh {d}x{m}", dataclasses.replace(workload, target=target, drafters=drafters))
        )
        plain = next(r for r in mesh_rows if r["method"] == "plain")
        step = tp_allreduce_bytes(target.config, batch // d or 1, 1, m)
        verify = tp_allreduce_bytes(target.config, batch // d or 1, k + 1, m)
        for row in mesh_rows:
            row.update(
                mesh=f"{d}x{m}",
                data=d,
                model=m,
                draft_layout=row["drafter"].removeprefix("draft ") if row["method"] == "speculative" else "none",
                speedup_vs_plain=row["tokens_per_second"] / plain["tokens_per_second"],
                allreduce_bytes_per_step=step["payload_bytes"],
                allreduce_bytes_per_verify=verify["payload_bytes"],
                allreduces_per_forward=step["allreduces"],
                kv_repeat=plan(ctx.target.config, m).kv_repeat,
            )
        rows += mesh_rows
        jax.clear_caches()  # one mesh's programs at a time (bench/compiles.py)
    base = {r["drafter"]: r["tokens_per_second"] for r in rows if r["mesh"] == rows[0]["mesh"]} if rows else {}
    base_step = next((r["ms_per_iteration"] for r in rows if r["method"] == "plain" and r["model"] == 1), None)
    for row in rows:
        if row["drafter"] in base:
            row["tokens_per_second_vs_first_mesh"] = row["tokens_per_second"] / base[row["drafter"]]
        if row["method"] == "plain" and row["model"] > 1 and base_step and row["model"] in links:
            one = base_step / 1e3
            predicted = tp_forward_seconds(
                one,
                ctx.target.config,
                batch // row["data"] or 1,
                1,
                row["model"],
                links[row["model"]]["bus_bytes_per_second"],
            )
            row["predicted_tp_efficiency"] = tp_efficiency(one, predicted, row["model"])
            row["measured_tp_efficiency"] = base_step / (row["model"] * row["ms_per_iteration"])
    return {
        "claim": "tokens/s against mesh shape (relative figures only on CPU host devices, which share cores)",
        "summary": _summary(rows, links, skipped),
        "devices": [str(dev) for dev in jax.devices()],
        "rows": rows,
        "skipped": skipped,
        "links": list(links.values()),
    }


def _summary(rows: list[dict], links: dict, skipped: list[dict]) -> dict:
    """The fastest mesh per method, relative to the first mesh; link bandwidths; what was skipped."""
    out = {}
    for label in dict.fromkeys(r["drafter"] for r in rows):
        best = max((r for r in rows if r["drafter"] == label), key=lambda r: r["tokens_per_second"])
        name = "plain" if label == "none" else label
        out[f"fastest mesh, {name}"] = f"{best['mesh']} ({best.get('tokens_per_second_vs_first_mesh', 1.0):.2f}x first)"
    for m, link in sorted(links.items()):
        out[f"all-reduce bus bandwidth, model={m}"] = f"{link['bus_bytes_per_second'] / 1e9:.2f} GB/s"
    out["skipped"] = len(skipped)
    return out


def _relative_spread(row: dict) -> tuple[float, float]:
    """(below, above) error bar of tokens_per_second_vs_first_mesh: the min-max of the row's
    repeats, on the same scale (0, 0 without them)."""
    relative, repeats = row.get("tokens_per_second_vs_first_mesh"), row.get("tokens_per_second_repeats")
    if relative is None or not repeats:
        return 0.0, 0.0
    scale = relative / row["tokens_per_second"]
    return max(relative - scale * min(repeats), 0.0), max(scale * max(repeats) - relative, 0.0)


def describe(ctx: BenchContext) -> dict:
    cfg = ctx.config.scaling
    meshes = [re.sub(r"^data=(\d+),\s*model=(\d+)$", r"\1x\2", str(m)) for m in cfg.meshes]  # data x model
    extra = [f"K={cfg.num_speculative_tokens}", timed_text(ctx), one_or_swept("mesh", meshes)[1]]
    batch, temperature = one_or_swept("batch", [cfg.batch_size]), one_or_swept("temperature", [0.0])
    return setting(ctx, batch, temperature, extra, new_tokens=cfg.max_new_tokens)


def plot(result: dict, path: Path, title: str) -> Path:
    """Tokens/s relative to the first mesh, per mesh, one bar per method/draft layout (error
    bars: min-max of the repeats)."""
    rows = result["rows"]
    meshes = list(dict.fromkeys(r["mesh"] for r in rows))
    labels = list(dict.fromkeys(r["drafter"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, len(meshes) * 1.2), 4))
    width = 0.8 / max(len(labels), 1)
    for i, label in enumerate(labels):
        mine = {r["mesh"]: r for r in rows if r["drafter"] == label}
        values = [mine[m].get("tokens_per_second_vs_first_mesh", np.nan) if m in mine else np.nan for m in meshes]
        errors = np.array([_relative_spread(mine[m]) if m in mine else (0.0, 0.0) for m in meshes]).T
        xs = np.arange(len(meshes)) + i * width
        ax.bar(xs, values, width, yerr=errors, capsize=2, label="plain" if label == "none" else label)
    ax.set_xticks(np.arange(len(meshes)) + width * (len(labels) - 1) / 2, meshes)
    ax.set_xlabel("mesh (data x model)")
    ax.set_ylabel(f"tokens/s relative to {meshes[0] if meshes else ''}")
    ax.set_title(title)
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.legend(fontsize=7)
    return plots._save(fig, path, result)


EXPERIMENT = Experiment(
    id="E10",
    name="scaling",
    section=Scaling,
    run=run,
    plot=plot,
    setting=describe,
    columns=[
        "mesh",
        "drafter",
        "tokens_per_second",
        "tokens_per_second_vs_first_mesh",
        "speedup_vs_plain",
        "mean_acceptance_length",
        "allreduce_bytes_per_step",
        "measured_tp_efficiency",
        "predicted_tp_efficiency",
    ],
)
