"""Acceptance and speed of a draft with another tokenizer (token-level intersection,
specjax/drafters/cross_vocab.py, and universal assisted generation, drafters/universal.py)
beside plain decoding and, optionally, a same-tokenizer draft, on the stdlib chat prompts
(configs/prompts/stdlib_chat), greedy.

The default pair is SmolLM2-135M-Instruct (BPE, 49,152 tokens) drafted by the embedded
byte-level stdlib-draft (259 tokens): the intersection is SmolLM2's single-byte tokens, so
the draft can only propose those, and feeds every committed SmolLM2 token to itself as its
bytes. A target token the draft cannot spell as one token (most words) is never proposed,
so `output_tokens_in_intersection` bounds TLI's acceptance. UAG has no such bound: the
draft's text (K draft tokens, or --uag-draft-length) is re-encoded by SmolLM2's tokenizer,
so a drafted word can become one SmolLM2 token. Every speculative run is checked against
plain greedy output (`matches_plain`).

    python scripts/cross_vocab.py --out results/cross_vocab/smollm2_stdlib_draft.json
    python scripts/cross_vocab.py --same-tokenizer-draft smollm2-draft --ks 2 4 \\
        --out results/cross_vocab/smollm2_stdlib_draft_vs_smollm2_draft.json
    python scripts/cross_vocab.py --methods uag --uag-draft-length 12 --ks 4   # bytes per round

Plain and speculative runs are timed round-robin (specjax/engine/clock.py), so a noisy
neighbour slows all alike; run it on a quiet machine for numbers worth quoting.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import chat_prompts, log, machine, summary, write_json

import specjax
from specjax.drafters import DraftModel
from specjax.drafters.cross_vocab import CrossVocab
from specjax.drafters.universal import Universal
from specjax.engine.clock import interleaved
from specjax.io.presets import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--draft", default="stdlib-draft", help="a draft with another tokenizer than the target's")
    parser.add_argument("--same-tokenizer-draft", default=None, help="also time this draft model (e.g. smollm2-draft)")
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--methods", nargs="+", choices=["tli", "uag"], default=["tli", "uag"])
    parser.add_argument("--uag-draft-length", type=int, default=0, help="draft tokens per UAG round (0: K)")
    parser.add_argument("--catch-up", type=int, default=16, help="draft tokens per catch-up forward")
    parser.add_argument("--prompts", type=int, default=4, help="chat prompts, one batch")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results/cross_vocab/smollm2_stdlib_draft.json"))
    args = parser.parse_args()

    target, draft = load_model(args.target), load_model(args.draft, seed=1)
    tli = CrossVocab.between(draft, target, catch_up=args.catch_up)
    drafters = {
        "tli": tli,
        "uag": Universal.between(draft, target, catch_up=args.catch_up, draft_length=args.uag_draft_length),
    }
    tables = tli.tables
    log(f"intersection {tables.intersection} of {target.config.vocab_size} target tokens, "
        f"longest target token {tables.max_pieces} draft tokens")  # fmt: skip
    prompts = chat_prompts(target.tokenizer, args.prompts)
    config = specjax.GenerationConfig(max_new_tokens=args.max_new_tokens, ignore_eos=True)

    runs = {"plain": specjax.prepare(target, prompts, config)}
    for k in args.ks:
        spec = specjax.SpeculativeConfig(num_speculative_tokens=k)
        for method in args.methods:
            runs[f"{method} K={k}"] = specjax.prepare(target, prompts, config, draft=drafters[method], speculative=spec)
        if args.same_tokenizer_draft:
            same = DraftModel(load_model(args.same_tokenizer_draft, seed=1))
            runs[f"{args.same_tokenizer_draft} K={k}"] = specjax.prepare(target, prompts, config, draft=same,
                                                                          speculative=spec)  # fmt: skip
    outputs = {}
    for name, run in runs.items():
        log(f"compiling and checking {name}")
        outputs[name] = run.run()
    times = interleaved({name: run.run for name, run in runs.items()}, repeats=args.repeats, warmup=0)

    plain = outputs["plain"]
    tokens = sum(len(row) for row in plain.tokens)
    committed = [t for prompt, row in zip(prompts, plain.tokens, strict=True) for t in [*prompt, *row]]
    proposable = set(tables.draft_to_target[tables.draft_to_target >= 0].tolist())
    rows = []
    for name, out in outputs.items():
        seconds = summary(times[name], 1.0)
        row = {
            "run": name,
            "seconds": seconds,
            "tokens_per_second": tokens / seconds["median"],
            "speedup_vs_plain": summary(times["plain"], 1.0)["median"] / seconds["median"],
            "matches_plain": out.tokens == plain.tokens,
        }
        if name != "plain":
            stats = out.stats
            row |= {"tokens_per_round": stats.mean_acceptance_length, "acceptance_rate": stats.acceptance_rate,
                    "rounds": stats.rounds, "drafter": stats.drafter}  # fmt: skip
        rows.append(row)
        print(f"{name:28s} {row['tokens_per_second']:8.1f} tokens/s  {row['speedup_vs_plain']:5.2f}x plain  "
              f"tokens/round {row.get('tokens_per_round', 1.0):.2f}  matches plain {row['matches_plain']}")  # fmt: skip
    result = {
        "target": args.target,
        "draft": args.draft,
        "same_tokenizer_draft": args.same_tokenizer_draft,
        "methods": args.methods,
        "uag_draft_length": args.uag_draft_length,
        "intersection": tables.intersection,
        "target_vocab": target.config.vocab_size,
        "max_pieces": tables.max_pieces,
        # The share of plain output tokens a draft token can stand for: a bound on TLI's acceptance.
        "output_tokens_in_intersection": sum(t in proposable for row in plain.tokens for t in row) / tokens,
        "draft_tokens_per_target_token": sum(len(tables.pieces_of(t)) for t in committed) / len(committed),
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "catch_up": args.catch_up,
        "machine": machine(),
        "rows": rows,
    }
    write_json(args.out, result)


if __name__ == "__main__":
    main()
