"""Many mixed generation calls in one process: does it survive, and what grows? (issue 15)

Each call draws one of 4 tiny random target/draft pairs, a batch of 1-4 ragged prompts
(1-40 tokens), plain decoding or speculative decoding with the draft model or prompt
lookup, K in 1..8, a max_new_tokens, greedy or sampled. Most calls need a program no
earlier call compiled, so JAX's caches (and the XLA:CPU executables they keep alive)
grow with the number of calls. Every --log-every calls it logs compiled programs,
live executables, memory mappings against vm.max_map_count, and resident memory, and
rewrites the JSON trajectory (so a run that dies keeps what it logged).

On jax 0.10.2 / XLA:CPU each live executable holds its JIT code in memory mappings of
its own (about 400 for a speculative loop); at vm.max_map_count (65530 by default) the
next compile fails inside `backend_compile_and_load`. specjax clears JAX's caches before
that (specjax/runtime.py `bound_live_programs`); --no-guard switches that off to reproduce
the crash.

    python scripts/compile_stress.py --out results/compile_stress/compile_stress.json
    python scripts/compile_stress.py --no-bucketing --out results/compile_stress/compile_stress_no_bucketing.json
    python scripts/compile_stress.py --no-guard --out results/compile_stress/compile_stress_no_guard.json
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import platform
import random
import sys
import time
from pathlib import Path

import jax
import jax.extend.backend

import specjax
from specjax import runtime as output_module
from specjax.bench.compiles import compiled_programs
from specjax.drafters import PromptLookup
from specjax.engine import prompts as prompts_module

PAIRS = 4


def _pair(index: int) -> tuple[specjax.Model, specjax.Model]:
    """A tiny target and draft; weights scaled up as in tests/conftest.py so that greedy
    paths vary and distributions are peaked. Pairs differ in vocabulary (their own programs)."""
    target_config = specjax.ModelConfig(
        vocab_size=48 + 16 * index,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    draft_config = target_config.replace(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
    )

    def scaled(config, seed):
        model = specjax.init_model(config, seed)
        return specjax.Model(config, jax.tree.map(lambda x: x * 8.0 if x.ndim > 1 else x, model.params))

    return scaled(target_config, 2 * index), scaled(draft_config, 2 * index + 1)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _snapshot(call: int, start: float, shapes: set) -> dict:
    mappings = output_module.memory_mappings() or (None, None)
    return {
        "calls": call,
        "seconds": round(time.perf_counter() - start, 1),
        "compiled_programs": compiled_programs(),  # backend compiles so far (recompiles count again)
        "distinct_generation_shapes": len(shapes),  # programs the workload needs, ignoring tiny eager ones
        "live_executables": len(jax.extend.backend.get_backend().live_executables()),
        "memory_mappings": mappings[0],
        "max_map_count": mappings[1],
        "rss_mb": round(_rss_mb(), 1),
        "cache_clears_by_guard": output_module.cache_clears(),
    }


def _draw(rng: random.Random, pairs) -> dict:
    pair = rng.randrange(PAIRS)
    target, _ = pairs[pair]
    vocab = target.config.vocab_size
    batch = rng.randint(1, 4)
    return {
        "pair": pair,
        "method": rng.choice(["plain", "draft_model", "prompt_lookup"]),
        "prompts": [[rng.randrange(1, vocab) for _ in range(rng.randint(1, 40))] for _ in range(batch)],
        "k": rng.randint(1, 8),
        "max_new_tokens": rng.randint(1, 48),
        "temperature": rng.choice([0.0, 1.0]),
        "seed": rng.randrange(1 << 16),
    }


def _run(case: dict, pairs) -> tuple[specjax.GenerationOutput, tuple]:
    target, draft = pairs[case["pair"]]
    config = specjax.GenerationConfig.at_temperature(
        case["temperature"], max_new_tokens=case["max_new_tokens"], seed=case["seed"]
    )
    if case["method"] == "plain":
        prepared = specjax.prepare(target, case["prompts"], config)
        k = 0
    else:
        drafter = draft if case["method"] == "draft_model" else PromptLookup()
        k = case["k"]
        speculative = specjax.SpeculativeConfig(num_speculative_tokens=k)
        prepared = specjax.prepare(target, case["prompts"], config, draft=drafter, speculative=speculative)
    rows = prompts_module._batch_bucket(len(case["prompts"]))
    prompt_bucket = prompts_module._bucket(max(len(p) for p in case["prompts"]))
    shape = (case["pair"], case["method"], k, case["temperature"] > 0, rows, prompt_bucket, prepared.cache_length)
    return prepared.run(), shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--clear-caches-every", type=int, default=0, help="jax.clear_caches() every N calls (0: never)")
    parser.add_argument("--no-bucketing", action="store_true", help="run every batch at its own size")
    parser.add_argument("--no-guard", action="store_true", help="never clear caches near vm.max_map_count")
    parser.add_argument("--out", type=Path, default=Path("results/compile_stress/compile_stress.json"))
    args = parser.parse_args()

    faulthandler.enable()
    compiled_programs()  # start counting now
    if args.no_bucketing:
        prompts_module._batch_bucket = lambda n: n
    if args.no_guard:
        output_module.MAP_HEADROOM = 0.0
    rng = random.Random(args.seed)
    pairs = [_pair(i) for i in range(PAIRS)]
    result = {
        "command": " ".join(sys.argv),
        "environment": {
            "jax": jax.__version__,
            "backend": jax.default_backend(),
            "python": platform.python_version(),
            "machine": platform.machine(),
        },
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "completed": False,
        "trajectory": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    shapes: set = set()
    start = time.perf_counter()

    def log(call: int) -> None:
        point = _snapshot(call, start, shapes)
        result["trajectory"].append(point)
        args.out.write_text(json.dumps(result, indent=1))
        print(" ".join(f"{k}={v}" for k, v in point.items()), flush=True)

    log(0)
    peak = 0
    for call in range(1, args.calls + 1):
        case = _draw(rng, pairs)
        sizes = [len(p) for p in case["prompts"]]
        # The state before this call's compile: the last line a crashed run printed.
        mappings = (output_module.memory_mappings() or (0, 0))[0]
        peak = max(peak, mappings)
        result["peak_memory_mappings"] = peak
        print(
            f"call {call}: pair {case['pair']} {case['method']} K={case['k']} batch={len(sizes)} lengths={sizes} "
            f"new={case['max_new_tokens']} T={case['temperature']} | programs={compiled_programs()} maps={mappings}",
            flush=True,
        )
        out, shape = _run(case, pairs)
        shapes.add(shape)
        assert len(out.tokens) == len(sizes) and all(1 <= len(t) <= case["max_new_tokens"] for t in out.tokens)
        if args.clear_caches_every and call % args.clear_caches_every == 0:
            jax.clear_caches()
        if call % args.log_every == 0 or call == args.calls:
            log(call)
    result["completed"] = True
    first, last = result["trajectory"][0], result["trajectory"][-1]
    result["summary"] = {
        "calls": args.calls,
        "compiled_programs": last["compiled_programs"],
        "distinct_generation_shapes": last["distinct_generation_shapes"],
        "max_live_executables": max(p["live_executables"] for p in result["trajectory"]),
        "peak_memory_mappings": peak,  # before any call (the guard clears above 75% of max_map_count)
        "rss_growth_mb": round(last["rss_mb"] - first["rss_mb"], 1),
        "cache_clears_by_guard": last["cache_clears_by_guard"],
        "rows_bucketed": not args.no_bucketing,
        "batch_rows_compiled": sorted({s[4] for s in shapes}),
    }
    args.out.write_text(json.dumps(result, indent=1))
    print("completed", json.dumps(result["summary"]), flush=True)


if __name__ == "__main__":
    main()
