"""Build the chat prompt sets for a real instruction-tuned target (configs/prompts/stdlib_chat/).

Five categories of chat tasks over the Python standard library's own documentation and
code, the kinds of request speculative decoding is judged on (Spec-Bench's summarization,
QA and coding, with rewriting, where the answer copies much of the prompt):
  summarize  a module's or function's docstring, to summarize in two sentences
  explain    a short function's source, to explain
  rewrite    a short function's source, to rewrite more clearly (the answer copies the prompt)
  qa         a docstring as a passage, with a question it answers
  code       a function's name, signature and one-line description, to implement
Functions are taken from the stdlib of the Python running this script, in a fixed order
(sorted modules, a hash of each name decides), so the file is reproducible on Python 3.11.

One JSONL file per category (`<category>.jsonl`, records {"category", "prompt"}), so a
bench config takes the first N of each category as one source per file.

    python scripts/make_chat_prompts.py --per-category 30 --out configs/prompts/stdlib_chat
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sysconfig
from pathlib import Path

MODULES = (
    "argparse", "base64", "bisect", "calendar", "colorsys", "copy", "csv", "difflib", "fnmatch",
    "fractions", "functools", "glob", "gzip", "heapq", "hmac", "html/__init__", "inspect", "ipaddress",
    "json/__init__", "json/decoder", "json/encoder", "keyword", "locale", "mimetypes", "ntpath", "numbers",
    "operator", "os", "pathlib", "platform", "posixpath", "pprint", "queue", "quopri", "random", "reprlib",
    "sched", "secrets", "shlex", "shutil", "statistics", "string", "struct", "tarfile", "tempfile",
    "textwrap", "threading", "timeit", "tokenize", "traceback", "types", "typing", "urllib/parse",
    "uuid", "warnings", "weakref", "zipfile",
)  # fmt: skip


def _functions(path: Path, lib: Path):
    """(module, name, signature, docstring, source) of its functions and methods."""
    text = path.read_text()
    tree = ast.parse(text)
    module = str(path.relative_to(lib).with_suffix("")).replace("/__init__", "").replace("/", ".")
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            source = ast.get_source_segment(text, node)
            if doc and source:
                yield module, node.name, ast.unparse(node.args), doc, source


def _picked(key: str, salt: str) -> int:
    return int(hashlib.sha256(f"{salt}:{key}".encode()).hexdigest()[:8], 16)


def stdlib_functions(modules=MODULES) -> list[tuple]:
    """(module, name, signature, docstring, source) of `modules`' public documented functions."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    functions = []
    for name in modules:
        path = lib / f"{name}.py"
        if path.is_file():
            functions += list(_functions(path, lib))
    return functions


def _short_source(f) -> bool:
    return 200 <= len(f[4]) <= 900


# category -> (does a function fit it, its prompt); the order is the files' and the picks' salt.
TASKS = {
    "summarize": (
        lambda f: 300 <= len(f[3]) <= 1200,
        lambda f: f"Summarize in two sentences what this documentation of `{f[1]}` says:\n\n{f[3]}",
    ),
    "explain": (
        _short_source,
        lambda f: f"Explain what this Python function does:\n\n```python\n{f[4]}\n```",
    ),
    "rewrite": (
        _short_source,
        lambda f: (
            f"Rewrite this Python function so it is shorter and clearer, with the same behaviour:\n\n"
            f"```python\n{f[4]}\n```"
        ),
    ),
    "qa": (
        lambda f: 200 <= len(f[3]) <= 900 and ("return" in f[3].lower()),
        lambda f: (
            f"Read the passage and answer the question.\n\nPassage (documentation of `{f[1]}` in "
            f"`{f[0]}`):\n{f[3]}\n\nQuestion: what does `{f[1]}` return?"
        ),
    ),
    "code": (
        lambda f: 20 <= len(f[3].splitlines()[0]) <= 120,
        lambda f: f"Write a Python function `{f[1]}({f[2]})` that does this: {f[3].splitlines()[0]}",
    ),
}


def build(per_category: int) -> list[dict]:
    """The first `per_category` functions of each category, ordered by a hash of the
    function's name salted with the category."""
    functions = stdlib_functions()
    records = []
    for category, (fits, make) in TASKS.items():
        chosen = sorted((f for f in functions if fits(f)), key=lambda f: _picked(f"{f[0]}.{f[1]}", category))
        if len(chosen) < per_category:
            raise SystemExit(f"only {len(chosen)} functions fit {category!r}")
        records.extend({"category": category, "prompt": make(f)} for f in chosen[:per_category])
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-category", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("configs/prompts/stdlib_chat"), help="a directory")
    args = parser.parse_args()
    records = build(args.per_category)
    args.out.mkdir(parents=True, exist_ok=True)
    for category in dict.fromkeys(r["category"] for r in records):
        lines = [json.dumps(r) + "\n" for r in records if r["category"] == category]
        (args.out / f"{category}.jsonl").write_text("".join(lines))
    print(f"wrote {len(records)} prompts to {args.out}/")


if __name__ == "__main__":
    main()
