"""E8: drafting methods side by side (draft models, prompt lookup, layer skip, a combinator).

Every method drafts K tokens per round for the same target on the same prompts, at each
temperature, and plain decoding at that temperature is timed in the same round-robin, so
each speedup is a ratio measured side by side. Reported per method, temperature and
prompt category (and pooled, "all"): mean acceptance length, acceptance rate, tokens/s,
speedup vs plain, the draft's share of a round, and for prompt lookup the share of
rounds in which it found no match (and proposed a token it expects to be rejected).

Draft share has one definition for every method here, so that methods compare: the
drafter's `propose` timed alone over a whole round, the two timed side by side
(cost.round_seconds with share="propose"), at the generation's cache length and the
row's temperature. It depends on shapes only, so all categories of a method share it.
"""

from __future__ import annotations

from specjax.bench.context import BenchContext, describe_drafter
from specjax.bench.cost import round_seconds
from specjax.bench.measure import POOLED, RunSpec


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


def methods(ctx: BenchContext) -> dict:
    cfg = ctx.config.methods
    k, batch, temperatures = cfg.num_speculative_tokens, cfg.batch_size, cfg.temperatures
    drafters = ctx.method_drafters  # label -> drafter, in config order
    specs = [RunSpec("speculative", batch, k, t, name) for t in temperatures for name in drafters]
    rows = ctx.measure(specs, "E8 methods", ctx.workload.with_drafters(drafters))

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
