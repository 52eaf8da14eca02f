"""Does a position's logits keep its bits at every verify width, and what do per-position attention dots cost?

For a weight format's target (default SmolLM2-135M-Instruct in int8): prefill random tokens,
decode N positions one at a time (plain steps), then verify the same positions in one forward
of width w from the same cache, and count the (row, position) logits that differ from the plain
step's and the greedy tokens that flip. Then time the forward at a few (batch, width) with
attention as shipped (`fixed`: the query rows on the dots' left, models/attention.py `_scores`,
`_weighted`) against the keys on the left (einsum's layout, the code before 2026-12-07), in one
process, alternating, best of 7 x 5 calls. The JSON's keys say "per_position" for the shipped
layout: the name it was given before the compiled program was read; it is one dot of G x T
rows, with the positions in its left operand (results/width_classes).

    python scripts/fixed_attention_check.py --out results/width_classes/fixed_attention_int8.json
    python scripts/fixed_attention_check.py --weights bfloat16 --out ...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

from _timing import chain_forward, machine


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--weights", choices=["bfloat16", "int8"], default="int8")
    parser.add_argument("--widths", default="2,5,8,9,10,16,17,33", help="verify widths to compare with plain steps")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--timed", default="1x1,1x5,1x9,8x1,8x5", help="BATCHxWIDTH forwards to time")
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


@contextlib.contextmanager
def dots(per_position: bool):
    """Trace attention with the query rows on the dots' left (as shipped) or, False, with one dot
    over every position (fixed=False's dots, the code before 2026-12-07)."""
    import specjax.models.attention as attention

    shipped_scores, shipped_weighted = attention._scores, attention._weighted
    if not per_position:
        attention._scores = lambda q, k, fixed: shipped_scores(q, k, False)
        attention._weighted = lambda w, v, fixed: shipped_weighted(w, v, False)
    try:
        yield
    finally:
        attention._scores, attention._weighted = shipped_scores, shipped_weighted


def bits(model, batch: int, widths: list[int], per_position: bool) -> list[dict]:
    import jax
    import numpy as np

    import specjax

    cfg, prefix, n = model.config, 60, max(widths)
    tokens = np.random.default_rng(0).integers(3, 40000, size=(batch, prefix + n)).astype(np.int32)

    @jax.jit
    def forward(params, tokens, start, cache):  # tokens [B, T] -> logits [B, T, V], cache
        with dots(per_position):
            return chain_forward(cfg, params, tokens, start, cache)

    def prefilled():
        return forward(model.params, tokens[:, :prefix], 0, specjax.models.init_cache(cfg, batch, 128))[1]

    plain, cache = [], prefilled()
    for p in range(prefix, prefix + n):
        logits, cache = forward(model.params, tokens[:, p : p + 1], p, cache)
        plain.append(np.asarray(logits[:, 0]))
    plain = np.stack(plain, axis=1)  # [B, n, V]
    rows = []
    for w in widths:
        verified = np.asarray(forward(model.params, tokens[:, prefix : prefix + w], prefix, prefilled())[0])
        diff = np.abs(verified - plain[:, :w]).max(axis=-1)  # [B, w]
        flips = int((verified.argmax(-1) != plain[:, :w].argmax(-1)).sum())
        rows.append(
            {
                "per_position": per_position,
                "batch": batch,
                "width": w,
                "differing": int((diff > 0).sum()),
                "positions": int(diff.size),
                "max_abs_diff": float(diff.max()),
                "argmax_flips": flips,
            }
        )
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def speed(model, timed: list[tuple[int, int]]) -> list[dict]:
    import jax
    import jax.numpy as jnp

    import specjax

    cfg = model.config

    def make(per_position: bool):
        def fwd(params, tokens, start, cache):
            with dots(per_position):
                return chain_forward(cfg, params, tokens, start, cache)[0]

        return jax.jit(fwd)

    fns = {"one_dot": make(False), "per_position": make(True)}
    rows = []
    for batch, width in timed:
        cache = specjax.models.init_cache(cfg, batch, 256)
        tokens = jnp.ones((batch, width), jnp.int32)
        for f in fns.values():
            jax.block_until_ready(f(model.params, tokens, 100, cache))
        best = dict.fromkeys(fns, float("inf"))
        for _ in range(7):
            for name, f in fns.items():
                start = time.perf_counter()
                for _ in range(5):
                    jax.block_until_ready(f(model.params, tokens, 100, cache))
                best[name] = min(best[name], (time.perf_counter() - start) / 5)
        rows.append({"batch": batch, "width": width, **{f"{k}_ms": round(v * 1e3, 3) for k, v in best.items()},
                     "ratio": round(best["per_position"] / best["one_dot"], 3)})  # fmt: skip
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    import specjax

    model = specjax.load_model(args.target, weights=args.weights)
    widths = [int(w) for w in args.widths.split(",")]
    record = {
        "command": "python scripts/fixed_attention_check.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "bits": [
            row
            for per_position in (False, True)
            for b in args.batches.split(",")
            for row in bits(model, int(b), widths, per_position)
        ],
        "speed": speed(model, [tuple(int(x) for x in s.split("x")) for s in args.timed.split(",")]),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
