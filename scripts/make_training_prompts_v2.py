"""Build the second SmolLM2 training prompt set (configs/prompts/smollm2_train_v2/prompts.jsonl):
about ten times the answers of the first, from material on this machine, reproducibly.

Sources (each record says its `source` and `category`):
  stdlib    the five bench tasks (summarize, explain, rewrite, qa, code) over every documented
            public function of the Python 3.11 standard library, up to two tasks per function,
            none the bench's prompt sets use (scripts/make_chat_prompts.py);
  packages  the same tasks over the docstrings of numpy, optax and flax (versions in the datasheet);
  docs      this project's own guides, by section: summarize, explain to a newcomer, answer a question;
  math      arithmetic word problems, numbers drawn from a seeded generator;
  writing   short writing requests (emails, stories, poems, ...) over a fixed list of topics;
  general   the hand-written questions of the first set.
A fifth of the chats (picked by hash) get a follow-up user turn after the first answer, so the
data holds multi-turn chats: `specjax regenerate` answers both turns in order.

The records are ordered by a hash of their text, so any prefix the regeneration has reached
mixes every source. The held-out split is made later by prompt hash (training/datasets.py).

    python scripts/make_training_prompts_v2.py
    specjax regenerate --target smollm2-135m-instruct --drafter smollm2-eagle3 -k 4 \\
        --data configs/prompts/smollm2_train_v2/prompts.jsonl --out data/smollm2_train_v2.jsonl
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import re
import sys
import sysconfig
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from make_chat_prompts import MODULES, TASKS, _functions, _picked
from make_training_prompts import bench_keys

HERE = Path("configs/prompts/smollm2_train_v2")
_SKIP = {"test", "idlelib", "lib2to3", "tkinter", "ensurepip", "turtledemo", "site-packages", "pydoc_data"}
PACKAGES = ("numpy", "optax", "flax")

FOLLOW_UPS = {
    "summarize": ["Now say it in one sentence.", "Which part of it matters most in practice, and why?"],
    "explain": ["Can you give a short example of calling it?", "What could go wrong when using it?"],
    "rewrite": ["Now add type hints to your version.", "Explain what you changed and why."],
    "qa": ["What would it return for an empty input?", "Quote the sentence of the passage that says so."],
    "code": ["Add a docstring and two doctest examples.", "How would you test this function?"],
    "docs": ["Give a concrete example of that.", "What should a beginner watch out for here?"],
    "math": ["Check your answer another way.", "Now solve it if all the numbers were doubled."],
    "writing": ["Make it shorter and more formal.", "Now write a title for it."],
    "general": ["Can you give an example?", "Explain that to a ten-year-old."],
}

TOPICS = (
    "a rainy morning", "moving to a new city", "learning to play the piano", "a lost umbrella",
    "the first day at a new job", "a garden in spring", "an old lighthouse", "a power cut", "a train journey",
    "a friendly robot", "a late library book", "a birthday surprise", "a camping trip", "a broken bicycle",
    "the ocean at night", "a city market", "a school science fair", "a winter storm", "a new neighbour",
    "a recipe that went wrong", "a museum visit", "learning a second language", "a mountain hike",
    "a small bakery", "a chess tournament", "a long-distance friendship", "a forgotten password",
    "a volunteer day", "the last day of summer", "a noisy apartment", "a cat that will not come inside",
    "a job interview", "a school reunion", "a bus that never came", "a team project", "a quiet village",
    "a football match", "a solar eclipse", "planting a tree", "a kitchen renovation", "an unexpected letter",
    "a marathon", "a music festival", "a coffee shop", "a delayed flight", "saving money", "a new phone",
    "a snow day", "a dog's first walk", "a community garden", "a family recipe", "a science museum",
    "a bookshop closing down", "working from home", "an art class", "a road trip", "the first snowfall",
    "a missing key", "a farmers' market", "a wedding speech", "a history lesson", "a thunderstorm",
)  # fmt: skip
FORMS = (
    ("email", "Write a short, polite email to a colleague about {t}."),
    ("story", "Write a short story (about 150 words) about {t}."),
    ("poem", "Write a short poem about {t}."),
    ("description", "Describe {t} in one vivid paragraph."),
    ("list", "List five ideas for a blog post about {t}."),
    ("dialogue", "Write a short dialogue between two friends about {t}."),
    ("advice", "Give three practical tips to someone dealing with {t}."),
    ("review", "Write a brief review of a film about {t}."),
)


def _key(text: str) -> int:
    return _picked(text, "v2")


def _chat(source: str, category: str, prompt: str) -> dict:
    return {"source": source, "category": category, "messages": [{"role": "user", "content": prompt}]}


def _task_records(source: str, functions: list[tuple], per_function: int, skip: set) -> list[dict]:
    """Up to `per_function` of the bench's five tasks per function, each time the fitting
    task with the fewest prompts so far (ties by hash), so the categories stay balanced."""
    records, counts, seen = [], Counter(), set(skip)
    for f in sorted(functions, key=lambda f: _picked(f"{f[0]}.{f[1]}", "training")):
        if (f[0], f[1]) in seen:
            continue
        seen.add((f[0], f[1]))
        fitting = [c for c, (fits, _) in TASKS.items() if fits(f)]
        fitting.sort(key=lambda c: (counts[c], _picked(f"{f[0]}.{f[1]}", c)))
        for category in fitting[:per_function]:
            counts[category] += 1
            records.append(_chat(source, category, TASKS[category][1](f)))
    return records


def stdlib_records(bench_per_category: int) -> list[dict]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    functions = []
    for path in sorted(lib.rglob("*.py")):
        parts = path.relative_to(lib).parts
        if parts[0] in _SKIP or any(p.startswith("test") for p in parts):
            continue
        try:
            functions += list(_functions(path, lib))
        except (SyntaxError, UnicodeDecodeError):
            continue
    from make_chat_prompts import stdlib_functions

    used = bench_keys(bench_per_category, stdlib_functions(MODULES))
    return _task_records("stdlib", functions, 2, used)


def package_records() -> tuple[list[dict], dict]:
    functions, versions = [], {}
    for name in PACKAGES:
        module = importlib.import_module(name)
        versions[name] = getattr(module, "__version__", "unknown")
        root = Path(module.__file__).parent
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).parts
            if any(p.startswith(("test", "_")) and p != "__init__.py" for p in parts):
                continue
            try:
                functions += [(f"{name}.{m}", *rest) for m, *rest in _functions(path, root)]
            except (SyntaxError, UnicodeDecodeError):
                continue
    return _task_records("packages", functions, 1, set()), versions


def docs_records(paths: list[Path]) -> list[dict]:
    records = []
    for path in paths:
        text = path.read_text()
        for section in re.split(r"\n(?=#{1,3} )", text):
            title, _, body = section.partition("\n")
            body = body.strip()
            if not title.startswith("#") or not 300 <= len(body) <= 2500:
                continue
            title = title.lstrip("# ").strip()
            kind = ("summarize", "explain", "qa")[_key(f"{path.name}:{title}") % 3]
            prompt = {
                "summarize": f"Summarize this section of a software guide in three sentences:\n\n{body}",
                "explain": f"Explain this section of a software guide to someone new to the project:\n\n{body}",
                "qa": f"Read the passage and answer the question.\n\nPassage:\n{body}\n\nQuestion: {title}?",
            }[kind]
            records.append(_chat("docs", "docs", prompt))
    return records


def math_records(count: int, seed: int = 2026) -> list[dict]:
    rng = random.Random(seed)
    makers = [
        lambda a, b, c: f"A shop sells pens at {a} cents each. How much do {b} pens cost, in dollars and cents?",
        lambda a, b, c: (
            f"A train travels at {a} km/h for {b} hours and then at {c} km/h for 2 hours. How far does it go?"
        ),
        lambda a, b, c: f"What is {a * 7} divided by 7, plus {b} times {c}? Show your steps.",
        lambda a, b, c: f"A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
        lambda a, b, c: f"Anna has {a} apples. She gives {b} to each of {c} friends. How many are left, if any?",
        lambda a, b, c: f"A price of ${a * 10} rises by {b}% and then falls by {c}%. What is the final price?",
        lambda a, b, c: f"Solve for x: {b}x + {a} = {a + b * c}.",
        lambda a, b, c: f"What is the average of {a}, {b}, {c} and {a + b}?",
        lambda a, b, c: f"A tank holds {a * 10} litres and fills at {b} litres a minute. How long until it is full?",
        lambda a, b, c: f"Is {a * b + c} a prime number? Explain how you checked.",
    ]
    out = []
    for i in range(count):
        a, b, c = rng.randint(12, 95), rng.randint(2, 12), rng.randint(2, 9)
        out.append(_chat("math", "math", makers[i % len(makers)](a, b, c)))
    return out


def writing_records(count: int) -> list[dict]:
    pairs = sorted(((t, f) for t in TOPICS for f in FORMS), key=lambda p: _key(p[0] + p[1][0]))
    return [_chat("writing", "writing", form.format(t=topic)) for topic, (_, form) in pairs[:count]]


def with_follow_ups(records: list[dict], share: int = 5) -> list[dict]:
    for record in records:
        text = record["messages"][0]["content"]
        if _key("follow:" + text) % share == 0:
            options = FOLLOW_UPS[record["category"]]
            record["messages"] += [
                {"role": "assistant", "content": ""},  # regenerate writes the first answer here
                {"role": "user", "content": options[_key("which:" + text) % len(options)]},
            ]
    return records


def build(args) -> tuple[list[dict], dict]:
    packages, versions = package_records()
    general = [q.strip() for q in args.questions.read_text().splitlines() if q.strip()]
    docs = [*sorted(Path("docs").glob("*.md")), Path("README.md")]
    records = (
        stdlib_records(args.bench_per_category)
        + packages[: args.package_count]
        + docs_records(docs)
        + math_records(args.math_count)
        + writing_records(args.writing_count)
        + [_chat("general", "general", q) for q in general]
    )
    records = with_follow_ups(records)
    records.sort(key=lambda r: _key(r["messages"][0]["content"]))
    return records, versions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench-per-category", type=int, default=30, help="the bench sets' size, to stay clear of")
    parser.add_argument("--package-count", type=int, default=600)
    parser.add_argument("--math-count", type=int, default=500)
    parser.add_argument("--writing-count", type=int, default=480)
    parser.add_argument("--questions", type=Path, default=Path("configs/prompts/smollm2_train/general_questions.txt"))
    parser.add_argument("--out", type=Path, default=HERE / "prompts.jsonl")
    args = parser.parse_args()
    records, versions = build(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in records))
    by = Counter((r["source"], r["category"]) for r in records)
    turns = sum(sum(m["role"] == "user" for m in r["messages"]) for r in records)
    print(json.dumps({"records": len(records), "user_turns": turns, "packages": versions,
                      "counts": {f"{s}/{c}": n for (s, c), n in sorted(by.items())}}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
