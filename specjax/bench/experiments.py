"""E1-E7: one function per claim of the seed article, each returning rows and a summary
(E8, the drafting methods, is in methods.py; E9, token trees, in trees.py).

Every experiment returns {"claim", "rows", "summary"}; rows become the experiment's CSV
and plot. "measured" always means timed or counted in this run; "predicted" always means
the cost model (measured forward costs x measured acceptance), and is labelled so. Rows
carry a `category`: "all" pooled over every prompt, and one row per prompt category when
the prompts have several; plots and summaries use the pooled rows.
"""

from __future__ import annotations

import re

from specjax.bench.adaptive import adaptive_sweep
from specjax.bench.context import BenchContext
from specjax.bench.cost import (
    batch_tokens_per_round,
    draft_seconds,
    expected_tokens_per_round,
    forward_estimate,
    geometric_tokens_per_round,
    kv_cache_bytes,
    predicted_speedup,
    round_seconds,
)
from specjax.bench.distribution import distribution_test
from specjax.bench.fill import cache_dtype_rows, fill_capacity_rows, fill_summary
from specjax.bench.measure import POOLED, RunSpec, pooled
from specjax.bench.methods import methods
from specjax.bench.scaling import scaling
from specjax.bench.trees import describe_sources, trees
from specjax.engine.timed_loops import draft_model_of


def _pooled_alpha(stats: dict) -> float:
    """The constant per-position acceptance that fits best: accepted / positions reached."""
    histogram = stats["rounds_accepting"]  # row-rounds that accepted exactly n, n = 0..K
    reached = sum(sum(histogram[i:]) for i in range(len(histogram) - 1))
    return stats["accepted_tokens"] / reached if reached else 0.0


def tokens_per_round(ctx: BenchContext) -> dict:
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


def verify_cost(ctx: BenchContext) -> dict:
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


def _predict(
    ctx: BenchContext, k: int, batch: int, temperature: float, target, draft, context: int, category: str = POOLED
) -> dict:
    """Cost-model prediction from the costs of (target, draft) and the acceptance of `category`."""
    components = round_seconds(ctx.costs, target, draft, batch, k, context)
    # Per row and round, with the batch's stragglers and the cut last round counted.
    tokens = batch_tokens_per_round(ctx.profile(temperature, category), k, ctx.config.max_new_tokens, batch)
    costs = {
        f"cost_{name}": v for name, v in components.items() if name not in ("draft_share", "draft_share_definition")
    }
    return {
        "predicted_tokens_per_round": tokens,
        "predicted_speedup": predicted_speedup(tokens, components),
        "draft_time_share": components["draft_share"],
        "draft_time_share_definition": components["draft_share_definition"],
        **costs,
    }


def _add_overhead(ctx: BenchContext, row: dict, target, draft) -> None:
    """Split a measured loop iteration into its forwards (or proposal) and everything else."""
    batch, k = row["batch_size"], row["num_speculative_tokens"]
    if row["method"] == "plain":
        forwards = ctx.costs.seconds(target, batch, 1, ctx.context)
    else:
        c = round_seconds(ctx.costs, target, draft, batch, k, ctx.context)
        forwards = draft_seconds(c) + c["verify_forward_seconds"]
    row["forward_ms_per_iteration"] = 1e3 * forwards
    row["non_forward_ms_per_iteration"] = row["ms_per_iteration"] - 1e3 * forwards


def k_sweep(ctx: BenchContext) -> dict:
    cfg = ctx.config.k_sweep
    specs = [RunSpec("speculative", cfg.batch_size, k, cfg.temperature) for k in cfg.ks]
    rows = ctx.measure(specs, "E3 K sweep")
    shapes = [(ctx.target, None, cfg.batch_size, 0, ctx.context)]
    ctx.costs.measure_iterations(shapes + [(ctx.target, ctx.draft, cfg.batch_size, k, ctx.context) for k in cfg.ks])
    for row in rows:
        if row["method"] == "speculative":
            k, category = row["num_speculative_tokens"], row["category"]
            row.update(_predict(ctx, k, cfg.batch_size, cfg.temperature, ctx.target, ctx.draft, ctx.context, category))
        _add_overhead(ctx, row, ctx.target, ctx.draft)
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


def batch_sweep(ctx: BenchContext) -> dict:
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
        p = _predict(ctx, k, batch, temperature, ctx.cost_target, ctx.cost_draft, ctx.context)
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
            _add_overhead(ctx, row, ctx.target, ctx.draft)
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


def context_sweep(ctx: BenchContext) -> dict:
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
        p = _predict(ctx, k, batch, 0.0, target, draft, context)
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


def waste(ctx: BenchContext) -> dict:
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


def sampling(ctx: BenchContext) -> dict:
    cfg = ctx.config.sampling
    rows = []
    for temperature in cfg.temperatures:
        for category in ctx.categories:
            for k in cfg.ks:
                stats = ctx.acceptance(k, temperature, category)
                rows.append(
                    {
                        "category": category,
                        "temperature": temperature,
                        "num_speculative_tokens": k,
                        "acceptance_rate": stats["acceptance_rate"],
                        "mean_acceptance_length": stats["mean_acceptance_length"],
                    }
                )
    prompt = ctx.workload.prompts[0][:16]  # short: every sample is a row of one batch
    tests = distribution_test(
        ctx.target,
        ctx.draft,
        prompt,
        cfg.test_num_speculative_tokens,
        cfg.test_temperature,
        cfg.test_samples,
        ctx.config.seed,
    )
    for test in tests:
        test["passes"] = min(test["p_value_token_1"], test["p_value_token_2"]) > cfg.p_value_threshold
    exact, control = tests
    return {
        "claim": "speculative sampling preserves the target distribution; acceptance depends on temperature",
        "rows": rows,
        "distribution_test": tests,
        "summary": {
            "exact_rule_passes": exact["passes"],
            "negative_control_fails": not control["passes"],
            "p_value_threshold": cfg.p_value_threshold,
        },
    }


def _listed(values) -> str:
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def _one_or_swept(name: str, values, sep: str = " ") -> tuple[object, str]:
    """(value or list, text): "temperature 0" for one value, "temperature swept: 0, 1" for several."""
    values = list(dict.fromkeys(values))
    if len(values) == 1:
        return values[0], f"{name}{sep}{_listed(values)}"
    return values, f"{name} swept: {_listed(values)}"


def setting(name: str, ctx: BenchContext) -> dict:
    """What an experiment's figure was measured at: batch size, temperature and prompt count
    (a list where the experiment sweeps it), the timed repeats, and the same as one line of
    text that every plot and summary.md show."""
    c = ctx.config
    prompts, new_tokens = len(ctx.workload.prompts), c.max_new_tokens
    repeats = c.timing.repeats
    timed = f"medians of {repeats} timed repeats (error bars: min-max)"
    costs = f"cost timings: medians of {repeats} repeats of {c.timing.cost_inner} iterations"
    counted = "acceptance counted, not timed"
    one_batch = "each prompt category in one batch"
    out: dict = {"prompts": prompts, "repeats": repeats}
    extra: list[str] = []
    if name in ("tokens_per_round", "sampling"):
        cfg = getattr(c, name)
        batch, batch_text = None, one_batch
        temperature, temperature_text = _one_or_swept("temperature", cfg.temperatures)
        extra = [counted, _one_or_swept("K", cfg.ks, "=")[1]]
        if name == "sampling":
            extra.append(
                f"distribution test: 1 prompt, {cfg.test_samples} samples at temperature {cfg.test_temperature:g}, "
                f"K={cfg.test_num_speculative_tokens}"
            )
        out["repeats"] = None
    elif name == "waste":
        batch, batch_text = None, one_batch
        temperature, temperature_text = _one_or_swept("temperature", [c.waste.temperature])
        extra, out["repeats"] = [counted, _one_or_swept("K", c.waste.ks, "=")[1]], None
    elif name == "verify_cost":
        cfg = c.verify_cost
        batch, batch_text = _one_or_swept("batch", cfg.batch_sizes)
        temperature, temperature_text = None, "no sampling"
        prompts, out["prompts"] = None, None
        extra = [f"no prompts: forwards alone on a cache of {cfg.context} slots", costs]
        extra.append(_one_or_swept("width", cfg.widths, "=")[1])
    elif name == "k_sweep":
        cfg = c.k_sweep
        batch, batch_text = _one_or_swept("batch", [cfg.batch_size])
        temperature, temperature_text = _one_or_swept("temperature", [cfg.temperature])
        extra = [timed, _one_or_swept("K", cfg.ks, "=")[1]]
    elif name == "batch_sweep":
        cfg = c.batch_sweep
        batch, batch_text = _one_or_swept("batch", cfg.batch_sizes)
        temperature, temperature_text = _one_or_swept("temperature", [cfg.temperature])
        extra = [f"K={cfg.num_speculative_tokens}", timed if cfg.end_to_end else "predicted only", costs]
    elif name == "context_sweep":
        cfg = c.context_sweep
        batch, batch_text = _one_or_swept("batch", [cfg.batch_size])
        temperature, temperature_text = _one_or_swept("temperature", [0.0])
        extra = [f"K={cfg.num_speculative_tokens}", costs, _one_or_swept("context", cfg.contexts, "=")[1]]
    elif name in ("methods", "trees"):
        cfg = getattr(c, name)
        batch, batch_text = _one_or_swept("batch", [cfg.batch_size])
        temperature, temperature_text = _one_or_swept("temperature", cfg.temperatures)
        extra = [timed]
    elif name == "scaling":
        cfg = c.scaling
        batch, batch_text = _one_or_swept("batch", [cfg.batch_size])
        temperature, temperature_text = _one_or_swept("temperature", [0.0])
        new_tokens = cfg.max_new_tokens or new_tokens
        meshes = [re.sub(r"^data=(\d+),\s*model=(\d+)$", r"\1x\2", str(m)) for m in cfg.meshes]  # data x model
        extra = [f"K={cfg.num_speculative_tokens}", timed, _one_or_swept("mesh", meshes)[1]]
    elif name == "adaptive_sweep":
        cfg = c.adaptive_sweep
        batch, batch_text = _one_or_swept("batch", cfg.batch_sizes)
        temperature, temperature_text = _one_or_swept("temperature", [cfg.temperature])
        extra = [timed]
        if cfg.shift_prompts is not None:
            sources = cfg.shift_prompts if isinstance(cfg.shift_prompts, list) else [cfg.shift_prompts]
            extra.append(f"shift: {describe_sources(sources)}, batch 1")
    else:
        raise ValueError(f"no setting for experiment {name!r}")
    parts = [batch_text, temperature_text]
    if prompts is not None:
        parts.append(f"{prompts} prompts, {new_tokens} new tokens each")
    out.update(batch_size=batch, temperature=temperature, max_new_tokens=new_tokens)
    out["text"] = "; ".join([*parts, *extra])
    return out


EXPERIMENT_FUNCTIONS = {
    "tokens_per_round": tokens_per_round,
    "verify_cost": verify_cost,
    "k_sweep": k_sweep,
    "batch_sweep": batch_sweep,
    "context_sweep": context_sweep,
    "waste": waste,
    "sampling": sampling,
    "methods": methods,
    "trees": trees,
    "scaling": scaling,
    "adaptive_sweep": adaptive_sweep,
}
