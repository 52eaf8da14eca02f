"""Tokens/s of plain vs speculative decoding for each K on one target/draft pair.

On the random-weight pair (acceptance ~0) this measures the engine's overhead floor: the
cost of a round (K draft steps + one verify) against plain steps. On the embedded
trained pair it measures a real speedup. Plain and speculative runs are interleaved in
one process and the medians compared, so the ratio holds on a noisy shared machine.

    python scripts/speed_pair.py --target random-target --draft random-draft \\
        --out results/speed_pair/speed_random_pair.json
    python scripts/speed_pair.py --target stdlib-target --draft stdlib-draft \\
        --out results/speed_pair/speed_stdlib_pair.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import jax

import specjax
from specjax.io.presets import resolve_model


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="random-target", help="random preset, embedded name or HF dir")
    parser.add_argument("--draft", default="random-draft", help="random preset, embedded name or HF dir")
    parser.add_argument("--prompt", default="def parse_args(argv):\n")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("results/speed_pair/speed_pair.json"))
    args = parser.parse_args()

    target, draft = resolve_model(args.target), resolve_model(args.draft, seed=1)
    prompts = [args.prompt] * args.batch_size
    n = args.max_new_tokens

    # Each generate call ends with a device_get of its results, so timing the call is
    # timing completed work; the first call of each signature compiles and is discarded.
    def plain():
        return specjax.generate(target, prompts, specjax.GenerationConfig(max_new_tokens=n, ignore_eos=True))

    def speculative(k):
        return specjax.generate(
            target,
            prompts,
            specjax.GenerationConfig(max_new_tokens=n, ignore_eos=True),
            draft=draft,
            speculative=specjax.SpeculativeConfig(num_speculative_tokens=k),
        )

    plain()
    for k in args.ks:
        speculative(k)
    times = {"plain": []} | {k: [] for k in args.ks}
    for _ in range(args.repeats):
        times["plain"].append(_timed(plain))
        for k in args.ks:
            times[k].append(_timed(lambda k=k: speculative(k)))

    tokens = n * args.batch_size
    plain_tps = tokens / statistics.median(times["plain"])
    rows = [{"method": "plain", "num_speculative_tokens": 0, "tokens_per_second": plain_tps, "speedup_vs_plain": 1.0}]
    print(f"backend {jax.default_backend()}, {platform.processor() or platform.machine()}, batch {args.batch_size}")
    print(f"plain        {plain_tps:8.1f} tokens/s")
    for k in args.ks:
        stats = speculative(k).stats
        tps = tokens / statistics.median(times[k])
        rows.append(
            {
                "method": "speculative",
                "num_speculative_tokens": k,
                "tokens_per_second": tps,
                "speedup_vs_plain": tps / plain_tps,
                "mean_acceptance_length": stats.mean_acceptance_length,
            }
        )
        print(
            f"speculative K={k:<2} {tps:8.1f} tokens/s  {tps / plain_tps:5.2f}x plain  "
            f"mean acceptance length {stats.mean_acceptance_length:.2f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"jax": jax.__version__, "backend": jax.default_backend(), "device": str(jax.devices()[0])}
    result = {
        "target": args.target,
        "draft": args.draft,
        "environment": meta,
        "max_new_tokens": n,
        "batch_size": args.batch_size,
        "raw_seconds": {str(k): v for k, v in times.items()},
    }
    args.out.write_text(json.dumps(result | {"rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
