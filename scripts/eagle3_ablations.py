"""EAGLE-3 ablations on SmolLM2-135M-Instruct (issue 41): what the field argues about, each
changed alone from `configs/smollm2_eagle3_v2.yaml`, on the same data, windows and steps.

    python scripts/eagle3_ablations.py --steps 300 --runs runs/eagle3_ablations \\
        --out results/smollm2_eagle3_ablations/ablations [--store STORE] [--only NAME ...]

Variants (VARIANTS): the draft vocabulary (4,096, the baseline, against 16,384 and the full
49,152), the LM head started from the target's against drawn fresh (`lm_head_init`), the
training-time-test steps (1, i.e. no test, and 7, as published, against 5), and the layers
the head reads (2, 15, 27, the published choice, against the last block alone and an even
spread), and which positions the loss scores (the answers, as SpecForge masks them, against
every position, the prompts too: `eagle3.score`), and the head's compute in float32 against
the baseline's bfloat16 (`eagle3.compute_dtype`). Each is one `specjax train-head` run in
its own process, one after another; rerun the same command after an interruption: an
unfinished run resumes from its last checkpoint (train-head's own resume), a finished one
(its results.json written) is skipped.

--store: a feature store built for the baseline (`specjax store-features --config
configs/smollm2_eagle3_v2.yaml --out STORE`). It holds the target's side for the baseline's
layers and draft vocabulary, which the head's own settings (lm_head_init, the test's steps,
the scored positions, the compute dtype) do not change, so those variants train from it (with a dataset the
vocabulary is the split's, whatever the steps: one store serves the full run and these);
the vocabulary and layer variants need other target states and train live (the same loss
on the same batch: tests/test_feature_store.py).

Writes OUT.json and OUT.png (scripts/learning_curves.py: held-out acceptance against tokens
seen, the loss against steps) and OUT_table.json (per variant: the last held-out acceptance,
the head's parameters, the run's seconds and overrides).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CONFIG = "configs/smollm2_eagle3_v2.yaml"
VARIANTS = {
    "baseline": [],
    "vocab_16384": ["eagle.eagle3.draft_vocab_size=16384"],
    "vocab_full": ["eagle.eagle3.draft_vocab_size=0"],
    "lm_head_random": ["eagle.eagle3.lm_head_init=random"],
    "ttt_1": ["eagle.eagle3.ttt_steps=1"],
    "ttt_7": ["eagle.eagle3.ttt_steps=7"],
    "layers_last": ["eagle.feature_layers=[29]"],
    "layers_spread": ["eagle.feature_layers=[7,15,23]"],
    "score_all": ["eagle.eagle3.score=all"],
    "compute_f32": ["eagle.eagle3.compute_dtype=float32"],
}
# The variants whose target side is the baseline's (its layers and draft vocabulary)
FROM_STORE = ("baseline", "lm_head_random", "ttt_1", "ttt_7", "score_all", "compute_f32")


def command(name: str, steps: int, runs: Path, store: str | None, extra: list[str]) -> list[str]:
    sets = [f"steps={steps}", f"eval.every={max(steps // 3, 1)}", *extra, *VARIANTS[name]]
    if store and name in FROM_STORE:
        sets.append(f"features.store={store}")
    cli = [sys.executable, "-m", "specjax.cli", "train-head", "--config", CONFIG, "--out", str(runs / name)]
    return cli + [arg for s in sets for arg in ("--set", s)]


def finished(run: Path) -> bool:
    return (run / "results.json").is_file()


def table(runs: Path, names: list[str]) -> dict:
    out = {}
    for name in names:
        run = runs / name
        if not finished(run):
            continue
        result = json.loads((run / "results.json").read_text())
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        evals = [e for e in rows if "mean_acceptance_length_greedy" in e]
        timed = [r["seconds"] for r in rows if r.get("seconds") is not None]
        out[name] = {
            "overrides": VARIANTS[name],
            "acceptance_length": evals[-1]["mean_acceptance_length_greedy"] if evals else None,
            "curve": [(e["step"], e["mean_acceptance_length_greedy"]) for e in evals],
            "head_parameters": result.get("head_parameters"),
            "seconds": timed[-1] if timed else None,  # as metrics.jsonl logs it
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="training steps per variant")
    parser.add_argument("--runs", type=Path, default=Path("runs/eagle3_ablations"), help="a run directory per variant")
    parser.add_argument("--out", type=Path, required=True, help="OUT.json, OUT.png and OUT_table.json are written")
    parser.add_argument("--store", help="a feature store built for the baseline (see above)")
    parser.add_argument("--only", nargs="+", choices=sorted(VARIANTS), help="these variants only")
    parser.add_argument("--set", action="append", default=[], help="an override for every variant (train-head's --set)")
    args = parser.parse_args()
    names = args.only or list(VARIANTS)
    for name in names:
        if finished(args.runs / name):
            print(f"{name}: finished, skipped")
            continue
        cmd = command(name, args.steps, args.runs, args.store, args.set)
        print(" ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            raise SystemExit(f"eagle3_ablations: error: the {name} run failed (rerun to resume it)")
    done = [n for n in names if finished(args.runs / n)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    curves = [sys.executable, str(Path(__file__).with_name("learning_curves.py"))]
    subprocess.run([*curves, *(str(args.runs / n) for n in done), "--out", str(args.out)], check=True)
    summary = table(args.runs, done)
    args.out.with_name(args.out.name + "_table.json").write_text(json.dumps(summary, indent=1) + "\n")
    for name, row in summary.items():
        print(f"{name}: held-out acceptance {row['acceptance_length']}")


if __name__ == "__main__":
    main()
