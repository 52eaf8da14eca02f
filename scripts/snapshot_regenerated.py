"""Snapshot a running (or finished) `specjax regenerate` output into git-sized form:
`regenerated.jsonl.xz` plus `SNAPSHOT.json` (chats, answers and answer tokens per source and
category, the prompts file's sha256 and how far through it the run is).

    python scripts/snapshot_regenerated.py --regenerated /work/regen/smollm2_v2.jsonl \\
        --prompts configs/prompts/smollm2_train_v2/prompts.jsonl --out data/smollm2_train_v2

Only whole lines are taken (a line being written has no newline yet), so the snapshot is a
prefix of what the uninterrupted run writes: decompressed, it resumes the run
(`xz -dc data/smollm2_train_v2/regenerated.jsonl.xz > OUT.jsonl`, then the datasheet's command).
Commit a snapshot once per session, not every few minutes: each one is a new blob in git.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import statistics
from collections import Counter
from pathlib import Path


def whole_lines(path: Path) -> bytes:
    data = path.read_bytes()
    return data[: data.rfind(b"\n") + 1]


def stats(lines: list[dict], prompts: list[dict], tokenizer) -> dict:
    chats, answers, tokens = Counter(), Counter(), Counter()
    lengths = []
    for record in lines:
        source = prompts[record["source_line"] - 1]
        key = f"{source.get('source', '?')}/{source.get('category', '?')}"
        chats[key] += 1
        for message in record["messages"]:
            if message["role"] == "assistant":
                answers[key] += 1
                if tokenizer is not None:
                    n = len(tokenizer.encode(message["content"]))
                    tokens[key] += n
                    lengths.append(n)
    out = {"chats": sum(chats.values()), "answers": sum(answers.values()), "per_kind": {}}
    for key in sorted(chats):
        out["per_kind"][key] = {"chats": chats[key], "answers": answers[key]}
        if tokenizer is not None:
            out["per_kind"][key]["answer_tokens"] = tokens[key]
    if lengths:
        out["answer_tokens"] = sum(lengths)
        out["answer_tokens_per_answer"] = {
            "mean": round(statistics.mean(lengths), 1),
            "median": statistics.median(lengths),
            "max": max(lengths),
            "at_256": sum(n >= 256 for n in lengths),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regenerated", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="a directory")
    parser.add_argument("--target", default="smollm2-135m-instruct", help="whose tokenizer counts tokens")
    parser.add_argument("--no-tokens", action="store_true", help="skip the token counts (no tokenizer load)")
    args = parser.parse_args()
    data = whole_lines(args.regenerated)
    lines = [json.loads(line) for line in data.splitlines()]
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines()]
    tokenizer = None
    if not args.no_tokens:
        from specjax.io.presets import load_model

        tokenizer = load_model(args.target).tokenizer
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "regenerated.jsonl.xz").write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    snapshot = {
        "prompts": str(args.prompts),
        "prompts_sha256": hashlib.sha256(args.prompts.read_bytes()).hexdigest(),
        "prompt_records": len(prompts),
        "regenerated_sha256": hashlib.sha256(data).hexdigest(),
        "last_source_line": lines[-1]["source_line"] if lines else 0,
        **stats(lines, prompts, tokenizer),
    }
    (args.out / "SNAPSHOT.json").write_text(json.dumps(snapshot, indent=1) + "\n")
    print(json.dumps({k: v for k, v in snapshot.items() if k != "per_kind"}, indent=1))


if __name__ == "__main__":
    main()
