"""Prefill of long prompts: time and peak memory against prompt length, chunked or not.

Each (prompt length, prefill chunk) runs in its own process, so the peak resident memory
(ru_maxrss) belongs to that prefill alone. One run is `generate(..., max_new_tokens=1)`:
the prefill plus one decode step. The first call compiles; the second is timed.

    python scripts/long_prompt.py --lengths 1024,4096,16384,32768 --out results/long_prompt/long_prompt.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def one(length: int, chunk: int, model_name: str) -> dict:
    import numpy as np

    import specjax
    from specjax.io.presets import resolve_model

    model = resolve_model(model_name)
    model = specjax.Model(model.config.replace(max_position_embeddings=length + 64), model.params)
    prompt = [np.random.default_rng(0).integers(0, model.config.vocab_size, size=length).tolist()]
    cache = specjax.CacheConfig(prefill_chunk=chunk)
    start = time.perf_counter()
    specjax.generate(model, prompt, specjax.GenerationConfig(max_new_tokens=1, cache=cache))
    first = time.perf_counter() - start
    start = time.perf_counter()
    out = specjax.generate(model, prompt, specjax.GenerationConfig(max_new_tokens=1, cache=cache))
    seconds = time.perf_counter() - start
    return {
        "prompt_tokens": length,
        "prefill_chunk": chunk,
        "seconds": seconds,
        "first_call_seconds_with_compile": first,
        "prefill_tokens_per_second": length / seconds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "generated": out.tokens[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="random-target")
    parser.add_argument("--lengths", default="1024,4096,16384,32768")
    parser.add_argument("--chunks", default="512,0", help="prefill chunks; 0 = one shot (chunk = prompt length)")
    parser.add_argument("--out", default="results/long_prompt/long_prompt.json")
    parser.add_argument("--one", nargs=3, metavar=("LENGTH", "CHUNK", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(int(args.one[0]), int(args.one[1]), args.one[2])))
        return
    rows = []
    for length in map(int, args.lengths.split(",")):
        for chunk in map(int, args.chunks.split(",")):
            chunk = chunk or length
            command = [sys.executable, __file__, "--one", str(length), str(chunk), args.model]
            done = subprocess.run(command, capture_output=True, text=True, env=os.environ)
            if done.returncode != 0:
                tail = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
                row = {"prompt_tokens": length, "prefill_chunk": chunk, "error": tail[0][:300]}
            else:
                row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "generated"}), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"model": args.model, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
