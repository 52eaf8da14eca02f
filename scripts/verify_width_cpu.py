"""What a target forward of width w costs on XLA:CPU, relative to width 1, under XLA:CPU options.

A verify pass of width K + 1 streams the same weights as a decode step, so on a
memory-bound machine it should cost about as much. METHODS.md section 10 measured 1.58x
at width 2 and 1.61x at width 5 on this CPU for a 110M fp32 Llama: the dot kernel changes
from matrix-vector to matrix-matrix. This script times forwards of widths 1..16 at one
context, in one process per XLA flag set (flags are read at startup), widths round-robin
within each process, and reports cost(w) / cost(1) and milliseconds per forward.

    python scripts/verify_width_cpu.py --out results/verify_width_cpu/verify_width_cpu.json
    python scripts/verify_width_cpu.py --matmul --out results/verify_width_cpu/verify_width_matmul.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

VARIANTS = {
    "default": "",
    "thunk_runtime_off": "--xla_cpu_use_thunk_runtime=false",
    "onednn": "--xla_cpu_use_onednn=true",
    "xnnpack": "--xla_cpu_use_xnnpack=true",
    "eigen_single_thread": "--xla_cpu_multi_thread_eigen=false",
}


def one(widths: list[int], context: int, inner: int, repeats: int, hidden: int, layers: int) -> dict:
    import jax
    import jax.numpy as jnp
    from specjax.models import forward, init_cache

    import specjax
    from specjax.bench.timing import interleaved, median

    config = specjax.ModelConfig(
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3 // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    model = specjax.init_model(config, seed=0)

    @functools.partial(jax.jit, donate_argnums=1)
    def forwards(params, cache, tokens, positions):
        def body_fn(_, carry):
            cache, checksum = carry
            logits, cache = forward(config, params, tokens, positions, cache)
            return cache, checksum + logits[:, -1, 0]

        return jax.lax.fori_loop(0, inner, body_fn, (cache, jnp.zeros((1,), jnp.float32)))

    calls = {}
    for width in widths:
        state = {"cache": init_cache(config, 1, context)}
        tokens = jnp.ones((1, width), jnp.int32)
        positions = jnp.arange(context - width, context, dtype=jnp.int32)[None]

        def call(state=state, tokens=tokens, positions=positions):
            state["cache"], checksum = forwards(model.params, state["cache"], tokens, positions)
            return checksum

        calls[width] = call
    times = interleaved(calls, repeats, warmup=1)
    ms = {w: 1e3 * median(t) / inner for w, t in times.items()}
    return {"parameters": model.num_parameters, "ms_per_forward": ms, "relative": {w: ms[w] / ms[1] for w in ms}}


def matmul_widths(widths: list[int], d: int = 768, n: int = 8192, calls: int = 200) -> dict:
    """One weight matrix [d, n] times [m, d] activations: ms per product for each width m,
    as one dot (x @ w), with the weight transposed (w.T @ x.T), and as m matrix-vector
    products. Isolates the dot kernel from the rest of the forward."""
    import time

    import jax
    import jax.numpy as jnp

    w = jax.random.normal(jax.random.key(0), (d, n), jnp.float32)
    wt = jnp.asarray(w.T)
    forms = {
        "x @ w": (jax.jit(lambda x, w: x @ w), w),
        "(w.T @ x.T).T": (jax.jit(lambda x, wt: (wt @ x.T).T), wt),
        "m matrix-vector products": (
            jax.jit(lambda x, w: jnp.concatenate([x[i : i + 1] @ w for i in range(x.shape[0])])),
            w,
        ),
    }
    out = {"weight_bytes": int(w.nbytes), "ms": {}}
    for m in widths:
        x = jax.random.normal(jax.random.key(1), (m, d), jnp.float32)
        for name, (fn, weight) in forms.items():
            fn(x, weight).block_until_ready()
            start = time.perf_counter()
            for _ in range(calls):
                result = fn(x, weight)
            result.block_until_ready()
            out["ms"].setdefault(name, {})[m] = 1e3 * (time.perf_counter() - start) / calls
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", default="1,2,3,4,5,8,16")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--inner", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=2, help="each variant's process runs this often, alternating")
    parser.add_argument("--out", default="results/verify_width_cpu/verify_width_cpu.json")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--matmul", action="store_true", help="time one [768, 8192] fp32 weight product instead")
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    if args.matmul:
        result = matmul_widths(widths)
        for name, times in result["ms"].items():
            print(f"{name:>26}: " + "  ".join(f"m={m} {t:.3f} ms" for m, t in times.items()))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        return
    if args.one:
        print(json.dumps(one(widths, args.context, args.inner, args.repeats, args.hidden, args.layers)))
        return
    runs = []
    for round_index in range(args.rounds):
        for name in args.variants.split(","):
            env = {**os.environ, "XLA_FLAGS": VARIANTS[name]}
            command = [sys.executable, __file__, "--one", *sys.argv[1:]]
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                result = {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
            else:
                result = json.loads(done.stdout.strip().splitlines()[-1])
            runs.append({"variant": name, "xla_flags": VARIANTS[name], "round": round_index, **result})
            summary = result.get("relative") or result
            print(name, round_index, json.dumps(summary), result.get("ms_per_forward", {}).get("1"), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
