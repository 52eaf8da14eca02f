"""Chain vs token tree for the block drafters (DDTree / JetSpec), on the embedded pair or SmolLM2.

For the shipped block head (`stdlib-block-head`, DFlash-style) and PARD draft
(`stdlib-pard-draft`) on `stdlib-target` (`--pair stdlib`), or SmolLM2's block drafters
(`--pair smollm2`: its block head, PARD draft, DSpark and DFlash 2 heads, on chat prompts
taken round-robin over configs/prompts/stdlib_chat's categories, the trees' tables from
smollm2_train/tune.jsonl; any weight format with --weights): the chain of K = 4 against trees built from the
one-pass per-position top-k (drafters/block_trees.py): a spine (depth d's top-k hung under
the rank-0 path) and DDTree's best-first shapes of 8 and 16 nodes from the drafter's own
confidence table (measured on train-split prompts, none shared with the timed ones).
Tokens per round (accepted drafts + 1 per row-round) and wall-clock per call, every
configuration timed round-robin (`interleaved`) with plain decoding in the same pass.

    python scripts/block_trees.py --out results/block_trees
    python scripts/block_trees.py --pair smollm2 --weights int8 --out results/smollm2_block_trees
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

from _timing import describe_prompts, held_out_prompts

# --pair: the target, its block drafters (label -> name), the timed prompts, the tune prompts
# (whose rounds measure DDTree's confidence table; none shared with the timed ones)
PAIRS = {
    "stdlib": {
        "target": "stdlib-target",
        "drafters": {"block head": "stdlib-block-head", "PARD": "stdlib-pard-draft"},
        "domain": "code",
        "tune": [{"domain": "code", "count": 8, "prompt_bytes": 96, "split": "train"}],
    },
    "smollm2": {
        "target": "smollm2-135m-instruct",
        "drafters": {
            "block head": "smollm2-block-head",
            "PARD": "smollm2-pard-draft",
            "DSpark": "smollm2-dspark-head",
            "DFlash 2": "smollm2-dflash2-head",
        },
        "domain": "chat",
        "tune": [{"file": "configs/prompts/smollm2_train/tune.jsonl", "count": 8, "chat_template": True}],
    },
}
# Interpretation, written after the recorded run (results/block_trees); the lines above it
# in the README are computed from the run itself.
READING = {
    "stdlib": [
        "- Greedy, trees buy tokens per round: +11% for the block head with the 3-2-2-1 spine,",
        "  +14% / +12% for the block head / PARD with DDTree's 16-node shape. Wall-clock does not",
        "  follow: on this CPU a target forward of width 9 or 17 costs clearly more than one of",
        "  width 5 and the embedded target is small, so verification dominates a round; only the",
        "  block head's ddtree-8 was faster than its chain (0.84 against 0.90 s, within the noise",
        "  of its repeats), every other tree slower.",
        "- DDTree's own score under-rates these drafters: their mean rank-0 probability by block",
        "  position (block head 0.53, 0.37, 0.26, 0.22; PARD 0.68, 0.52, 0.33, 0.28) is far below",
        "  the measured chain acceptance given the parent (block head 0.72, 0.67, 0.56, 0.54;",
        "  PARD 0.91, 0.60, 0.53, 0.63), so its best-first shapes are wide and shallow (ddtree-8",
        "  stops at depth 3) and PARD's ddtree-8 is below its chain (-2%). A table measured",
        "  against the target (tune_tree's way) would go deeper; tune_tree does not take block",
        "  drafters yet.",
        "- At T = 1 DDTree's top-k candidates LOSE to the sampled chain (PARD 2.16-2.49 against",
        "  2.66 tokens/round): a deterministic top-1 is accepted with probability p(top-1), a",
        "  sampled draft with sum min(p, q), larger for a drafter close to the target; top-k only",
        "  catches up where a node has several children. I.i.d. candidates (`[sample]`, the",
        "  drafters' default tree_candidates) keep the chain's acceptance along the spine and add",
        "  siblings: +13% (PARD) and +17% (block head) tokens per round with 16 nodes.",
        "- Disappointing, plainly: on the embedded pair on this machine trees do not pay on",
        "  wall-clock, and at T = 0 only the PARD chain beats plain decoding (1.17x). Trees over",
        "  block drafters should pay where verify width is nearly free (a GPU, a larger target);",
        "  not measured here. Timings are from a shared 2-core VM (load average about 5-6).",
    ],
    "smollm2": [
        "- On SmolLM2 (float32, batch 5, greedy) every tree buys tokens per round over its chain:",
        "  +13-19% with the 3-2-2-1 spine for PARD and the block head, +16-28% with DDTree's",
        "  16-node shape (PARD 1.65 -> 1.97, block head 1.45 -> 1.86). None buys time: a float32",
        "  verify of 9 or 17 slots per row costs more than the tokens it adds here, so every tree",
        "  is slower than its chain (PARD chain 0.84x plain, its 16-node tree 0.55x). These are",
        "  float32 runs on purpose: token trees were not exact in the bfloat16 and int8 formats when",
        "  they ran (fixed the same day, 7c4f97d); in int8 (int8/README.md) the trees cost more still.",
        "- The block drafters' chains are all below plain decoding in float32 at batch 5 (0.81-0.86x)",
        "  with 1.41-1.65 tokens per round; in int8 at batch 1 the same drafters' chains reach",
        "  1.04-1.23x (results/smollm2_e8_final).",
    ],
    "smollm2/int8": [
        "- In int8 (exact since 7c4f97d: the nodes laid at their positions for the fixed-order sums,",
        "  models/tree_layout.py) the trees buy what they buy in float32: +19-27% tokens per round",
        "  with DDTree's 16 nodes (PARD 1.84 -> 2.19, block head 1.53 -> 1.94), +11-17% with the",
        "  3-2-2-1 spine. They cost far more than in float32: an 8-node tree's call takes 1.66-2.03x",
        "  its chain's (float32: 1.07-1.15x), a 16-node tree's 2.33-2.87x (float32: 1.40-1.52x), so",
        "  every tree runs at 0.26-0.45x int8 plain decoding and the chains at 0.71-0.79x. Int8 plain",
        "  decoding is 2.8x float32's here (3.25 against 9.19 s a call), the chains 2.4-2.8x, the",
        "  16-node trees 1.3-1.6x. The tree's forward alone, laid against not laid, measured",
        "  1.08-1.58x (scripts/tree_attention_check.py, results/width_classes); where the rest of a",
        "  tree round's cost at batch 5 goes is not decomposed yet (a round profile of a tree round",
        "  in int8 is the next measurement).",
        "- The first int8 run of this command (not kept) timed compiles: its 17 programs outgrew",
        "  the process's memory mappings, JAX's caches were cleared before nearly every call, and",
        "  plain decoding read 12.5 s a call. Round-robin timers now time a call again when it",
        "  compiled (engine/clock.py `timed_warm`); this run had vm.max_map_count at 262144 and",
        "  no clears (`cache_clears` in results.json).",
    ],
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=sorted(PAIRS), default="stdlib", help="the target and its block drafters")
    parser.add_argument("--weights", choices=["float32", "bfloat16", "int8"], default="float32")
    parser.add_argument(
        "--prompts",
        type=int,
        default=8,
        help="timed prompts, in one batch",
    )
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per configuration, round-robin")
    parser.add_argument("--temperatures", default="0,1", help="comma-separated temperatures")
    parser.add_argument(
        "--candidates", default="top,sample", help="T > 0 tree candidates: top (DDTree's top-k), sample (i.i.d. draws)"
    )
    parser.add_argument("--k", type=int, default=4, help="the chain's K and the trees' depth cap (block_size 4)")
    parser.add_argument("--out", default="results/block_trees")
    parser.add_argument("--readme-only", action="store_true", help="rewrite README.md from OUT/results.json")
    return parser.parse_args(argv)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def confidence_table(target, drafter, prompts, depth: int, max_rank: int = 8, max_new_tokens: int = 64):
    """[depth, max_rank]: the drafter's mean probability (softmax at T = 1) of its rank-r
    token at block position d, over the rounds of a greedy chain of K = depth on `prompts`:
    DDTree's own estimate of a candidate's survival (no target logits read), so it
    overrates a weak drafter."""
    import numpy as np

    import specjax
    from specjax.drafters.block_trees import recording

    rows = []

    def sink(top, done):  # top [B, depth, R], done [B]
        rows.append(np.asarray(top)[~np.asarray(done)])

    config = specjax.GenerationConfig(max_new_tokens=max_new_tokens, ignore_eos=True)
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=depth)
    specjax.generate(target, prompts, config, draft=recording(drafter, sink, max_rank), speculative=speculative)
    return np.concatenate(rows, axis=0).mean(axis=0)


def shapes(target, drafter, tune_prompts, k: int) -> dict:
    """The speculative configs compared for one drafter: name -> (SpeculativeConfig, tree or None)."""
    import specjax
    from specjax.drafters.block_trees import spine_paths
    from specjax.trees import Tree

    table = confidence_table(target, drafter, tune_prompts, depth=k, max_rank=8, max_new_tokens=64)
    trees = {
        "spine 3-2-2-1": Tree.from_paths(spine_paths([3, 2, 2, 1][:k])),
        "ddtree-8": Tree.from_acceptance(table[:k], 8),  # DDTree's best-first, on its own confidences
        "ddtree-16": Tree.from_acceptance(table[:k], 16),
    }
    out = {f"chain:{k}": (specjax.SpeculativeConfig(num_speculative_tokens=k), None)}
    for name, tree in trees.items():
        out[name] = (specjax.SpeculativeConfig(tree=tree), tree)
    return out, table.round(4).tolist()


def measure(args) -> dict:
    import numpy as np

    import specjax
    from specjax.bench.prompt_sets import Prompts, load_prompts
    from specjax.engine.clock import interleaved
    from specjax.runtime import cache_clears

    pair = PAIRS[args.pair]
    target = specjax.load_model(pair["target"], weights=args.weights)
    prompts = held_out_prompts(target.tokenizer, pair["domain"], args.prompts)
    tune = load_prompts([Prompts(**p) for p in pair["tune"]], target.tokenizer).tokens
    drafters = {label: specjax.load_drafter(name, target) for label, name in pair["drafters"].items()}
    configs, tables = {}, {}
    for label, drafter in drafters.items():
        start = time.perf_counter()
        specs, tables[label] = shapes(target, drafter, tune, args.k)
        log(f"{label}: confidence table in {time.perf_counter() - start:.1f} s")
        for name, (speculative, tree) in specs.items():
            configs[(label, name)] = (drafter, speculative, tree)
    rows = []
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        setting = specjax.GenerationConfig.at_temperature(
            temperature, max_new_tokens=args.new_tokens, seed=0, ignore_eos=True
        )
        candidates = args.candidates.split(",")
        calls, stats, keyed, tokens = _calls(target, prompts, setting, configs, candidates)
        start = time.perf_counter()
        times = interleaved(calls, repeats=args.repeats, warmup=1)
        log(f"T={temperature}: {len(calls)} configurations in {time.perf_counter() - start:.1f} s")
        plain = statistics.median(times[("plain", "plain")])
        new = len(prompts) * args.new_tokens
        for (label, name), seconds in times.items():
            s = stats.get((label, name))
            tree = keyed[(label, name)][2] if s is not None else None
            rows.append(
                {
                    "temperature": temperature,
                    "drafter": label,
                    "shape": name,
                    "nodes": tree.num_nodes if tree is not None else (args.k if s is not None else 0),
                    "depth": tree.depth if tree is not None else (args.k if s is not None else 0),
                    "paths": [list(p) for p in tree.paths] if tree is not None else None,
                    "tokens_per_round": round(s.mean_acceptance_length, 4) if s is not None else 1.0,
                    "accepted_per_position": np.round(s.accepted_per_position, 4).tolist() if s is not None else [],
                    "seconds_per_call": [round(x, 4) for x in seconds],
                    "median_seconds": round(statistics.median(seconds), 4),
                    "tokens_per_second": round(new / statistics.median(seconds), 1),
                    "speedup_vs_plain": round(plain / statistics.median(seconds), 3),
                    # greedy: every drafter and tree must give plain decoding's tokens
                    "output_matches_plain": tokens[(label, name)] == tokens[("plain", "plain")]
                    if temperature == 0
                    else None,
                }
            )
            r = rows[-1]
            log(f"  {label:10s} {name:14s} {r['tokens_per_round']:.3f} tokens/round {r['median_seconds']:.3f} s")
    # cache_clears: how often the round-robin's programs outgrew the process's memory mappings
    # (runtime.bound_live_programs); the calls that then compiled were timed again.
    return {"rows": rows, "confidence_tables": tables, "timed_prompts": len(prompts), "cache_clears": cache_clears()}


def _calls(target, prompts, setting, configs: dict, candidates: list[str]):
    """(label, shape) -> a zero-argument call of generate (returning tokens); the dicts each
    call leaves its GenerationStats and its tokens in; and each key's (drafter, speculative, tree). A tree
    runs once per tree_candidates mode in `candidates` (greedy ranks by logits either way)."""
    import specjax

    stats, keyed, tokens = {}, {}, {}

    def plain():
        tokens[("plain", "plain")] = specjax.generate(target, prompts, setting).tokens
        return tokens[("plain", "plain")]

    calls = {("plain", "plain"): plain}
    for (label, name), (drafter, speculative, tree) in configs.items():
        modes = [None] if tree is None or setting.sampling.greedy else candidates
        for mode in modes:
            key = (label, name if mode is None or setting.sampling.greedy else f"{name} [{mode}]")
            if mode is not None:
                drafter = dataclasses.replace(drafter, tree_candidates=mode)
            keyed[key] = (drafter, speculative, tree)

            def call(key=key, drafter=drafter, speculative=speculative):
                out = specjax.generate(target, prompts, setting, draft=drafter, speculative=speculative)
                stats[key], tokens[key] = out.stats, out.tokens
                return out.tokens

            calls[key] = call
    return calls, stats, keyed, tokens


def comparisons(rows: list[dict]) -> list[str]:
    """One line per (T, drafter): its best tree by tokens per round against its chain."""
    lines = []
    for t in sorted({r["temperature"] for r in rows}):
        for label in dict.fromkeys(r["drafter"] for r in rows if r["drafter"] != "plain"):
            mine = [r for r in rows if r["temperature"] == t and r["drafter"] == label]
            chain = next(r for r in mine if r["paths"] is None)
            best = max((r for r in mine if r["paths"] is not None), key=lambda r: r["tokens_per_round"])
            gain = best["tokens_per_round"] / chain["tokens_per_round"] - 1
            wall = chain["median_seconds"] / best["median_seconds"] - 1
            lines.append(
                f"- T = {t:g}, {label}: best tree `{best['shape']}` ({best['nodes']} nodes) "
                f"{best['tokens_per_round']:.3f} tokens/round against the chain's {chain['tokens_per_round']:.3f} "
                f"({gain:+.1%}); wall-clock {wall:+.1%} against the chain (positive: the tree is faster)."
            )
    return lines


def write_readme(out: Path, args, result: dict, command: str, machine: dict, seconds: float) -> None:
    pair_name = getattr(args, "pair", "stdlib")  # records from before --pair are the embedded pair's
    pair = PAIRS[pair_name]
    names = ", ".join(f"{label} (`{name}`)" for label, name in pair["drafters"].items())
    weights = getattr(args, "weights", "float32")
    title = "embedded pair" if pair_name == "stdlib" else f"SmolLM2-135M-Instruct, {weights}"
    lines = [
        f"# Chain vs token tree for the block drafters (DDTree / JetSpec, CPU, {title})",
        "",
        f"**What it measures.** `{pair['target']}` ({weights} weights) with the shipped block drafters",
        f"{names}: the chain of",
        f"K = {args.k} against token trees whose depth-d nodes are block position d's top-ranked",
        "tokens from the drafter's ONE forward (drafters/block_trees.py): `spine 3-2-2-1` (depth",
        "d's top-k under the rank-0 path) and `ddtree-8` / `ddtree-16` (the 8- and 16-node trees",
        "of highest product of the drafter's own rank probabilities, table measured on 8",
        "train-split prompts). All capped at depth 4 (the head's block_size).",
        f"{result.get('timed_prompts', args.prompts)} {describe_prompts(pair['domain'])} in one batch,",
        f"{args.new_tokens} new tokens,",
        f"ignore_eos, {args.repeats} timed calls per configuration, round-robin with plain decoding",
        "(after one warm-up call each). At T > 0 each tree runs with `[top]` candidates (DDTree's",
        "top-k, q = None, recursive rejection without replacement) and `[sample]` candidates",
        "(i.i.d. draws from the position's distribution, SpecInfer's rule); the chain samples.",
        "",
        "**Command.**",
        "",
        f"    {command}",
        "",
        f"({seconds:.0f} s in all.)",
        "",
        f"**Machine.** {machine.get('cpu')} ({machine.get('cpu_count')} cores), jax {machine.get('jax')} "
        f"{machine.get('backend')}, at commit {machine.get('git_commit')} plus the working tree's changes, "
        f"load average {machine.get('load_average')} (shared with other jobs: wall-clock is noisy).",
        "",
        "| T | drafter | shape | nodes | depth | tokens/round | s/call (median) | tokens/s | vs plain |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['temperature']:g} | {r['drafter']} | {r['shape']} | {r['nodes']} | {r['depth']} "
            f"| {r['tokens_per_round']:.3f} | {r['median_seconds']:.3f} | {r['tokens_per_second']:.0f} "
            f"| {r['speedup_vs_plain']:.2f}x |"
        )
    greedy = [r for r in result["rows"] if r.get("output_matches_plain") is not None and r["drafter"] != "plain"]
    if greedy:
        wrong = [f"{r['drafter']} {r['shape']}" for r in greedy if not r["output_matches_plain"]]
        lines += ["", f"Greedy output equal to plain decoding's, token for token: {len(greedy) - len(wrong)} of"]
        lines += [f"{len(greedy)} rows" + (f" (**not**: {', '.join(wrong)})." if wrong else ".")]
    if result.get("cache_clears"):
        lines += ["", f"JAX's caches were cleared {result['cache_clears']} times (runtime.bound_live_programs):"]
        lines += ["calls that then compiled were timed again; raise vm.max_map_count to spare the time."]
    reading = READING.get(f"{pair_name}/{weights}", READING.get(pair_name, []) if weights == "float32" else [])
    lines += ["", "**Reading.**", "", *comparisons(result["rows"]), "", *reading, ""]
    lines += ["Per-run details (paths, acceptance by depth, every timed call, confidence tables, machine)"]
    lines += ["are in `results.json`."]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.readme_only:  # the README from a recorded run (its command, machine and args)
        record = json.loads((out / "results.json").read_text())
        recorded = argparse.Namespace(**record["args"])
        write_readme(out, recorded, record, record["command"], record["machine"], record["seconds"])
        return 0
    command = "python scripts/block_trees.py " + " ".join(sys.argv[1:] if argv is None else argv)
    start = time.perf_counter()
    result = measure(args)
    seconds = time.perf_counter() - start
    from specjax.bench.timing import environment, load_average

    machine = {**environment(), "load_average": load_average()}
    record = {
        "command": command.strip(),
        "args": vars(args),
        "machine": machine,
        "seconds": round(seconds, 1),
        **result,
    }
    (out / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    write_readme(out, args, result, command.strip(), machine, seconds)
    for r in result["rows"]:
        print({k: r[k] for k in ("temperature", "drafter", "shape", "tokens_per_round", "speedup_vs_plain")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
