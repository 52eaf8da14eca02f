"""What the verify schedule's machinery costs when its choice is forced: a schedule whose
costs make it pick one width w every round against a static chain of K = w - 1 (the same
drafts, the same verifies, the same rounds: greedy output and round counts are equal, so
the time difference is the schedule's switch and bookkeeping alone), on the embedded pair.

For each batch size and forced width w: "static K=w-1"; "forced w, 2 widths" (widths
(w, other), costs 1e-3 s for w and 1e3 s for the other: the `lax.switch` has two branches);
"forced w, 4 widths" (the default widths 1, 2, 3, 5 of K = 4, probe off). The schedule
drafts K = w - 1 (so drafting is the chain's), except with 4 widths, which need K = 4: it
then drafts 4 and verifies w - 1. Whole generations, compiled beforehand, timed round-robin
in one process, medians.

`--baseline FILE` also times each forced schedule as another version of
specjax/engine/verify_schedule.py implements it (e.g. `git show HEAD~1:specjax/engine/
verify_schedule.py > /tmp/old.py`), in the same process, round-robin with the rest: rows
named "... (baseline)". Its plans differ from the current ones only by a marker width_cost
(unused with explicit costs), so each compiles on its own, and the generation loop's
schedule_round is dispatched on it.

    python scripts/verify_schedule_overhead.py --batch 1 16 --widths 3 5 --new 64
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import specjax
from specjax.bench.timing import environment, interleaved

PROMPTS = [
    "def merge_sorted(a, b):\n    result = []\n",
    "The history of the printing press begins",
    "import numpy as np\n\ndef softmax(x):\n",
    "Once upon a time, in a small village,",
]


BASELINE_MARK = 0.123456  # width_cost of the baseline's plans (unused: their costs are explicit)


def forced(w: int, widths: tuple[int, ...], baseline: bool = False) -> specjax.VerifySchedule:
    """A schedule that always picks width w among `widths` (greedy: values are tokens / cost)."""
    costs = {v: (1e-3 if v == w else 1e3) for v in widths}
    mark = {"width_cost": BASELINE_MARK} if baseline else {}
    return specjax.VerifySchedule(widths=widths, costs=costs, probe_every=0, **mark)


def configurations(w: int, baseline: bool) -> dict[str, specjax.SpeculativeConfig]:
    other = 2 if w != 2 else 1
    out = {f"static K={w - 1}": specjax.SpeculativeConfig(num_speculative_tokens=w - 1)}
    for tag in ("", " (baseline)") if baseline else ("",):
        out[f"forced {w}, 2 widths{tag}"] = specjax.SpeculativeConfig(
            num_speculative_tokens=w - 1, verify_schedule=forced(w, tuple(sorted({w, other})), bool(tag))
        )
        out[f"forced {w}, 4 widths (K=4){tag}"] = specjax.SpeculativeConfig(
            num_speculative_tokens=4, verify_schedule=forced(w, (1, 2, 3, 5), bool(tag))
        )
    return out


def use_baseline(path: str) -> None:
    """Route plans marked BASELINE_MARK to the schedule_round of the file at `path`."""
    import importlib.util

    from specjax.engine import generation

    spec = importlib.util.spec_from_file_location("verify_schedule_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    current = generation.schedule_round

    def schedule_round(target_params, draft_weights, state):
        if state.plan.verify_schedule.width_cost == BASELINE_MARK:
            return module.schedule_round(target_params, draft_weights, state)
        return current(target_params, draft_weights, state)

    generation.schedule_round = schedule_round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--widths", type=int, nargs="+", default=[3, 5], help="forced widths (<= 5)")
    parser.add_argument("--draft", default="stdlib-block-head")
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--baseline", help="another verify_schedule.py to time side by side")
    parser.add_argument("--out", default="results/verify_schedule/overhead.json")
    args = parser.parse_args()
    if args.baseline:
        use_baseline(args.baseline)

    target = specjax.load_model("stdlib-target")
    draft = specjax.load_drafter(args.draft, target)
    config = specjax.GenerationConfig(max_new_tokens=args.new, ignore_eos=True)
    rows = []
    for batch in args.batch:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
        calls, width_of = {}, {}
        for w in args.widths:
            for name, spec in configurations(w, bool(args.baseline)).items():
                calls[name] = specjax.prepare(target, prompts, config, draft=draft, speculative=spec)
                width_of[name] = w
        times = interleaved({k: (lambda p=p: p.launch()) for k, p in calls.items()}, args.repeats, warmup=1)
        outputs = {name: call.run() for name, call in calls.items()}
        for name, out in outputs.items():
            w = width_of[name]
            static = outputs[f"static K={w - 1}"]
            row = {
                "batch": batch,
                "width": w,
                "name": name,
                "seconds": statistics.median(times[name]),
                "all_seconds": times[name],
                "rounds": out.stats.rounds,
                "same_tokens_as_static": out.tokens == static.tokens,
            }
            row["vs_static"] = row["seconds"] / statistics.median(times[f"static K={w - 1}"])
            rows.append(row)
            print(f"b={batch:2d} {name:26s} {1e3 * row['seconds']:8.1f} ms  x{row['vs_static']:.3f} "
                  f"rounds={row['rounds']} same={row['same_tokens_as_static']}", flush=True)  # fmt: skip
    command = "python scripts/verify_schedule_overhead.py " + " ".join(
        [f"--batch {' '.join(map(str, args.batch))}", f"--widths {' '.join(map(str, args.widths))}",
         f"--draft {args.draft}", f"--new {args.new}", f"--repeats {args.repeats}"]
        + ([f"--baseline {args.baseline}"] if args.baseline else [])
    )  # fmt: skip
    result = {"command": command, "environment": environment(), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
