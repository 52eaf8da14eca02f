"""The text summary `specjax generate` prints under the output: counts that add up."""

from __future__ import annotations


def _counted(rate: float, hits: int, total: int) -> str:
    """0.94 (47/50): a rate with the counts behind it, so 1.00 from 3 rounds reads as what it is."""
    return f"{rate:.2f} ({hits}/{total})"


def print_summary(args, s, tree, timing: dict, comparison: dict | None = None) -> None:
    """Print the statistics of one generation (`s`: GenerationStats) so that they reconcile:
    emitted = rounds + accepted; generated = emitted - cut (by max_new_tokens or EOS).
    `timing`: --json's timing; `comparison`: --speedup's record (cli/timed_run.py), or None."""
    print("---")
    mode = "plain" if args.plain else f"speculative K={args.num_speculative_tokens}"
    if args.adaptive and not args.plain:
        mode = f"adaptive speculative K <= {args.num_speculative_tokens}"
    if tree is not None:
        mode = f"speculative tree of {tree.num_nodes} nodes, depth {tree.depth} (verify width {s.verify_width})"
    rows = len(s.stopped_at_eos)
    print(
        f"{mode}: {s.generated_tokens} tokens in {rows} row{'s' * (rows != 1)}, {s.target_forwards} target forwards, "
        f"{s.rounds} row-rounds"
    )
    if not args.plain:
        print(
            f"accepted {s.accepted_tokens} of {s.drafted_tokens} drafted tokens: acceptance rate "
            f"{s.acceptance_rate:.3f}, mean acceptance length {s.mean_acceptance_length:.2f} "
            f"(= 1 + {s.accepted_tokens}/{s.rounds})"
        )
    cut = f"{s.truncated_tokens} cut (a row hit max_new_tokens or EOS mid-round)" if s.truncated_tokens else "none cut"
    emitted = f"emitted {s.emitted_tokens} = {s.rounds} row-rounds + {s.accepted_tokens} accepted"
    print(f"{emitted}; {cut}; kept {s.generated_tokens}")
    eos_rows = [i for i, stopped in enumerate(s.stopped_at_eos) if stopped]
    if eos_rows:
        print(f"stopped at EOS: row{'s' * (len(eos_rows) != 1)} {', '.join(map(str, eos_rows))}")
    if not args.plain:
        per_pos = " ".join(
            _counted(rate, hits, total)
            for rate, hits, total in zip(s.accepted_per_position, s.accepted_counts, s.position_rounds, strict=False)
        )
        print(f"per-{'depth' if tree is not None else 'position'} acceptance: {per_pos}")
        extra = ", ".join(f"{k} {v}" for k, v in s.drafter.items() if k != "kind")
        print(f"drafter {s.drafter.get('kind')}" + (f": {extra}" if extra else ""))
        if s.adaptive is not None:
            chosen = ", ".join(f"K={k}: {n}" for k, n in s.adaptive["rounds_per_k"].items())
            print(f"adaptive rounds per K: {chosen} (plain steps {s.adaptive['plain_steps']})")
            costs = s.adaptive.get("costs")
            if isinstance(costs, dict):
                where = f" ({costs['path']})" if costs.get("path") else ""
                seconds = f" in {costs['seconds']:.1f} s" if costs.get("source") == "measured" else ""
                print(f"round costs: {costs.get('source')}{seconds}{where}")
    print(timing_line(timing))
    if comparison is not None:
        print(speedup_line(comparison))


def timing_line(timing: dict) -> str:
    """Decode time and tokens/s (prefill and rounds, compilation excluded), then what else took time."""
    repeats = len(timing.get("decode_repeats") or ())
    notes = ([f"median of {repeats}"] if repeats > 1 else []) + (["after a warm-up decode"] if timing["warmup"] else [])
    warm = f" ({', '.join(notes)})" if notes else ""
    measured = timing["cost_measurement_seconds"]
    measuring = f", {measured:.1f} s measuring round costs" if measured else ""
    return (
        f"decode {timing['decode_seconds']:.3f} s{warm}, {timing['tokens_per_second']:.1f} tokens/s on "
        f"{timing['backend']} (compile {timing['compile_seconds']:.1f} s apart{measuring})"
    )


def speedup_line(comparison: dict) -> str:
    """--speedup: the ratio of decode times, both tokens/s, and the greedy check's verdict."""
    plain, spec = comparison["plain"], comparison["speculative"]
    if not comparison["greedy_checked"]:
        check = "sampled, so outputs not compared (both follow the target's distribution)"
    elif comparison["greedy_equal"]:
        check = "greedy output equal to plain decoding token for token"
    else:
        where = comparison["first_difference"]
        check = f"greedy output DIFFERS from plain decoding (first at row {where['row']}, token {where['token']})"
    return (
        f"speedup {comparison['speedup']:.2f}x over plain decoding ({spec['tokens_per_second']:.1f} vs "
        f"{plain['tokens_per_second']:.1f} tokens/s; decode {spec['decode_seconds']:.3f} s vs "
        f"{plain['decode_seconds']:.3f} s, compile excluded); {check}"
    )
