"""EAGLE-3 head training live against from a feature store: steps/s and peak RSS.

Runs, each under /usr/bin/time -v in its own process: `specjax store-features` (the store
build), `specjax train-head` live and `specjax train-head --set features.store=...`, the same
config and overrides, and writes the JSON (results/feature_store/README.md).

Steps/s is read from OUT/metrics.jsonl (log_every=1: each row's "seconds" since the loop
began, taken before that row's evaluation): steps 2..N over their seconds, so step 1's
compilation and the evaluations at step 0 and N are out. Peak RSS is the whole process's.

    python scripts/feature_store_bench.py --config configs/eagle3_published_head.yaml --steps 20 \\
        --out results/feature_store/tiny.json
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path


def timed(command: list[str], log: Path) -> dict:
    start = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-v", *command], capture_output=True, text=True)
    wall = time.perf_counter() - start
    log.write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}); see {log}")

    def field(name):
        return float(re.search(rf"{re.escape(name)}: ([0-9.]+)", done.stderr).group(1))

    return {
        "command": " ".join(command),
        "wall_s": round(wall, 2),
        "user_s": field("User time (seconds)"),
        "peak_rss_mb": round(field("Maximum resident set size (kbytes)") / 1024, 1),
    }


def steps_per_second(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    timed_rows = {r["step"]: r["seconds"] for r in rows if "seconds" in r}
    last = max(timed_rows)
    seconds = timed_rows[last] - timed_rows[1]
    losses = [r["loss"] for r in rows if "loss" in r]
    return {"steps_per_s": round((last - 1) / seconds, 4), "timed_steps": last - 1, "losses": losses}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--set", action="append", default=[], help="more overrides, for all three commands")
    p.add_argument("--work", default="/tmp/feature_store_bench")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    overrides = [f"steps={args.steps}", "log_every=1", "checkpoint_every=100000", *args.set]
    sets = [x for o in overrides for x in ("--set", o)]

    def command(name, *extra):
        return [sys.executable, "-m", "specjax.cli", name, "--config", args.config, *sets, *extra, "--no-progress"]

    store = work / "store"
    result = {"config": args.config, "overrides": overrides, "machine": platform.platform()}
    result["store_features"] = timed(command("store-features", "--out", str(store)), work / "store.log")
    result["store_bytes"] = sum(f.stat().st_size for f in store.glob("shard-*"))
    result["store_windows"] = json.loads((store / "manifest.json").read_text())["windows"]
    for name, extra in (("live", []), ("stored", ["--set", f"features.store={store}"])):
        run = work / name
        result[name] = timed(command("train-head", *extra, "--out", str(run)), work / f"{name}.log")
        result[name] |= steps_per_second(run)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
