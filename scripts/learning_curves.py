"""Learning curves of head training runs: held-out acceptance length against steps and tokens
seen, and the training loss, from each run's `metrics.jsonl` (issue 41).

    python scripts/learning_curves.py RUN_DIR [RUN_DIR ...] --out results/smollm2_training_v2/curves

A run directory is what `specjax train-head --out DIR` writes (metrics.jsonl, head_config.yaml)
or `specjax distill --out DIR` (metrics.jsonl, distill_config.yaml);
it may still be training: the curves hold what it has logged so far. Writes OUT.json (every
evaluation and every logged loss per run, with tokens seen) and OUT.png (acceptance against
tokens seen, loss against steps). Tokens seen = steps x batch x window (the windows' tokens,
prompts included; a masked-loss run scores only the assistant part of them).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml


def window(config: dict) -> tuple[int, int]:
    """(batch, tokens per window) of a head run: its dataset's if it has one, else its corpus stream's."""
    data = config.get("dataset") or config.get("data") or {}
    return int(data.get("batch_size", 1)), int(data.get("seq_len", 1))


def curve(run: Path) -> dict:
    """One run's evaluations and losses, as logged."""
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        raise SystemExit(f"learning_curves: error: {metrics} does not exist (not a train-head run directory?)")
    saved = [run / name for name in ("head_config.yaml", "distill_config.yaml") if (run / name).is_file()]
    config = yaml.safe_load(saved[0].read_text()) if saved else {}
    batch, length = window(config)
    evals, losses = [], []
    for line in metrics.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if "mean_acceptance_length_greedy" in row:
            evals.append(
                {
                    "step": row["step"],
                    "tokens_seen": row["step"] * batch * length,
                    "acceptance_length": row["mean_acceptance_length_greedy"],
                }
            )
        if "loss" in row:  # an evaluation's step may log its loss too
            losses.append({"step": row["step"], "loss": row["loss"], "seconds": row.get("seconds")})
    label = run.name
    return {
        "run": str(run),
        "label": label,
        "kind": config.get("kind") or ("distill" if saved and saved[0].name.startswith("distill") else None),
        "batch": batch,
        "window": length,
        "evaluations": evals,
        "losses": losses,
    }


def plot(curves: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for c in curves:
        e = c["evaluations"]
        left.plot([r["tokens_seen"] / 1e3 for r in e], [r["acceptance_length"] for r in e], "o-", label=c["label"])
        right.plot([r["step"] for r in c["losses"]], [r["loss"] for r in c["losses"]], label=c["label"])
    left.set(
        xlabel="tokens seen (thousands)", ylabel="held-out acceptance length (greedy)", title="Held-out acceptance"
    )
    right.set(xlabel="step", ylabel="training loss", yscale="log", title="Loss")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="train-head output directories")
    parser.add_argument("--out", type=Path, required=True, help="OUT.json and OUT.png are written")
    args = parser.parse_args()
    curves = [curve(run) for run in args.runs]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(curves, indent=1) + "\n")
    plot(curves, args.out.with_suffix(".png"))
    for c in curves:
        last = c["evaluations"][-1] if c["evaluations"] else None
        print(
            f"{c['label']}: {len(c['losses'])} losses, {len(c['evaluations'])} evaluations"
            + (f", last: step {last['step']} acceptance {last['acceptance_length']:.3f}" if last else "")
        )


if __name__ == "__main__":
    main()
