"""E8: drafting methods side by side (draft models, prompt lookup, layer skip, a combinator).

Every method drafts K tokens per round for the same target on the same prompts, at each
temperature, and plain decoding at that temperature is timed in the same round-robin, so
each speedup is a ratio measured side by side. Reported per method, temperature and
prompt category (and pooled, "all"): mean acceptance length, acceptance rate, acceptance
per draft position (how fast it falls with depth), tokens/s,
speedup vs plain, the draft's share of a round, and for prompt lookup the share of
rounds in which it found no match (and proposed a token it expects to be rejected).

Draft share has one definition for every method here, so that methods compare: the
drafter's `propose` timed alone over a whole round, the two timed side by side
(cost_model.round_seconds with share="propose"), at the generation's cache length and the
row's temperature. It depends on shapes only, so all categories of a method share it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt

from specjax.bench import plots
from specjax.bench.context import BenchContext, describe_drafter
from specjax.bench.cost_model import round_seconds
from specjax.bench.experiments.shared import (
    Experiment,
    Method,
    check_ks,
    check_sizes,
    one_or_swept,
    setting,
    timed_text,
)
from specjax.bench.measure import POOLED, RunSpec
from specjax.config import SpeculativeConfig


def _default_methods() -> list[Method]:
    return [Method("draft"), Method("prompt lookup", SpeculativeConfig(method="prompt_lookup", prompt_lookup_max=3))]


@dataclasses.dataclass(frozen=True)
class Methods:
    """E8: drafting methods on the same prompts, each against plain decoding measured beside it."""

    drafters: list[Method] = dataclasses.field(default_factory=_default_methods)
    num_speculative_tokens: int = 4
    temperatures: list[float] = dataclasses.field(default_factory=lambda: [0.0, 1.0])
    batch_size: int = 1

    def __post_init__(self):
        names = [m.name for m in self.drafters]
        if not names or len(set(names)) != len(names) or "none" in names:
            raise ValueError(
                f"methods.drafters needs at least one method, with unique names other than 'none': {names}"
            )
        check_ks([self.num_speculative_tokens])
        check_sizes([self.batch_size])


def _order(ctx: BenchContext, names: list[str]):
    """Rows sorted by temperature, then category (pooled first), then method (plain first)."""
    categories = ctx.categories
    rank = {"none": -1, **{name: i for i, name in enumerate(names)}}
    return lambda row: (row["temperature"], categories.index(row["category"]), rank[row["drafter"]])


def _summary(rows: list[dict], temperatures: list[float], categories: list[str]) -> dict:
    summary = {}
    for t in temperatures:
        for category in categories:
            spec = [r for r in rows if r["method"] == "speculative" and r["temperature"] == t]
            spec = [r for r in spec if r["category"] == category]
            best = max(spec, key=lambda r: r["speedup_vs_plain"])
            suffix = f"T={t}" if category == POOLED else f"T={t}, {category}"
            summary[f"best_method ({suffix})"] = best["drafter"]
            summary[f"best_speedup ({suffix})"] = best["speedup_vs_plain"]
    greedy = [r for r in rows if r["method"] == "speculative" and r["temperature"] == 0.0]
    if greedy:
        summary["greedy_outputs_match_plain"] = all(r["output_matches_plain"] for r in greedy)
    return summary


def round_settings(spec) -> dict:
    """The SpeculativeConfig fields a method's spec sets beyond its drafter and K."""
    named = {"rule": spec.rule, "verify_schedule": spec.verify_schedule}
    return {key: value for key, value in named.items() if value is not None}


def run(ctx: BenchContext) -> dict:
    cfg = ctx.config.methods
    k, batch, temperatures = cfg.num_speculative_tokens, cfg.batch_size, cfg.temperatures
    drafters = ctx.method_drafters  # label -> drafter, in config order
    specs = [RunSpec("speculative", batch, k, t, name) for t in temperatures for name in drafters]
    # A method's spec may name its acceptance rule (`rule: block_verification`) or a verify
    # schedule (`verify_schedule: {widths: [1, 2, 3, 5]}`); they travel with its label.
    settings = {m.name: round_settings(m.draft) for m in cfg.drafters if m.draft is not None}
    rows = ctx.measure(specs, "E8 methods", ctx.workload.with_drafters(drafters, settings))

    # Every round and every proposal (and the plain step) in one round-robin.
    context = ctx.cache_length(k)
    shapes = [(ctx.target, None, batch, 0, context, t) for t in temperatures]
    shapes += [(ctx.target, drafter, batch, k, context, t) for t in temperatures for drafter in drafters.values()]
    ctx.costs.measure_iterations(shapes, proposals="all")
    for row in rows:
        if row["method"] != "speculative":
            continue
        drafter, t = drafters[row["drafter"]], row["temperature"]
        c = round_seconds(ctx.costs, ctx.target, drafter, batch, k, context, t, share="propose")
        row.update(
            draft_time_share=c["draft_share"],
            draft_time_share_definition=c["draft_share_definition"],
            cost_propose_ms=1e3 * c["draft_propose_seconds"],
            cost_round_ms=1e3 * c["round_seconds"],
            cost_plain_step_ms=1e3 * c["plain_step_seconds"],
        )
    rows.sort(key=_order(ctx, list(drafters)))
    specs_by_name = {m.name: m.draft for m in cfg.drafters}
    described = {}
    for name, drafter in drafters.items():
        spec = specs_by_name[name]
        if spec is None:  # the bench's own draft
            spec = None if ctx.given_draft else ctx.config.draft
        described[name] = describe_drafter(drafter, spec)
    return {
        "claim": "which drafting method pays off depends on the text: acceptance, draft cost and speedup per method",
        "rows": rows,
        "drafters": described,
        "summary": _summary(rows, temperatures, ctx.categories),
    }


def describe(ctx: BenchContext) -> dict:
    cfg = ctx.config.methods
    batch, temperature = one_or_swept("batch", [cfg.batch_size]), one_or_swept("temperature", cfg.temperatures)
    return setting(ctx, batch, temperature, [timed_text(ctx)])


def plot(result: dict, path: Path, title: str) -> Path:
    """Bars per method, grouped by category: speedup (top) and mean acceptance length (bottom),
    one column per temperature."""
    rows = [r for r in result["rows"] if r["method"] == "speculative"]
    temperatures = sorted({r["temperature"] for r in rows})
    names = list(dict.fromkeys(r["drafter"] for r in rows))
    categories = [c for c in dict.fromkeys(r["category"] for r in rows) if c != POOLED] + [POOLED]
    width = 0.8 / len(categories)
    fig, axes = plt.subplots(2, len(temperatures), figsize=(6 * len(temperatures), 8), squeeze=False)
    for column, t in enumerate(temperatures):
        for line, (key, label) in enumerate(
            (("speedup_vs_plain", "speedup vs plain"), ("mean_acceptance_length", "mean acceptance length"))
        ):
            ax = axes[line, column]
            for i, category in enumerate(categories):
                mine = {r["drafter"]: r for r in rows if r["temperature"] == t and r["category"] == category}
                present = [n for n in names if n in mine]
                x = [j + (i - (len(categories) - 1) / 2) * width for j, n in enumerate(names) if n in mine]
                hatch = "//" if category == POOLED and len(categories) > 1 else None
                picked = [mine[n] for n in present]
                yerr = plots.spread(picked, key)  # timed: the repeats' min-max; counted: none
                values = [r[key] for r in picked]
                ax.bar(x, values, width, yerr=yerr, capsize=2, label=category, hatch=hatch, color=f"C{i}")
            ax.axhline(1.0, color="gray", lw=0.8)
            ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
            ax.set(ylabel=label, title=f"{title}, T={t}" if line == 0 else f"{label}, T={t}")
            ax.grid(alpha=0.3, axis="y")
            ax.legend(fontsize=7)
    return plots._save(fig, path, result)


EXPERIMENT = Experiment(
    id="E8",
    name="methods",
    section=Methods,
    run=run,
    plot=plot,
    setting=describe,
    columns=[
        "temperature",
        "category",
        "drafter",
        "tokens_per_second",
        "speedup_vs_plain",
        "speedup_vs_plain_paired",
        "mean_acceptance_length",
        "acceptance_rate",
        "accepted_per_position",
        "draft_time_share",
        "no_match_share",
        "output_matches_plain",
    ],
)
