"""Build the chat prompts a drafter for a real instruction-tuned target is trained on
(configs/prompts/smollm2_train/prompts.jsonl), disjoint from the bench's prompts.

The same five tasks over the Python standard library's documentation and code as the bench's
prompt sets (scripts/make_chat_prompts.py: summarize, explain, rewrite, qa, code), over more
modules, plus the short general questions written by hand in general_questions.txt beside the
output. No function the bench's sets use (any category, first `--bench-per-category` of each)
is used here, so held-out E8 numbers are not measured on training prompts. Each function gives
one prompt, of the category with the fewest prompts so far among those it fits (ties by a
hash of its name), so the categories stay balanced.

Records are OpenAI `messages` chats with one user turn (and their category), so
`specjax regenerate` answers them with the target and `distill` / `train-head` read the result:

    python scripts/make_training_prompts.py --count 480
    specjax regenerate --target smollm2-135m-instruct \\
        --data configs/prompts/smollm2_train/prompts.jsonl --out data/smollm2_train.jsonl

Reproducible on Python 3.11 (the stdlib's sources are the material).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from make_chat_prompts import MODULES, TASKS, _picked, stdlib_functions

MORE_MODULES = (
    "ast", "asyncio/tasks", "cmd", "code", "codecs", "collections/__init__", "configparser",
    "contextlib", "dataclasses", "datetime", "dis", "email/utils", "enum", "filecmp", "ftplib",
    "getopt", "gettext", "http/client", "http/cookies", "imaplib", "linecache", "logging/__init__",
    "mailbox", "netrc", "optparse", "pickle", "plistlib", "poplib", "pydoc", "selectors", "smtplib",
    "socket", "subprocess", "symtable", "tabnanny", "trace", "unittest/case", "wave", "xml/dom/minidom",
    "zipimport",
)  # fmt: skip
HERE = Path("configs/prompts/smollm2_train")


def bench_keys(per_category: int, functions: list[tuple]) -> set[tuple[str, str]]:
    """(module, name) of every function the bench's prompt sets use (make_chat_prompts.build)."""
    keys = set()
    for category, (fits, _) in TASKS.items():
        chosen = sorted((f for f in functions if fits(f)), key=lambda f: _picked(f"{f[0]}.{f[1]}", category))
        keys.update((f[0], f[1]) for f in chosen[:per_category])
    return keys


def build(count: int, bench_per_category: int, questions: Path) -> list[dict]:
    used = bench_keys(bench_per_category, stdlib_functions(MODULES))
    functions, seen = [], set(used)
    for f in stdlib_functions(MODULES + MORE_MODULES):
        if (f[0], f[1]) not in seen:  # one prompt per name: methods of one name in several classes once
            seen.add((f[0], f[1]))
            functions.append(f)
    functions.sort(key=lambda f: _picked(f"{f[0]}.{f[1]}", "training"))
    records, counts = [], {}
    for f in functions:
        fitting = [c for c, (fits, _) in TASKS.items() if fits(f)]
        if fitting:
            # the category with the fewest prompts so far (ties by hash): "code" fits most functions
            category = min(fitting, key=lambda c: (counts.get(c, 0), _picked(f"{f[0]}.{f[1]}", c)))
            counts[category] = counts.get(category, 0) + 1
            records.append({"category": category, "messages": [{"role": "user", "content": TASKS[category][1](f)}]})
        if len(records) == count:
            break
    if len(records) < count:
        raise SystemExit(f"only {len(records)} functions fit a task; ask for --count {len(records)} or fewer")
    general = [line.strip() for line in questions.read_text().splitlines() if line.strip()]
    records += [{"category": "general", "messages": [{"role": "user", "content": q}]} for q in general]
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=480, help="stdlib prompts (the general questions come on top)")
    parser.add_argument("--bench-per-category", type=int, default=30, help="the bench sets' size, to stay clear of")
    parser.add_argument("--questions", type=Path, default=HERE / "general_questions.txt")
    parser.add_argument("--out", type=Path, default=HERE / "prompts.jsonl")
    args = parser.parse_args()
    records = build(args.count, args.bench_per_category, args.questions)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in records))
    counts = {c: sum(r["category"] == c for r in records) for c in dict.fromkeys(r["category"] for r in records)}
    print(f"wrote {len(records)} prompts to {args.out}: {counts}")


if __name__ == "__main__":
    main()
