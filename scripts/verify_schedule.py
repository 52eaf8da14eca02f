"""Confidence-scheduled verification against static K on the embedded pair.

Static chains of K = 1, 2, 4 and two schedules that draft K = 4 and verify 0, 1, 2 or 4 of
the drafts: "schedule" (the default, segments of static chains K = 1, 2, 4 beside the
confidence arm, chosen from past rounds) and "confidence only" (`chains: false`, every
round's width from its drafts), at each batch size and temperature asked, timed
round-robin (medians of whole generations, compiled beforehand). The costs are measured
per width and per chain first (engine/verify_costs.py). Reports seconds, tokens per target
forward, the rounds per verify width and per arm.

--mixed: the batch's rows alternate between a prompt the drafter continues well (a
repeated line) and the four prose/code prompts, so that acceptance differs between rows.

--seeds N: under sampling, each timed call generates N times, with seeds 0..N-1, and the
counts add up over them. At batch 1 every program samples its own text, so one seed compares
texts as much as schedules; N of them average that out.

--acceptance: also time "schedule, measured acceptance": the schedule started from the
acceptance per position a static chain of K measured beforehand on other prompts (and other
seeds), as a caller carries it from earlier calls of the same pair (VerifySchedule.acceptance),
worth --acceptance-rounds rounds (one schedule per value given; the first keeps that name,
the others add "xN").

    python scripts/verify_schedule.py --batch 1 4 --temperature 0 1 --new 64
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import jax

import specjax
from specjax.bench.timing import environment, interleaved
from specjax.engine.output import acceptance_metrics
from specjax.engine.verify_costs import measure_schedule_costs

PROMPTS = [
    "def merge_sorted(a, b):\n    result = []\n",
    "The history of the printing press begins",
    "import numpy as np\n\ndef softmax(x):\n",
    "Once upon a time, in a small village,",
]
# Where --acceptance measures the acceptance the schedule starts from: not the timed prompts.
CALIBRATION = [
    "def read_lines(path):\n    with open(path) as f:\n",
    "The river runs through the valley and",
    "class Stack:\n    def __init__(self):\n",
    "In the beginning of the twentieth century,",
]
REPEATED = "for i in range(10):\n    print(i)\n" * 6  # the drafter continues this well


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    parser.add_argument("--temperature", type=float, nargs="+", default=[0.0])
    parser.add_argument("--new", type=int, default=64, help="tokens per generation")
    parser.add_argument("--k", type=int, default=4, help="the schedule's K (drafts per round)")
    parser.add_argument("--draft", default="stdlib-draft", help="any drafter name (stdlib-block-head: a head)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mixed", action="store_true", help="rows that differ in acceptance (see above)")
    parser.add_argument("--seeds", type=int, default=1, help="generations per timed call under sampling (see above)")
    parser.add_argument("--decay", type=float, default=0.9, help="the schedules' VerifySchedule.decay")
    parser.add_argument("--acceptance", action="store_true", help="also start a schedule from measured acceptance")
    parser.add_argument("--acceptance-rounds", type=float, nargs="+", default=[16.0], help="its acceptance_rounds")
    parser.add_argument("--out", default="results/verify_schedule/verify_schedule.json")
    args = parser.parse_args()

    target = specjax.load_model("stdlib-target")
    draft = specjax.load_drafter(args.draft, target)
    rows = []
    for batch in args.batch:
        pool = [x for p in PROMPTS for x in (REPEATED, p)] if args.mixed else PROMPTS
        prompts = [pool[i % len(pool)] for i in range(batch)]
        for t in args.temperature:
            seeds = range(args.seeds if t > 0 else 1)
            configs = [
                specjax.GenerationConfig.at_temperature(t, max_new_tokens=args.new, ignore_eos=True, seed=seed)
                for seed in seeds
            ]
            config = configs[0]

            def prepared(speculative, prompts=prompts, configs=configs):  # one prepared call per seed
                return [specjax.prepare(target, prompts, c, draft=draft, speculative=speculative) for c in configs]

            calls = {
                f"static K={k}": prepared(specjax.SpeculativeConfig(num_speculative_tokens=k)) for k in (1, 2, args.k)
            }
            # The costs at the generation's own cache length, as `costs: measure` takes them
            # (attention reads every slot: a longer cache dilutes the differences between widths).
            context = calls[f"static K={args.k}"][0].cache_length
            ks = specjax.VerifySchedule().resolved(args.k).chain_ks
            costs, chain_costs = measure_schedule_costs(
                target, draft, batch, args.k, context=context, ks=ks, sampling=config.sampling
            )
            schedules = {
                "schedule": specjax.VerifySchedule(costs=costs, chain_costs=chain_costs, decay=args.decay),
                "confidence only": specjax.VerifySchedule(costs=costs, chains=False, decay=args.decay),
            }
            measured = measured_acceptance(target, draft, batch, args.k, configs) if args.acceptance else None
            for i, weight in enumerate(args.acceptance_rounds if args.acceptance else []):
                name = "schedule, measured acceptance" + (f" x{weight:g}" if i else "")
                schedules[name] = specjax.VerifySchedule(
                    costs=costs, chain_costs=chain_costs, decay=args.decay,
                    acceptance=measured, acceptance_rounds=weight,
                )  # fmt: skip
            for name, schedule in schedules.items():
                calls[name] = prepared(
                    specjax.SpeculativeConfig(num_speculative_tokens=args.k, verify_schedule=schedule)
                )
            launches = {k: (lambda ps=ps: [p.launch() for p in ps]) for k, ps in calls.items()}
            times = interleaved(launches, args.repeats, warmup=1)
            for name, call in calls.items():
                stats = [p.run().stats for p in call]
                s = stats[0]
                row = {
                    "batch": batch,
                    "temperature": t,
                    "name": name,
                    "seeds": len(stats),
                    "seconds": statistics.median(times[name]),
                    "tokens_per_forward": sum(x.generated_tokens for x in stats)
                    / max(sum(x.target_forwards for x in stats), 1)
                    / batch,
                    "mean_acceptance_length": statistics.mean(x.mean_acceptance_length for x in stats),
                }
                if name in schedules:
                    if schedules[name].acceptance is not None:
                        row["acceptance"] = list(schedules[name].acceptance)
                        row["acceptance_rounds"] = schedules[name].acceptance_rounds
                    row["cost_context"] = context
                    row["costs_ms"] = {w: round(1e3 * c, 3) for w, c in costs.items()}
                    row["chain_costs_ms"] = {k: round(1e3 * c, 3) for k, c in chain_costs.items()}
                    counts = {k: sum(x.drafter[k] for x in stats) for k in s.drafter if k.endswith("_rounds")}
                    row["rounds_per_width"] = {
                        k.removeprefix("verify_width_").removesuffix("_rounds"): v
                        for k, v in counts.items()
                        if k.startswith("verify_width_")
                    }
                    row["rounds_per_arm"] = {
                        k.removeprefix("schedule_").removesuffix("_rounds"): v
                        for k, v in counts.items()
                        if k.startswith("schedule_") and v
                    }
                rows.append(row)
                print(
                    f"b={batch} T={t} {name:12s} {1e3 * row['seconds']:8.1f} ms  "
                    f"{row['tokens_per_forward']:.2f} tok/forward",
                    row.get("rounds_per_width", ""),
                    row.get("rounds_per_arm", ""),
                )
    command = "python scripts/verify_schedule.py " + " ".join(
        [f"--batch {' '.join(map(str, args.batch))}", f"--temperature {' '.join(map(str, args.temperature))}",
         f"--draft {args.draft}", "--mixed" * args.mixed,
         f"--new {args.new}", f"--k {args.k}", f"--repeats {args.repeats}", f"--seeds {args.seeds}",
         f"--decay {args.decay}", "--acceptance" * args.acceptance,
         f"--acceptance-rounds {' '.join(f'{w:g}' for w in args.acceptance_rounds)}" * args.acceptance]
    )  # fmt: skip
    result = {"command": command, "environment": environment(), "device": str(jax.devices()[0]), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


def measured_acceptance(target, draft, batch: int, k: int, configs) -> tuple[float, ...]:
    """The acceptance per position of a static chain of K on the CALIBRATION prompts, at seeds
    1000 + those of `configs`, pooled: what earlier calls of the pair would have measured."""
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=k)
    prompts = [CALIBRATION[i % len(CALIBRATION)] for i in range(batch)]
    counts, reached = [0] * k, [0] * k  # the counters, pooled over texts; the rates derive from them
    for c in configs:
        config = c.replace(seed=1000 + c.seed)
        stats = specjax.generate(target, prompts, config, draft=draft, speculative=speculative).stats
        counts = [a + b for a, b in zip(counts, stats.accepted_counts, strict=True)]
        reached = [a + b for a, b in zip(reached, stats.position_rounds, strict=True)]
    rates = acceptance_metrics(0, 0, 0, counts, reached)["accepted_per_position"]
    return tuple(round(r, 4) for r in rates[: next((i for i, n in enumerate(reached) if not n), k)] or [0.5])


if __name__ == "__main__":
    main()
