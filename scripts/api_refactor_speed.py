"""Plain and speculative decoding speed before and after a change, side by side.

Runs the same timing in worker processes that import specjax from two checkouts (the one
this script is in, and --before, e.g. a `git worktree` of an older commit), alternating
before/after --rounds times so that both see the same machine load, and reports each
side's median tokens/s and the after/before ratio. Each worker times, after one
compiling call, --repeats calls of plain decoding and of speculative decoding (draft
model, K=4) on the embedded pair, batch 1.

    git worktree add /tmp/old f82767c
    python scripts/api_refactor_speed.py --before /tmp/old --out results/api_refactor_speed/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

WORKER = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
import specjax
new, k, repeats = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
target, draft = specjax.load_model("stdlib-target"), specjax.load_model("stdlib-draft")
prompts = ["def parse_args(argv):\n"]
if hasattr(specjax, "GenerationConfig"):
    config = specjax.GenerationConfig(max_new_tokens=new)
    spec = specjax.SpeculativeConfig(num_speculative_tokens=k)
    plain = lambda: specjax.generate(target, prompts, config)
    speculative = lambda: specjax.generate(target, prompts, config, draft=draft, speculative=spec)
else:
    plain = lambda: specjax.generate(target, prompts, max_new_tokens=new)
    old_entry = getattr(specjax, "speculative_" + "generate")  # the checkout before GenerationConfig
    speculative = lambda: old_entry(target, draft, prompts, num_speculative_tokens=k, max_new_tokens=new)
out = {"specjax_file": specjax.__file__, "plain": [], "speculative": []}
outputs = {"plain": plain(), "speculative": speculative()}  # compile
assert outputs["plain"].tokens == outputs["speculative"].tokens
for _ in range(repeats):
    for name, fn in (("plain", plain), ("speculative", speculative)):
        start = time.perf_counter()
        fn()
        out[name].append(new / (time.perf_counter() - start))
print(json.dumps(out))
"""


def run(checkout: Path, args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    cmd = [sys.executable, "-c", WORKER, str(args.max_new_tokens), str(args.k), str(args.repeats)]
    done = subprocess.run(cmd, env=env, cwd=checkout, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["specjax_file"].startswith(str(checkout)), result["specjax_file"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the earlier commit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = {"before": [], "after": []}
    for i in range(args.rounds):
        for side, checkout in (("before", args.before.resolve()), ("after", HERE)):
            runs[side].append(run(checkout, args))
            print(f"round {i + 1}/{args.rounds} {side} done", file=sys.stderr, flush=True)
    summary = {}
    for kind in ("plain", "speculative"):
        before = statistics.median(x for r in runs["before"] for x in r[kind])
        after = statistics.median(x for r in runs["after"] for x in r[kind])
        summary[kind] = {
            "before_tokens_per_second": before,
            "after_tokens_per_second": after,
            "after_over_before": after / before,
        }
    commits = {
        side: subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=c, capture_output=True, text=True
        ).stdout.strip()
        for side, c in (("before", args.before), ("after", HERE))
    }
    result = {"settings": vars(args) | {"before": str(args.before), "out": str(args.out)}, "commits": commits,
              "load_average": os.getloadavg(), "summary": summary, "runs": runs}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
