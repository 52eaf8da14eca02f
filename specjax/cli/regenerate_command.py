"""`specjax regenerate`: a dataset's answers written anew by the target (training data for drafters)."""

from __future__ import annotations

import dataclasses

from specjax.cli.generate import HelpFormatter

# Flags that map one to one onto RegenerateConfig fields (dashes for underscores).
_FIELDS = (
    "target", "data", "out", "format", "temperature", "top_k", "top_p", "min_p", "max_new_tokens", "batch_size",
    "seed", "drafter", "num_speculative_tokens", "system_prompt",
)  # fmt: skip


def add_regenerate(subparsers):
    from specjax.training.dataset_records import FORMATS
    from specjax.training.regenerate import RegenerateConfig

    defaults = {f.name: f.default for f in dataclasses.fields(RegenerateConfig)}
    p = subparsers.add_parser(
        "regenerate",
        help="answer a dataset's prompts with the target itself, the data drafters train on (resumes automatically)",
        description="Answer every prompt of a JSONL file (prompt/response, prompt-only, OpenAI messages, ShareGPT "
        "conversations) with the target, replacing every assistant turn of a chat in order, batched with specjax's "
        "own generation (speculative with --drafter; greedy output is the same). Writes one line per usable "
        "record, in source order: {source_line, messages, regenerated: {settings, finished}}, a dataset "
        "`distill` and `train-head` read. Bad records (text documents, bad JSON, a chat the template rejects, a "
        "prompt too long) are reported with their line numbers. Each batch is flushed to disk when done: "
        "rerunning the same command after an interruption (even kill -9) resumes, and the file ends exactly as "
        "an uninterrupted run writes it (sampled answers too: each batch's seed comes from --seed and its first "
        "source line).",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--target", required=True, help="the target: a model name, a local HF directory or a .gguf file")
    p.add_argument("--data", required=True, help="the prompts: a JSONL file (see docs/training.md for the formats)")
    p.add_argument("--out", required=True, help="the JSONL file to write (rerun with the same one to resume)")
    p.add_argument("--format", choices=FORMATS, default=defaults["format"], help="the format of --data")
    p.add_argument(
        "--temperature", type=float, default=defaults["temperature"], help="0 = greedy (the default); > 0 samples"
    )
    p.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass")
    p.add_argument("--min-p", type=float, default=None, help="keep tokens with p >= MIN_P x the top token's")
    p.add_argument("--max-new-tokens", type=int, default=defaults["max_new_tokens"], help="tokens per answer, at most")
    p.add_argument("--batch-size", type=int, default=defaults["batch_size"], help="records per generation call")
    p.add_argument(
        "--seed",
        type=int,
        default=defaults["seed"],
        help="sampling seed (default 0); each batch's seed derives from it and the batch's first line",
    )
    p.add_argument(
        "--drafter",
        default=None,
        help="decode speculatively with this drafter (the spellings of `specjax generate --drafter`: prompt-lookup, "
        "layer-skip[:N], a head, a draft model, a YAML mapping); without it, plain decoding",
    )
    p.add_argument(
        "-k", "--num-speculative-tokens", type=int, default=defaults["num_speculative_tokens"], help="K, with --drafter"
    )
    p.add_argument("--system-prompt", default=None, help="a system turn put first in every chat that has none")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a RegenerateConfig field (e.g. stop_token_ids=[2], dtype=bfloat16)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_regenerate)
    return p


def _regenerate(args) -> int:
    from specjax.configs import apply_overrides, from_dict
    from specjax.training.regenerate import RegenerateConfig, regenerate

    values = {name: getattr(args, name) for name in _FIELDS}
    config = from_dict(RegenerateConfig, apply_overrides(values, args.set))
    summary = regenerate(config, progress=not args.no_progress)
    print(format_summary(summary))
    return 0


def format_summary(s: dict) -> str:
    already = f"{s['already_written']} already there, " if s["already_written"] else ""
    lines = [
        f"{s['answered']} of {s['records']} records answered in {s['out']} ({already}{s['written']} written now: "
        f"{s['finished']} ended at EOS, {s['cut']} cut at max_new_tokens)"
    ]
    bad = sum(s["bad"].values())
    if bad:
        lines.append(f"{bad} bad record{'s' * (bad != 1)}:")
        for reason, count in s["bad"].items():
            lines.append(f"  {reason}: {count} (lines {s['bad_lines'][reason]}; {s['bad_details'][reason]})")
    lines.append(
        f"{s['generated_tokens']} tokens generated in {s['seconds']:.1f} s, {s['tokens_per_second']:.1f} tokens/s"
    )
    return "\n".join(lines)
