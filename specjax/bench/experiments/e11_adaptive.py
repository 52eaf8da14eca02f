"""E11: adaptive speculation against plain decoding and every static K, side by side.

Four scenarios, each timed round-robin with its plain baseline (bench/measure.py), so every
ratio below is measured in one run:
  1. random: a random-weight draft of the pair's draft shape (acceptance near 0): adaptive
     should stay >= 0.95x plain, while a static K = `random_k` pays for rejected drafts.
  2. pair: the bench's pair at batch 1: adaptive against the best static K of `static_ks`
     (the E3 sweep, in the same run): aim >= 0.97x.
  3. batch: every other batch size of `batch_sizes` (batch 1 is scenario 2): adaptive
     against max(plain, best static K): aim >= 0.95x.
  4. shift: prompts whose acceptance shifts mid-generation (default: code that repeats a
     block, which prompt lookup copies, then goes on with new code), with `shift_drafter`:
     adaptive should beat every static K.
Adaptive runs use K_MAX = `k_max` and measure their own round costs at each shape
(engine/round_costs.py). `predict_batch_sizes` adds predictions (bench/adaptive_predict.py):
the real policy and every static K simulated on the cost models' measured round costs and
the pair's measured acceptance, for batches (or a target) too large to run here.
Rows carry the policy's rounds per K; `trajectory` holds the K it
chose and its estimate of position-1 acceptance, round by round, for the first shift prompt.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt

from specjax.api import generate
from specjax.bench import plots
from specjax.bench.adaptive_predict import predict
from specjax.bench.context import BenchContext
from specjax.bench.drafter_spec import Raw, parse_draft
from specjax.bench.experiments.shared import Experiment, one_or_swept, setting, timed_text
from specjax.bench.measure import DRAFT, RunSpec, Workload, pooled
from specjax.bench.prompt_sets import Prompts, describe_sources, load_prompts, parse_prompts
from specjax.config import GenerationConfig, SpeculativeConfig
from specjax.drafters import DraftModel
from specjax.engine.adaptive_policy import AdaptiveConfig, default_ks
from specjax.engine.round_costs import measure_round_costs
from specjax.io.model import init_model


@dataclasses.dataclass(frozen=True)
class AdaptiveSweep:
    """E11: adaptive speculation (K_MAX = k_max) against plain decoding and static K
    (the module docstring says what each scenario measures and aims at)."""

    k_max: int = 8
    static_ks: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 4, 8])
    batch_sizes: list[int] = dataclasses.field(default_factory=lambda: [1, 4, 16, 64])
    temperature: float = 0.0
    random_draft: bool = True  # scenario 1: a random-weight draft of the bench draft's shape
    random_k: int = 4
    # Scenario 4: prompts whose acceptance shifts mid-generation, drafted by `shift_drafter`
    # (a drafter spec as in `draft`). None: skipped.
    shift_prompts: Prompts | list[Prompts] | Raw | None = None
    shift_drafter: str | Raw = "prompt-lookup"  # a SpeculativeConfig (bench/drafter_spec.py)
    # Predicted, not run: the policy and static K simulated on the round costs of the cost
    # models (cost_target/cost_draft, else the pair) at these batch sizes, with the pair's
    # acceptance (bench/adaptive_predict.py). Empty: no prediction.
    predict_batch_sizes: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if any(b < 1 for b in self.predict_batch_sizes):
            raise ValueError(f"adaptive_sweep.predict_batch_sizes must be >= 1, got {self.predict_batch_sizes}")
        if self.shift_prompts is not None:
            object.__setattr__(self, "shift_prompts", parse_prompts(self.shift_prompts))
        object.__setattr__(self, "shift_drafter", parse_draft(self.shift_drafter, "adaptive_sweep.shift_drafter"))
        if self.k_max < 1 or not self.static_ks or min(self.static_ks) < 1 or max(self.static_ks) > self.k_max:
            raise ValueError(
                f"adaptive_sweep.static_ks must be K values in [1, k_max={self.k_max}], got {self.static_ks}"
            )
        if not self.batch_sizes or min(self.batch_sizes) < 1 or self.random_k < 1:
            raise ValueError("adaptive_sweep.batch_sizes and random_k must be >= 1")


AIMS = {"random": 0.95, "pair": 0.97, "batch": 0.95}


def _static(batch: int, ks, temperature: float, drafter: str = DRAFT) -> list[RunSpec]:
    return [RunSpec("speculative", batch, k, temperature, drafter) for k in ks]


def _adaptive(batch: int, k_max: int, temperature: float, drafter: str = DRAFT) -> RunSpec:
    return RunSpec("speculative", batch, k_max, temperature, drafter, adaptive=True)


def _compare(rows: list[dict], scenario: str, batch: int) -> dict:
    """Pooled speedups of one scenario at one batch size: plain = 1, each static K, adaptive."""
    rows = [r for r in pooled(rows) if r["batch_size"] == batch]
    spec = [r for r in rows if r["method"] == "speculative"]
    static = {r["num_speculative_tokens"]: r["speedup_vs_plain"] for r in spec if not r.get("adaptive")}
    adaptive = next(r for r in rows if r.get("adaptive"))
    best_k = max(static, key=static.get)
    best = max(1.0, static[best_k]) if scenario != "pair" else static[best_k]
    out = {
        "scenario": scenario,
        "batch_size": batch,
        "adaptive_speedup_vs_plain": adaptive["speedup_vs_plain"],
        "adaptive_speedup_vs_plain_paired": adaptive["speedup_vs_plain_paired"],
        "static_speedups": static,
        "best_static_k": best_k,
        "adaptive_vs_best": adaptive["speedup_vs_plain"] / best,
        "adaptive_rounds_per_k": adaptive["adaptive_rounds_per_k"],
        "adaptive_mean_k": adaptive["adaptive_mean_k"],
    }
    if scenario in AIMS:
        out["aim"] = AIMS[scenario]
        out["meets_aim"] = out["adaptive_vs_best"] >= AIMS[scenario]
    else:  # shift: beat every static K
        out["meets_aim"] = adaptive["speedup_vs_plain"] > max(static.values())
    return out


def _label(rows: list[dict], scenario: str) -> list[dict]:
    for row in rows:
        row["scenario"] = scenario
    return rows


def run(ctx: BenchContext) -> dict:
    cfg = ctx.config.adaptive_sweep
    t, k_max, rows, comparisons = cfg.temperature, cfg.k_max, [], []

    if cfg.random_draft:
        if not isinstance(ctx.draft, DraftModel):
            raise ValueError("adaptive_sweep.random_draft needs the bench's draft to be a model (its shape is reused)")
        random = DraftModel(init_model(ctx.draft.config, seed=ctx.config.seed + 101))
        workload = ctx.workload.with_drafters({"random": random})
        specs = [*_static(1, [cfg.random_k], t, "random"), _adaptive(1, k_max, t, "random")]
        found = _label(ctx.measure(specs, "E11 random draft", workload), "random")
        rows += found
        comparisons.append(_compare(found, "random", 1))

    for batch in cfg.batch_sizes:
        scenario = "pair" if batch == 1 else "batch"
        specs = [*_static(batch, cfg.static_ks, t), _adaptive(batch, k_max, t)]
        found = _label(ctx.measure(specs, f"E11 batch {batch}", ctx.workload), scenario)
        rows += found
        comparisons.append(_compare(found, scenario, batch))

    trajectory = None
    if cfg.shift_prompts is not None:
        drafter = ctx.build_drafter(cfg.shift_drafter)
        prompts = load_prompts(
            [cfg.shift_prompts] if not isinstance(cfg.shift_prompts, list) else cfg.shift_prompts, ctx.target.tokenizer
        )
        workload = Workload(
            ctx.target,
            {"shift": drafter},
            prompts.tokens,
            prompts.categories,
            ctx.config.max_new_tokens,
            ctx.config.seed,
        )
        specs = [*_static(1, cfg.static_ks, t, "shift"), _adaptive(1, k_max, t, "shift")]
        found = _label(ctx.measure(specs, "E11 shifting acceptance", workload), "shift")
        rows += found
        comparisons.append(_compare(found, "shift", 1))
        config = GenerationConfig.at_temperature(
            t, max_new_tokens=ctx.config.max_new_tokens, seed=ctx.config.seed, ignore_eos=True
        )
        speculative = SpeculativeConfig(num_speculative_tokens=k_max, adaptive=True)
        first = generate(ctx.target, prompts.tokens[:1], config, draft=drafter, speculative=speculative)
        trajectory = {
            "chosen_k": first.stats.adaptive["chosen_k"],
            "estimate_position_1": first.stats.adaptive["estimate_position_1"],
        }

    predictions = _predictions(ctx) if cfg.predict_batch_sizes else []
    summary = {
        f"{c['scenario']} (batch {c['batch_size']})": {
            "adaptive_vs_best": round(c["adaptive_vs_best"], 3),
            "meets_aim": c["meets_aim"],
        }
        for c in comparisons
    }
    for p in predictions:
        summary[f"predicted (batch {p['batch_size']})"] = {
            "adaptive_vs_best": round(p["adaptive_vs_best"], 3),
            "meets_aim": p["meets_aim"],
        }
    return {
        "claim": "choosing K each round from past acceptance and measured costs is never much slower than "
        "plain decoding or the best static K, and beats every static K when acceptance shifts",
        "rows": rows,
        "comparisons": comparisons,
        "trajectory": trajectory,
        "predictions": predictions,
        "prediction_models": "cost_target/cost_draft" if ctx.separate_cost_models else "target/draft",
        "summary": summary,
    }


def _predictions(ctx: BenchContext) -> list[dict]:
    """Predicted adaptive and static-K speedups at each of `predict_batch_sizes` (module docstring)."""
    cfg = ctx.config.adaptive_sweep
    config = AdaptiveConfig().resolved(cfg.k_max)
    labels = tuple(sorted({*default_ks(cfg.k_max), *cfg.static_ks}))
    measured = AdaptiveConfig(ks=labels).resolved(cfg.k_max)  # every K either side needs
    profile = ctx.profile(cfg.temperature)
    out = []
    for batch in cfg.predict_batch_sizes:
        costs = measure_round_costs(ctx.cost_target, ctx.cost_draft, batch, measured, ctx.context, cfg.temperature)
        p = predict(config, costs, profile, batch, ctx.config.max_new_tokens, cfg.static_ks)
        p["meets_aim"] = p["adaptive_vs_best"] >= AIMS["batch"]
        p["aim"] = AIMS["batch"]
        out.append(p)
    return out


def _scenario_rows(result: dict, comparison: dict) -> list[dict | None]:
    """The pooled rows behind one comparison's bars: plain, each static K, adaptive (None where missing)."""
    rows = [
        r
        for r in pooled(result["rows"])
        if r.get("scenario") == comparison["scenario"] and r["batch_size"] == comparison["batch_size"]
    ]
    plain = next((r for r in rows if r["method"] == "plain"), None)
    static = {r["num_speculative_tokens"]: r for r in rows if r["method"] == "speculative" and not r.get("adaptive")}
    adaptive = next((r for r in rows if r.get("adaptive")), None)
    return [plain, *(static.get(int(k)) for k in comparison["static_speedups"]), adaptive]


def _bar_errors(rows: list[dict | None], values: list[float]):
    """Min-max of each bar's repeats (speedup_vs_plain_repeats), or None without them."""
    if any(r is None or "speedup_vs_plain_repeats" not in r for r in rows):
        return None
    below = [max(v - min(r["speedup_vs_plain_repeats"]), 0.0) for r, v in zip(rows, values, strict=True)]
    above = [max(max(r["speedup_vs_plain_repeats"]) - v, 0.0) for r, v in zip(rows, values, strict=True)]
    return [below, above]


def describe(ctx: BenchContext) -> dict:
    cfg = ctx.config.adaptive_sweep
    extra = [timed_text(ctx)]
    if cfg.shift_prompts is not None:
        sources = cfg.shift_prompts if isinstance(cfg.shift_prompts, list) else [cfg.shift_prompts]
        extra.append(f"shift: {describe_sources(sources)}, batch 1")
    return setting(ctx, one_or_swept("batch", cfg.batch_sizes), one_or_swept("temperature", [cfg.temperature]), extra)


def plot(result: dict, path: Path, title: str) -> Path:
    """Adaptive and every static K as speedup vs plain, per scenario (error bars: min-max of
    the repeats); the predictions; the shift trajectory."""
    comparisons, predictions = result["comparisons"], result.get("predictions") or []
    panels = len(comparisons) + (result["trajectory"] is not None) + bool(predictions)
    fig, axes = plt.subplots(1, panels, figsize=(3.2 * panels, 3.4), squeeze=False)
    for ax, c in zip(axes[0], comparisons, strict=False):
        labels = ["plain", *(f"K={k}" for k in c["static_speedups"]), "adaptive"]
        values = [1.0, *c["static_speedups"].values(), c["adaptive_speedup_vs_plain"]]
        colors = ["0.6"] * (len(values) - 1) + ["tab:red"]
        yerr = _bar_errors(_scenario_rows(result, c), values)
        ax.bar(range(len(values)), values, color=colors, yerr=yerr, capsize=2)
        ax.set_xticks(range(len(values)), labels, rotation=60, fontsize=7)
        ax.axhline(1.0, color="k", lw=0.5)
        ax.set_title(f"{c['scenario']}, batch {c['batch_size']}", fontsize=9)
        ax.set_ylabel("speedup vs plain")
    if predictions:
        ax = axes[0][len(comparisons)]
        batches = [p["batch_size"] for p in predictions]
        for k in predictions[0]["predicted_static_speedups"]:
            ax.plot(batches, [p["predicted_static_speedups"][k] for p in predictions], "o-", color="0.7", lw=0.8)
        ax.plot(
            batches, [p["predicted_adaptive_speedup"] for p in predictions], "o-", color="tab:red", label="adaptive"
        )
        ax.axhline(1.0, color="k", lw=0.5)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel("predicted speedup vs plain")
        ax.set_title(f"predicted ({result['prediction_models']}); grey: static K", fontsize=8)
        ax.legend(fontsize=7)
    if result["trajectory"] is not None:
        ax = axes[0][-1]
        traj = result["trajectory"]
        ax.step(range(len(traj["chosen_k"])), traj["chosen_k"], where="post", label="K chosen")
        ax.set_xlabel("round")
        ax.set_ylabel("K")
        twin = ax.twinx()
        twin.plot(traj["estimate_position_1"], color="tab:orange", label="est. acceptance of position 1")
        twin.set_ylim(0, 1)
        ax.set_title("shift: the policy over one generation", fontsize=9)
        ax.legend(loc="upper right", fontsize=7)
    fig.suptitle(title, fontsize=10)
    return plots._save(fig, path, result)


EXPERIMENT = Experiment(
    id="E11",
    name="adaptive_sweep",
    section=AdaptiveSweep,
    run=run,
    plot=plot,
    setting=describe,
    ks=lambda cfg: [cfg.k_max, *([cfg.random_k] * cfg.random_draft)],
    columns=[
        "scenario",
        "batch_size",
        "method",
        "num_speculative_tokens",
        "adaptive",
        "tokens_per_second",
        "speedup_vs_plain",
        "speedup_vs_plain_paired",
        "mean_acceptance_length",
        "adaptive_mean_k",
        "adaptive_plain_steps",
        "output_matches_plain",
    ],
)
