"""The protocol's qualitative set (scripts/make_protocol_prompts.py): 11 categories of chat
requests from the bench's held-out chat sets, seeded generators, hand-written templates
(_protocol_texts.py) and the Python language reference, each record {id, category, difficulty,
source, turns}; multi-turn follow-ups; and the check that no turn equals a training prompt's."""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _protocol_texts as T
from _repo_import import ROOT

CHAT = ROOT / "configs/prompts/stdlib_chat"
TRAINING = ("configs/prompts/smollm2_train_v2/prompts.jsonl", "configs/prompts/smollm2_train/prompts.jsonl")
SEED = 4412
PER_CATEGORY = 24
PER_BUCKET = 12
CATEGORIES = (
    "coding", "math", "stem", "reasoning", "qa", "rag", "humanities", "writing", "roleplay", "summarization",
    "multilingual",
)  # fmt: skip
# Input tokens of the chat-templated prompt. SmolLM2-135M-Instruct has 8,192 positions: the 8k
# bucket leaves 256 of them for the answer and the verify headroom (max_new_tokens + K + 1 <= 256).


def text_key(text: str) -> int:
    return int(hashlib.sha256(f"protocol:{text}".encode()).hexdigest()[:8], 16)


def _by_hash(items, salt: str = "") -> list:
    return sorted(items, key=lambda x: text_key(salt + json.dumps(x, ensure_ascii=False)))


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
        follow = T.ROLEPLAY_FOLLOW_UPS[text_key(first) % len(T.ROLEPLAY_FOLLOW_UPS)]
        record["turns"].append(follow)  # every roleplay is a conversation: two or three turns
        if text_key("third:" + first) % 3 == 0:
            record["turns"].append(T.ROLEPLAY_LAST)
        out.append(record)
    return out


def multilingual_records() -> list[dict]:
    out = []
    for language, templates in T.MULTILINGUAL.items():
        items = [(level, template.format(x=x)) for level, template, fillers in templates for x in fillers]
        for level, text in _by_hash(items, language)[:6]:
            record = _record("multilingual", level, f"template:{language}", text)
            if text_key("turn:" + text) % 3 == 0:
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
        if record["category"] in T.FOLLOW_UPS and len(record["turns"]) == 1 and text_key("turn:" + text) % 4 == 0:
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
