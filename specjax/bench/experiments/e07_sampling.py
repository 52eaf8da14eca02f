"""E7: speculative sampling preserves the target distribution; acceptance depends on temperature.

Two parts: acceptance counted at each K and temperature, and the distribution test of
bench/distribution.py (the exact rule must pass the chi-square test against the exact
target distribution; the deliberately wrong negative control must fail it, or the test
has no power).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt

from specjax.bench import plots
from specjax.bench.context import BenchContext
from specjax.bench.distribution import distribution_test
from specjax.bench.experiments.shared import COUNTED, ONE_BATCH, Experiment, check_ks, one_or_swept, setting
from specjax.bench.measure import pooled

_P_FLOOR = 1e-20


@dataclasses.dataclass(frozen=True)
class SamplingCheck:
    """E7: the target distribution test, plus acceptance at temperature 0 vs > 0."""

    ks: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 4, 8])
    temperatures: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.7, 1.0])
    test_temperature: float = 1.0
    test_num_speculative_tokens: int = 4
    test_samples: int = 4000  # independent two-token continuations of one prompt
    p_value_threshold: float = 0.001

    def __post_init__(self):
        check_ks(self.ks)


def run(ctx: BenchContext) -> dict:
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


def describe(ctx: BenchContext) -> dict:
    cfg = ctx.config.sampling
    extra = [COUNTED, one_or_swept("K", cfg.ks, "=")[1]]
    extra.append(
        f"distribution test: 1 prompt, {cfg.test_samples} samples at temperature {cfg.test_temperature:g}, "
        f"K={cfg.test_num_speculative_tokens}"
    )
    return setting(ctx, ONE_BATCH, one_or_swept("temperature", cfg.temperatures), extra, counted=True)


def plot(result: dict, path: Path, title: str) -> Path:
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, temperature in enumerate(sorted({r["temperature"] for r in result["rows"]})):
        rows = [r for r in pooled(result["rows"]) if r["temperature"] == temperature]
        ks = [r["num_speculative_tokens"] for r in rows]
        ax.plot(ks, [r["mean_acceptance_length"] for r in rows], "o-", color=f"C{i}", label=f"T={temperature}")
    ax.set(xlabel="K", ylabel="mean acceptance length (tokens/round)", title=title)
    ax.set_xticks(sorted({r["num_speculative_tokens"] for r in result["rows"]}))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    tests = result["distribution_test"]
    names = [t["rule"].replace(" (negative control)", "\n(negative control)") for t in tests]
    x = range(len(tests))
    for offset, key, label in ((-0.2, "p_value_token_1", "token 1"), (0.2, "p_value_token_2", "token 2")):
        # p-values below the floor are drawn at it (and labelled), or one bar would span 300 decades.
        values = [max(t[key], _P_FLOOR) for t in tests]
        ax2.bar([i + offset for i in x], values, 0.4, label=label)
        for i, t in zip(x, tests, strict=True):
            ax2.annotate(f"{t[key]:.1e}", (i + offset, values[i]), ha="center", va="bottom", fontsize=7)
    ax2.axhline(result["summary"]["p_value_threshold"], color="red", ls="--", lw=0.8, label="threshold")
    ax2.set_xticks(list(x), names, fontsize=8)
    ax2.set(yscale="log", ylim=(_P_FLOOR / 10, 10), ylabel="chi-square p-value")
    ax2.set_title("distribution test vs exact target")
    ax2.legend(fontsize=7)
    return plots._save(fig, path, result)


EXPERIMENT = Experiment(
    id="E7",
    name="sampling",
    section=SamplingCheck,
    run=run,
    plot=plot,
    setting=describe,
    columns=["temperature", "num_speculative_tokens", "acceptance_rate", "mean_acceptance_length"],
)
