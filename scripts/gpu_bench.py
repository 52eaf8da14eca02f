"""The accelerator benchmark: configs/gpu.yaml, sized for about 8 minutes on one H200 (before E11
was added to it; with E11 it has not run on a GPU yet).

JAX picks up a GPU by itself. Cost experiments (E2 verify cost, E4 batch sweep, E5
context sweep) time a ~0.9B-parameter bf16 random-weight target and a ~60M draft; their
speedups are predictions that combine those costs with the acceptance measured on the
embedded trained pair (labelled so in results.json). E1, E3, E6 and E7 run the embedded
pair end to end. On a CPU the same script runs with the cost models shrunk (~30M target)
so that it finishes in a few minutes; the output names the backend and device.

    python scripts/gpu_bench.py --out runs/gpu_bench
    python scripts/gpu_bench.py --out runs/gpu_bench --set timing.repeats=9
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax

from specjax.bench import BenchConfig, run_bench
from specjax.configs import load_config

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "gpu.yaml"

# On a CPU: the same experiments, on cost models a 2-core machine times in minutes.
CPU_OVERRIDES = [
    "cost_target.hidden_size=512",
    "cost_target.intermediate_size=1408",
    "cost_target.num_hidden_layers=4",
    "cost_target.num_attention_heads=8",
    "cost_target.num_key_value_heads=4",
    "cost_target.dtype=float32",
    "cost_draft.hidden_size=128",
    "cost_draft.intermediate_size=352",
    "cost_draft.num_hidden_layers=2",
    "cost_draft.num_attention_heads=4",
    "cost_draft.num_key_value_heads=2",
    "cost_draft.dtype=float32",
    "bandwidth_megabytes=256",
    "verify_cost.batch_sizes=[1,4]",
    "batch_sweep.batch_sizes=[1,4,16]",
    "context_sweep.contexts=[512,2048]",
    "timing.repeats=3",
    "adaptive_sweep.batch_sizes=[1]",
    "adaptive_sweep.static_ks=[2,8]",
    "adaptive_sweep.predict_batch_sizes=[1,4]",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/gpu_bench"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override configs/gpu.yaml")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()

    backend = jax.default_backend()
    overrides = ([] if backend == "gpu" else CPU_OVERRIDES) + args.set
    config = load_config(BenchConfig, CONFIG, overrides)
    print(f"backend {backend}: {jax.devices()[0].device_kind}; writing {args.out}", flush=True)
    start = time.perf_counter()
    results = run_bench(config, args.out, progress=not args.no_progress)
    for name, experiment in results["experiments"].items():
        print(f"{experiment['id']} {name}: {experiment['seconds']:.0f} s", flush=True)
    print((args.out / "summary.md").read_text())
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
