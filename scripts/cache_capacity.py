"""What a long cache costs a short generation: whole calls at one fill and several capacities.

A call's cache holds prompt + max_new_tokens slots, so a caller who allows 8k new tokens and
stops after 56 pays for an 8k cache. Per step attention reads only the filled blocks
(results/attention_blocks); what is left is per call. Each capacity is timed two ways,
interleaved round-robin in one process (medians, ms):

  in_program  the cache zero-filled inside the generation's own program (before: XLA:CPU
              then wrote each layer's K/V into it out of place, a pass over the cache per write)
  donated     the cache made by a program of its own and donated (core/loop.py empty_cache)

The calls decode `--new-tokens` tokens after a `--prompt-tokens` prompt (fill = their sum)
with max_new_tokens set to reach each capacity, plain and greedy, batch 1.

    python scripts/cache_capacity.py                       # SmolLM2-135M, capacities 256 .. 8128
    python scripts/cache_capacity.py --target random-target --new-max 56,900 --repeats 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import load_target, log, machine, summary, write_json


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct", help="a model name or path (specjax.load_model)")
    parser.add_argument("--prompt-tokens", type=int, default=200, help="prompt length")
    parser.add_argument("--new-tokens", type=int, default=56, help="tokens each call decodes")
    parser.add_argument("--new-max", default="56,1900,7900", help="max_new_tokens values (each sets a capacity)")
    parser.add_argument("--repeats", type=int, default=7, help="round-robin repetitions")
    parser.add_argument("--out", default=None, help="JSON path (default results/cache_capacity/<target>.json)")
    args = parser.parse_args(argv)
    args.new_max = [int(x) for x in args.new_max.split(",")]
    if min(args.new_max) < args.new_tokens:
        raise SystemExit("specjax: error: every --new-max must be >= --new-tokens")
    name = Path(args.target).name.removesuffix(".gguf")
    args.out = args.out or f"results/cache_capacity/{name}.json"
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    import jax

    import specjax
    from specjax.engine import generation
    from specjax.engine.clock import interleaved

    target = load_target(args.target)
    prompt = [[(7 * i + 3) % target.config.vocab_size for i in range(args.prompt_tokens)]]
    real_buffer = generation.target_cache_buffer
    calls, capacities = {}, {}
    for new_max in args.new_max:
        prepared = specjax.prepare(target, prompt, specjax.GenerationConfig(max_new_tokens=new_max, ignore_eos=True))
        for variant in ("in_program", "donated"):
            key = f"{variant}_{prepared.cache_length}"
            capacities[key] = prepared.cache_length

            def call(prepared=prepared, variant=variant):
                # launch asks generation.target_cache_buffer for the donated cache at each call;
                # None sends it down the path of the code before (zeros inside the program).
                if variant == "in_program":
                    generation.target_cache_buffer = lambda plan, batch: None
                try:
                    return jax.block_until_ready(prepared.launch(args.new_tokens))
                finally:
                    generation.target_cache_buffer = real_buffer

            calls[key] = call
    log(f"timing {len(calls)} calls x {args.repeats} repeats")
    timed = interleaved(calls, args.repeats, warmup=1)
    rows = {key: {"capacity": capacities[key], **summary(seconds)} for key, seconds in timed.items()}
    smallest = min(capacities.values())
    for variant in ("in_program", "donated"):
        base = rows[f"{variant}_{smallest}"]["median"]
        for key, row in rows.items():
            if key.startswith(variant):
                row["over_smallest_capacity"] = row["median"] / base
    result = {"machine": machine(), "args": vars(args), "fill": args.prompt_tokens + args.new_tokens, "rows": rows}
    write_json(args.out, result)
    for key, row in rows.items():
        log(f"  {key}: {row['median']:.1f} ms, {row['over_smallest_capacity']:.2f}x the smallest capacity")
    return result


if __name__ == "__main__":
    main()
