"""Decode-step cost against cache fill and capacity, for several attention block sizes.

Attention reads the KV cache in blocks and stops at the block holding the highest query
position (models/attention.py). This measures one plain decode step (a forward of width
1 plus sampling and commit, as the generation loop runs it) on a cache of `capacity`
slots holding `fill` committed tokens, for each block size, round-robin in one process
so the ratios are comparable on a shared machine. "full" is one block as large as the
cache: every slot is read, masked (the behaviour before blockwise attention).

    python scripts/attention_blocks.py --model stdlib-target --out results/attention_blocks/attention_blocks.json
    python scripts/attention_blocks.py --model smollm2-135m-instruct --weights int8 --capacities 256,512 \
        --fills 100,200 --blocks 32,64,128,256 --inner 8 --out results/attention_blocks/smollm2_int8.json
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
from pathlib import Path

import jax
import jax.numpy as jnp
from tqdm.auto import tqdm

from specjax.bench.timing import environment, interleaved, median
from specjax.core.loop import CacheConfig, eos_ids
from specjax.core.sampling import SamplingConfig
from specjax.core.state import Plan
from specjax.engine.generation import jit_init_state
from specjax.engine.rounds import plain_round
from specjax.io.presets import load_model

GREEDY = SamplingConfig(0.0)


@functools.partial(jax.jit, static_argnames=("inner",), donate_argnums=1)
def _steps(params, state, inner: int):
    def body_fn(_, s):
        # Rewind after each step: every step sees the same fill.
        return plain_round(params, None, s).replace(lengths=state.lengths, done=state.done)

    return jax.lax.fori_loop(0, inner, body_fn, state)


def step_call(model, batch: int, fill: int, capacity: int, block: int | None, inner: int):
    cache = CacheConfig(block_size=block or capacity)
    prompt = jnp.ones((batch, fill), jnp.int32)
    lengths = jnp.full((batch,), fill, jnp.int32)
    plan = Plan(model.config, None, 0, GREEDY, None, cache)  # plain decoding: no drafter
    stop = jnp.asarray(eos_ids(None))  # [1]: matches nothing
    state = jit_init_state(
        model.params, None, prompt, lengths, jnp.int32(capacity), stop, jax.random.key(0), plan=plan,
        cache_length=capacity,
    )  # fmt: skip

    def call():
        nonlocal state
        state = _steps(model.params, state, inner)
        return state.tokens

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="stdlib-target")
    parser.add_argument("--weights", choices=["float32", "bfloat16", "int8"], default="float32")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--capacities", default="512,2048,8192")
    parser.add_argument("--fills", default="128,512,2048")
    parser.add_argument("--blocks", default="full,128,256,512,1024")
    parser.add_argument("--inner", type=int, default=16, help="decode steps per timed sample")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default="results/attention_blocks/attention_blocks.json")
    args = parser.parse_args()

    model = load_model(args.model, weights=args.weights)
    model = type(model)(model.config.replace(max_position_embeddings=65536), model.params, model.tokenizer)
    blocks = [None if b == "full" else int(b) for b in args.blocks.split(",")]
    shapes = [
        (fill, capacity, block)
        for capacity in map(int, args.capacities.split(","))
        for fill in map(int, args.fills.split(","))
        if fill + args.inner < capacity
        for block in blocks
        if block is None or block <= capacity
    ]
    calls = {shape: step_call(model, args.batch, *shape, args.inner) for shape in tqdm(shapes, desc="compile")}
    with tqdm(total=len(calls) * args.repeats, desc="time") as bar:
        times = interleaved(calls, args.repeats, warmup=1, progress=bar)
    rows = []
    for (fill, capacity, block), samples in times.items():
        rows.append(
            {
                "fill": fill,
                "capacity": capacity,
                "block": block or "full",
                "ms_per_step": 1e3 * median(samples) / args.inner,
                "samples_ms": [1e3 * t / args.inner for t in samples],
            }
        )
    out = {
        "model": args.model,
        "weights": args.weights,
        "batch": args.batch,
        "inner": args.inner,
        "repeats": args.repeats,
        "environment": environment(),
        "machine": platform.machine(),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"{'capacity':>8} {'fill':>6} " + " ".join(f"{b or 'full'!s:>8}" for b in blocks))
    for capacity in sorted({r["capacity"] for r in rows}):
        for fill in sorted({r["fill"] for r in rows if r["capacity"] == capacity}):
            cells = {r["block"]: r["ms_per_step"] for r in rows if r["capacity"] == capacity and r["fill"] == fill}
            print(
                f"{capacity:>8} {fill:>6} " + " ".join(f"{cells.get(b or 'full', float('nan')):8.3f}" for b in blocks)
            )


if __name__ == "__main__":
    main()
