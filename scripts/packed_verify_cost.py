"""What a packed verify costs against the whole call (models.Packed), at batch B, width W.

A verify call of B rows x W tokens computes every token; a packed one computes N of them
(a prefix of each row: per-row verify widths, rows that are done) as one row of products,
attention still per row. This times one jitted target forward both ways, round-robin in
one process, at N = B (width 1 everywhere) up to B * W, with each row's context at
`--context` tokens in a cache of `--cache` slots: whether a per-row width would pay on this
machine before an engine is built around it.

    python scripts/packed_verify_cost.py --target stdlib-target --batch 16 --width 5 \\
        --out results/packed_verify/stdlib_b16.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from specjax.models import Packed, forward, init_cache

import specjax
from specjax.bench.timing import environment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="stdlib-target")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--width", type=int, default=5)
    parser.add_argument("--context", type=int, default=96, help="committed tokens per row before the call")
    parser.add_argument("--cache", type=int, default=256, help="cache slots per row")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="results/packed_verify/packed_verify.json")
    args = parser.parse_args()

    model = specjax.load_model(args.target)
    config, b, w = model.config, args.batch, args.width
    cache = init_cache(config, b, args.cache)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, (b, w)), jnp.int32)
    positions = args.context - 1 + jnp.broadcast_to(jnp.arange(w, dtype=jnp.int32), (b, w))
    call = jax.jit(forward, static_argnums=0)

    def packed(n: int) -> Packed:
        per_row = [n // b + (r < n % b) for r in range(b)]  # n tokens, a prefix of each row
        index = [r * w + j for r, k in enumerate(per_row) for j in range(k)]
        return Packed(index=jnp.asarray(index, jnp.int32), shape=(b, w))

    variants = {f"whole {b}x{w}": None, **{f"packed N={n}": packed(n) for n in range(b, b * w + 1, b)}}
    for p in variants.values():  # compile
        jax.block_until_ready(call(config, model.params, tokens, positions, cache, packed=p))
    seconds = {k: [] for k in variants}
    for _ in range(args.repeats):
        for name, p in variants.items():
            began = time.perf_counter()
            jax.block_until_ready(call(config, model.params, tokens, positions, cache, packed=p))
            seconds[name].append(time.perf_counter() - began)
    median = {k: statistics.median(v) for k, v in seconds.items()}
    whole = median[f"whole {b}x{w}"]
    for name, s in median.items():
        print(f"{name:16s} {1e3 * s:8.2f} ms  {s / whole:.3f} of the whole call")
    result = {
        "command": f"python scripts/packed_verify_cost.py --target {args.target} --batch {b} --width {w} "
        f"--context {args.context} --cache {args.cache} --repeats {args.repeats}",
        "environment": environment(),
        "median_ms": {k: 1e3 * v for k, v in median.items()},
        "of_whole": {k: v / whole for k, v in median.items()},
        "seconds": seconds,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
