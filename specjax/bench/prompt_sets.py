"""The bench's prompts: held-out corpus prompts (the default), or your own from files.

A config's `prompts:` is one source or a list of them (`Prompts` below); every prompt gets
a category, and every metric is reported per category as well as pooled ("all").

Files (`file: PATH`, relative to the working directory):
  .jsonl  one JSON object per line, with `prompt` (a string), Spec-Bench's `turns` (a
          list of strings: the first turn is the prompt, since later turns need the
          model's own replies) or OpenAI `messages` (what `specjax regenerate` writes, and
          `tools` beside them if any), and an optional `category`. Blank lines are skipped.
          A `messages` chat ending in an assistant turn is the prompt up to (not including)
          that turn, otherwise the whole chat; it must hold a user turn. Being a chat, it is
          always rendered by the tokenizer's chat template (a `Chat`, not a string).
  other   plain text: prompts are separated by one or more blank lines, so a prompt may
          span several lines (code), and its line breaks are kept. One category per file.
  A prompt without a category of its own takes the source's `category`, else the file's
  stem (`specbench.jsonl` -> "specbench").
Corpus sources take their domain ("code", "prose") as category.

Lengths: corpus prompts are cut to the shortest of them, as before, so they share one
compiled program per spec. File prompts are kept whole (ragged); the engine pads each
request to a power-of-two bucket, and measure.py batches prompts of similar length, so
the number of compiled programs grows with the spread of lengths, not with the count.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from specjax.configs import from_dict
from specjax.training.data import held_out_prompts
from specjax.training.dataset_records import BadRecord, chat_messages, chat_tools
from specjax.training.datasets import render_chat

CORPUS_COUNT = 8  # held-out prompts per corpus source when `count` is not given


@dataclasses.dataclass(frozen=True)
class Prompts:
    """One prompt source: held-out prompts from the stdlib corpus (the default; see
    specjax.training.data.held_out_prompts), or, when `file` is set, a JSONL or text file
    (format: the module docstring). `prompts:` may also be a list of sources."""

    domain: str = "code"  # corpus: "code" or "prose"
    count: int | None = None  # corpus: how many (default 8); file: the first `count` (default all)
    prompt_bytes: int = 96  # corpus: bytes per prompt
    split: str = "test"  # corpus: held-out split
    file: str | None = None  # a .jsonl or text file (relative to the working directory)
    category: str | None = None  # default category (corpus: the domain; file: per line, else the file stem)
    chat_template: bool = False  # wrap each prompt as a user turn with the tokenizer's chat template

    def __post_init__(self):
        if self.count is not None and self.count < 1:
            raise ValueError(f"prompts.count must be >= 1, got {self.count}")
        if self.category == "all":
            raise ValueError('prompts.category "all" is reserved for the pooled rows')


def parse_prompts(value) -> Prompts | list[Prompts]:
    """A source or a list of sources; anything else fails with the error of the shape it resembles."""
    if isinstance(value, Prompts) or (isinstance(value, list) and value and all(isinstance(p, Prompts) for p in value)):
        return value
    if isinstance(value, dict):
        return from_dict(Prompts, value, "prompts")
    if isinstance(value, list) and value:
        return [
            from_dict(Prompts, v, f"prompts[{i}]") if isinstance(v, dict) else parse_prompts(v)
            for i, v in enumerate(value)
        ]
    raise ValueError(f"prompts: expected a mapping (one source) or a non-empty list of them, got {value!r}")


def describe_sources(sources: list[Prompts]) -> str:
    """One line naming the prompt sources (the tuning and shift prompts of E9 and E11)."""
    parts = []
    for s in sources:
        if s.file is not None:
            parts.append(f"{s.file} (first {s.count})" if s.count else s.file)
        else:
            parts.append(f"{s.count or CORPUS_COUNT} {s.domain} prompts of {s.prompt_bytes} bytes, {s.split} split")
    return "; ".join(parts)


@dataclasses.dataclass(frozen=True)
class PromptSet:
    tokens: list[list[int]]  # token ids per prompt (ragged when prompts come from files)
    categories: list[str]  # one per prompt

    @property
    def names(self) -> list[str]:
        """The categories in order of first appearance."""
        return list(dict.fromkeys(self.categories))


@dataclasses.dataclass(frozen=True)
class Chat:
    """A prompt that is a conversation awaiting the assistant's reply (a `messages` record):
    encoded by the tokenizer's chat template, with its tool definitions if it has any."""

    messages: tuple[dict, ...]  # {role: system | user | assistant | tool, content, ...}; ends before the reply
    tools: tuple[dict, ...] | None = None

    def __str__(self) -> str:  # what a listing shows of it: the question it ends with
        return next(m["content"] for m in reversed(self.messages) if m["role"] == "user")


Prompt = str | Chat  # one prompt as read from a file: text, or a chat (encode() renders it)


def _jsonl_chat(record: dict, where: str) -> Chat:
    """The prompt of a `messages` record: the chat before its final assistant turn (module docstring)."""
    try:
        messages, tools = chat_messages(record, "messages", answers_optional=True), chat_tools(record, "messages")
    except BadRecord as bad:
        raise ValueError(
            f"{where}: not a valid 'messages' chat ({bad.reason.replace('_', ' ')}: {bad.detail})"
        ) from None
    if messages[-1]["role"] == "assistant":  # the answer (regenerate's output ends with one): not prompt
        messages = messages[:-1]
    if not any(m["role"] == "user" for m in messages):
        roles = [m["role"] for m in messages]
        raise ValueError(
            f"{where}: the chat's prompt (before its final assistant turn) has no user turn: roles {roles}"
        )
    return Chat(tuple(messages), tools)


def _jsonl_text(record, where: str) -> Prompt:
    if not isinstance(record, dict):
        raise ValueError(
            f"{where}: expected a JSON object with a 'prompt', 'turns' or 'messages' field, got {type(record).__name__}"
        )
    if "messages" in record:
        return _jsonl_chat(record, where)
    if "prompt" in record:
        text = record["prompt"]
    elif "turns" in record:
        turns = record["turns"]
        if not isinstance(turns, list) or not turns:
            raise ValueError(f"{where}: 'turns' must be a non-empty list of strings, got {turns!r}")
        text = turns[0]
    else:
        raise ValueError(f"{where}: the object has no 'prompt', 'turns' or 'messages' field (keys: {sorted(record)})")
    if not isinstance(text, str):
        raise ValueError(f"{where}: the prompt must be a string, got {text!r}")
    return text


def read_jsonl(path: Path, default_category: str, text: str | None = None) -> list[tuple[str, Prompt]]:
    """(category, text) per non-blank line; `text`: the file's content when already read (stdin)."""
    out = []
    content = path.read_text(encoding="utf-8") if text is None else text
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
        category = record.get("category", default_category) if isinstance(record, dict) else default_category
        if not isinstance(category, str) or not category or category == "all":
            raise ValueError(f"{where}: 'category' must be a non-empty string other than 'all', got {category!r}")
        out.append((category, _jsonl_text(record, where)))
    return out


def read_text(path: Path, category: str, text: str | None = None) -> list[tuple[str, str]]:
    """(category, text) per blank-line-separated block; a block's own line breaks are kept."""
    blocks, lines = [], []
    content = path.read_text(encoding="utf-8") if text is None else text
    for line in [*content.splitlines(), ""]:
        if line.strip():
            lines.append(line)
        elif lines:
            blocks.append("\n".join(lines))
            lines = []
    return [(category, block) for block in blocks]


def read_source(source: Prompts) -> list[tuple[str, Prompt]]:
    """(category, text) of one source, in order."""
    if source.file is None:
        count = source.count or CORPUS_COUNT
        texts = held_out_prompts(source.domain, count, source.prompt_bytes, source.split)
        return [(source.category or source.domain, text) for text in texts]
    prompts = read_prompt_file(source.file, source.category, "prompts.file")
    return prompts[: source.count] if source.count else prompts


def read_prompt_file(file: str, category: str | None = None, what: str = "prompt file") -> list[tuple[str, Prompt]]:
    """(category, prompt) of every prompt in a .jsonl or text file (see the module docstring): a
    string, or a `Chat` for a `messages` record, which `encode` renders with the chat template;
    "-" reads standard input (JSONL when its first non-blank character is "{", else text)."""
    if file == "-":
        import sys

        content = sys.stdin.read()
        path, is_jsonl = Path("stdin"), content.lstrip().startswith("{")
    else:
        path, content = Path(file), None
        if not path.is_file():
            raise FileNotFoundError(f"{what}: {path} does not exist (paths are relative to the working directory)")
        if path.suffix == ".json":
            raise ValueError(f"{what}: {path}: use JSONL (.jsonl, one object per line) or a plain text file")
        is_jsonl = path.suffix == ".jsonl"
    category = category or path.stem
    prompts = read_jsonl(path, category, content) if is_jsonl else read_text(path, category, content)
    if not prompts:
        raise ValueError(f"{what}: {path} holds no prompts")
    empty = [i for i, (_, text) in enumerate(prompts) if isinstance(text, str) and not text.strip()]
    if empty:
        raise ValueError(f"{what}: {path}: prompt {empty[0]} is empty")
    return prompts


def encode(tokenizer, text: Prompt, chat_template: bool) -> list[int]:
    """Token ids of one prompt; with `chat_template`, as one user turn awaiting the reply. A
    `Chat` is always rendered by the template (its turns mean nothing as raw text)."""
    if not chat_template and not isinstance(text, Chat):
        return tokenizer.encode(text)
    if getattr(tokenizer, "apply_chat_template", None) is None or getattr(tokenizer, "chat_template", None) is None:
        asked = (
            "a prompt is a chat (a 'messages' record)"
            if isinstance(text, Chat)
            else "a chat template was asked for (--chat, or prompts.chat_template in a bench config)"
        )
        raise ValueError(
            f"{asked}, but the target's tokenizer ({type(tokenizer).__name__}) has no chat template: specjax's "
            "byte-level models are trained on raw text. Use plain prompts, or a model whose tokenizer defines one."
        )
    chat = text if isinstance(text, Chat) else Chat(({"role": "user", "content": text},))
    templated = render_chat(tokenizer, chat.messages, chat.tools, add_generation_prompt=True)
    return tokenizer.encode(templated, add_special_tokens=False)  # the template holds its own special tokens


def load_prompts(sources: list[Prompts], tokenizer) -> PromptSet:
    """Read and encode every source (see the module docstring for formats and lengths)."""
    tokens, categories, corpus = [], [], []
    for source in sources:
        for category, text in read_source(source):
            if source.file is None:
                corpus.append(len(tokens))
            tokens.append(encode(tokenizer, text, source.chat_template))
            categories.append(category)
    if corpus:  # one length for corpus prompts: one compiled program per spec
        shortest = min(len(tokens[i]) for i in corpus)
        for i in corpus:
            tokens[i] = tokens[i][:shortest]
    return PromptSet(tokens, categories)
