"""Compare distillation recipes on the same draft architecture, step budget and prompts.

A comparison config is a base DistillConfig plus named variants (lists of overrides).
Each variant is an ordinary resumable distillation run in OUT/<name>; the comparison
writes OUT/results.json, OUT/results.csv and OUT/acceptance.png (held-out mean acceptance
length over training steps, greedy and at the distillation temperature).
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

from specjax.configs import apply_overrides, from_dict, read_yaml, to_dict
from specjax.training.distill import DistillConfig, distill
from specjax.training.run_dirs import Metrics


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    overrides: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    base: DistillConfig
    variants: list[Variant]

    def __post_init__(self):
        names = [v.name for v in self.variants]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"variants need distinct names, got {names}")


def is_comparison(path: str | Path) -> bool:
    return "variants" in read_yaml(path)


def variant_config(config: CompareConfig, variant: Variant) -> DistillConfig:
    return from_dict(DistillConfig, apply_overrides(to_dict(config.base), variant.overrides))


def compare(config: CompareConfig, out_dir: str | Path, progress: bool = True) -> list[dict]:
    out_dir = Path(out_dir)
    rows, curves = [], {}
    for variant in config.variants:
        results = distill(variant_config(config, variant), out_dir / variant.name, progress=progress)
        history = [
            r for r in Metrics(out_dir / variant.name / "metrics.jsonl", 10**9).rows() if "acceptance_rate_greedy" in r
        ]
        curves[variant.name] = history
        rows.append({"variant": variant.name, "overrides": " ".join(variant.overrides), **results})
    baseline = rows[0]["mean_acceptance_length_after"]
    for row in rows:
        row["gain_vs_first_variant"] = row["mean_acceptance_length_after"] / baseline - 1.0
    (out_dir / "results.json").write_text(
        json.dumps({"config": to_dict(config), "rows": rows, "curves": curves}, indent=2)
    )
    columns = [
        "variant",
        "mean_acceptance_length_before",
        "mean_acceptance_length_after",
        "mean_acceptance_length_sampled_before",
        "mean_acceptance_length_sampled_after",
        "gain_vs_first_variant",
        "draft",
        "overrides",
    ]
    with (out_dir / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    _plot(curves, out_dir / "acceptance.png", config.base.eval.num_speculative_tokens)
    return rows


def _plot(curves: dict[str, list[dict]], path: Path, k: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    for name, history in curves.items():
        steps = [r["step"] for r in history]
        axes[0].plot(steps, [r["mean_acceptance_length_greedy"] for r in history], marker="o", label=name)
        axes[1].plot(steps, [r["mean_acceptance_length_sampled"] for r in history], marker="o", label=name)
    for ax, title in zip(axes, ("greedy", "sampled at the distillation temperature"), strict=True):
        ax.set_title(f"{title}: mean acceptance length (K={k})", fontsize=10)
        ax.set_xlabel("distillation step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("tokens per round")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
