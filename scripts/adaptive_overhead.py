"""What adaptive speculation's machinery costs when it decides to do nothing.

Plain decoding against adaptive speculation whose costs make every round after the first
a plain step (K = 0), with two and with five candidates, at batch 1 on the embedded pair,
timed round-robin (medians). A ratio near 1 means the switch, the policy and the bookkeeping
cost nothing a plain step would not. A random-weight draft under the measured costs shows
what probing a useless draft costs on top.

    python scripts/adaptive_overhead.py --out results/adaptive_overhead/adaptive_overhead.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import jax

import specjax
from specjax.bench.timing import environment, interleaved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new", type=int, default=128, help="tokens per generation")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", default="results/adaptive_overhead/adaptive_overhead.json")
    args = parser.parse_args()

    target, draft = specjax.load_model("stdlib-target"), specjax.load_model("stdlib-draft")
    random_draft = specjax.init_model(draft.config, seed=101)
    prompts = ["def merge_sorted(a, b):\n    result = []\n"]
    big = 1e3  # seconds: a K that costs this is never chosen after the first round
    adaptive = specjax.AdaptiveConfig
    calls = {
        "plain": specjax.prepare(target, prompts, specjax.GenerationConfig(max_new_tokens=args.new, ignore_eos=True)),
        "adaptive K=0, 2 candidates": specjax.prepare(
            target,
            prompts,
            specjax.GenerationConfig(max_new_tokens=args.new, ignore_eos=True),
            draft=draft,
            speculative=specjax.SpeculativeConfig(
                num_speculative_tokens=4, adaptive=adaptive(ks=(0, 4), costs={0: 1.0, 4: big}, probe_budget=1.0)
            ),
        ),
        "adaptive K=0, 5 candidates": specjax.prepare(
            target,
            prompts,
            specjax.GenerationConfig(max_new_tokens=args.new, ignore_eos=True),
            draft=draft,
            speculative=specjax.SpeculativeConfig(
                num_speculative_tokens=8,
                adaptive=adaptive(costs={0: 1.0, 1: big, 2: big, 4: big, 8: big}, probe_budget=1.0),
            ),
        ),
        "adaptive, random draft, measured costs": specjax.prepare(
            target,
            prompts,
            specjax.GenerationConfig(max_new_tokens=args.new, ignore_eos=True),
            draft=random_draft,
            speculative=specjax.SpeculativeConfig(num_speculative_tokens=8, adaptive=True),
        ),
        "static K=4, random draft": specjax.prepare(
            target,
            prompts,
            specjax.GenerationConfig(max_new_tokens=args.new, ignore_eos=True),
            draft=random_draft,
            speculative=specjax.SpeculativeConfig(num_speculative_tokens=4),
        ),
    }
    times = interleaved({k: (lambda p=p: p.launch()) for k, p in calls.items()}, args.repeats, warmup=1)
    seconds = {k: statistics.median(v) for k, v in times.items()}
    rows = []
    for name, call in calls.items():
        out = call.run()
        row = {"name": name, "seconds": seconds[name], "speed_vs_plain": seconds["plain"] / seconds[name]}
        if out.stats.adaptive is not None:
            row["rounds_per_k"] = out.stats.adaptive["rounds_per_k"]
        rows.append(row)
        print(
            f"{name:42s} {1e3 * seconds[name]:8.1f} ms  {row['speed_vs_plain']:.3f}x plain",
            row.get("rounds_per_k", ""),
        )
    result = {"command": "python scripts/adaptive_overhead.py " + f"--new {args.new} --repeats {args.repeats}",
              "environment": environment(), "device": str(jax.devices()[0]), "rows": rows}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
