"""Do the round costs adaptive speculation measures match what a round costs end to end?

For the embedded pair at one batch size: plain decoding and static K = 1, 2, 4, 8, each run
end to end for 16 and for 128 new tokens, round-robin; the end-to-end marginal cost of a loop
iteration is (t(128) - t(16)) / (iterations(128) - iterations(16)), which cancels prefill,
dispatch and the host-side collection. Beside it, the costs the policy reads
(engine/round_costs.py: the slope between loops of 2 and 10 iterations) and the same loops
timed the old way (4 iterations per call, the call's fixed cost divided over them).

    python scripts/round_cost_check.py --batch 1 --out results/round_cost_check/round_cost_check_b1.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import jax

import specjax
from specjax.bench.prompt_sets import Prompts, load_prompts
from specjax.bench.timing import environment, interleaved
from specjax.core.loop import DEFAULT_CACHE
from specjax.engine.round_costs import measure_round_costs
from specjax.engine.timed_loops import TimedLoop

KS = (0, 1, 2, 4, 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="results/round_cost_check/round_cost_check.json")
    args = parser.parse_args()

    target, draft = specjax.load_model("stdlib-target"), specjax.load_model("stdlib-draft")
    source = Prompts(domain="code", count=max(args.batch, 8), prompt_bytes=96)
    prompts = load_prompts([source], target.tokenizer).tokens[: args.batch]
    new, short = 128, 16
    calls = {0: specjax.prepare(target, prompts, specjax.GenerationConfig(max_new_tokens=new))}
    calls.update(
        {
            k: specjax.prepare(
                target,
                prompts,
                specjax.GenerationConfig(max_new_tokens=new),
                draft=draft,
                speculative=specjax.SpeculativeConfig(num_speculative_tokens=k),
            )
            for k in KS[1:]
        }
    )
    fns = {(k, n): (lambda c=c, n=n: c.launch(n)) for k, c in calls.items() for n in (short, new)}
    times = interleaved(fns, args.repeats, warmup=1)
    iterations = {key: int(jax.device_get(fn().forwards)) for key, fn in fns.items()}

    config = specjax.AdaptiveConfig(ks=KS).resolved(max(KS))
    context = calls[max(KS)].cache_length
    policy_costs = measure_round_costs(target, draft, args.batch, config, context)
    loops = {k: ("step" if k == 0 else "round", target, None if k == 0 else draft, args.batch, k, context, 0.0)
             for k in KS}  # fmt: skip
    four = {k: TimedLoop(*loop, None, DEFAULT_CACHE, None).call(4) for k, loop in loops.items()}
    old_times = interleaved(four, 3, warmup=1)

    rows = []
    for k in KS:
        t_short, t_long = (statistics.median(times[(k, n)]) for n in (short, new))
        marginal = (t_long - t_short) / (iterations[(k, new)] - iterations[(k, short)])
        rows.append(
            {
                "k": k,
                "end_to_end_seconds_128": t_long,
                "iterations_128": iterations[(k, new)],
                "end_to_end_marginal_seconds": marginal,
                "policy_cost_seconds": policy_costs[k],
                "four_iteration_call_seconds": statistics.median(old_times[k]) / 4,
            }
        )
    base = {name: rows[0][name] for name in ("end_to_end_marginal_seconds", "policy_cost_seconds")}
    base["four_iteration_call_seconds"] = rows[0]["four_iteration_call_seconds"]
    for row in rows:
        row["relative_to_plain"] = {name: row[name] / base[name] for name in base}
        print(
            f"K={row['k']}: end to end {row['end_to_end_marginal_seconds'] * 1e3:.3f} ms, "
            f"policy {row['policy_cost_seconds'] * 1e3:.3f} ms, 4-iteration calls "
            f"{row['four_iteration_call_seconds'] * 1e3:.3f} ms per iteration",
            flush=True,
        )
    out = {"command": f"python scripts/round_cost_check.py --batch {args.batch}", "environment": environment()}
    out.update(batch_size=args.batch, rows=rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
