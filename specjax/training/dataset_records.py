"""The records of a user dataset file, before tokenization (specjax/training/datasets.py).

Formats, detected per file from its first JSON object (or set by `DatasetConfig.format`):
  text             JSONL {"text": ...}: a document; every token is trained on.
  prompt_response  JSONL {"prompt": ..., "response": ..., "system": ... (optional)}: a user
                   turn and the assistant's reply.
  messages         JSONL {"messages": [{"role": "system" | "user" | "assistant" | "tool",
                   "content": ...}], "tools": [...] (optional)} (OpenAI style; content a string,
                   or a list of {"type": "text", "text"} parts, joined; a part of another type,
                   an image, makes the record invalid_message). Tool use as OpenAI writes it:
                   an assistant turn may carry "tool_calls" (a non-empty list; its content may
                   then be null or absent), a tool turn "tool_call_id" and "name"; these and
                   the record's "tools" go to the chat template as they are, which renders them
                   its own way (or rejects them: template_error). Tool-call turns are assistant
                   turns and are trained on; tool turns, like user turns, are not.
  conversations    JSONL {"conversations": [{"from": "system" | "human" | "gpt", "value": ...}]}
                   (ShareGPT; "user" and "assistant" are accepted for "human" and "gpt",
                   "tool" and "observation" read as a tool turn).
  plain            a text file (.txt, .md, .text; or a file not named .jsonl, .ndjson or .json
                   whose first line is not JSON):
                   paragraphs (split at blank lines) grouped into documents of at least
                   `plain_chunk_chars` characters; every token is trained on.
Blank JSONL lines are skipped; every other line is a record, usable or a `BadRecord` with a
reason from BAD_REASONS.

`answers_optional` reads prompts to answer (specjax/training/regenerate.py): a prompt_response
record may leave out "response" ({"prompt": ...}), a chat may have no assistant turn, and
assistant turns may be blank, since their text is replaced.
"""

from __future__ import annotations

import dataclasses
import json
import lzma
from collections.abc import Iterator
from pathlib import Path

FORMATS = ("auto", "text", "prompt_response", "messages", "conversations", "plain")
CHAT_FORMATS = ("prompt_response", "messages", "conversations")
BAD_REASONS = (
    "invalid_json",  # the line is not UTF-8 JSON
    "not_an_object",
    "missing_field",  # the format's field is absent or has the wrong type
    "empty_text",  # a text, or an assistant turn, with no non-whitespace character
    "invalid_message",  # a turn that is not {role, content: str} / {from, value: str}
    "unknown_role",
    "no_assistant_turn",
    "assistant_first",  # the chat opens with an assistant turn: no prompt to render before it
    "template_error",  # the chat template rejected the chat (the report keeps its message)
    "template_not_prefix_stable",  # a rendered prefix does not tokenize to a prefix of the chat
    "template_drops_tools",  # the template leaves a tool call or a tool definition out
    "empty_after_mask",  # nothing left to train on
)
_ROLES = {
    "messages": {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool"},
    "conversations": {
        "system": "system",
        "human": "user",
        "user": "user",
        "gpt": "assistant",
        "assistant": "assistant",
        "tool": "tool",
        "observation": "tool",  # LLaMA-Factory's ShareGPT name for a tool's output
    },
}
# OpenAI's tool-use keys of a turn, passed to the chat template as they are.
_TOOL_KEYS = {"assistant": ("tool_calls",), "tool": ("tool_call_id", "name")}
_TURN_KEYS = {"messages": ("role", "content"), "conversations": ("from", "value")}
_PLAIN_SUFFIXES = (".txt", ".md", ".text")


@dataclasses.dataclass(frozen=True)
class Record:
    line: int  # 1-based; plain text: the line of the document's first paragraph
    split_key: str  # what split_of hashes: the record's content, less its assistant turns
    text: str | None = None  # a document (text, plain)
    messages: tuple[dict, ...] | None = None  # a chat: {role: system | user | assistant | tool, content, ...}
    tools: tuple[dict, ...] | None = None  # a chat's tool definitions (OpenAI "tools"), for the template


class BadRecord(Exception):
    def __init__(self, reason: str, detail: str = ""):
        assert reason in BAD_REASONS, reason
        super().__init__(reason, detail)
        self.reason, self.detail = reason, detail


def open_data(path: Path):
    """The file's bytes, decompressed when it ends in `.xz` (the committed training snapshots,
    data/*/regenerated.jsonl.xz, are read in place)."""
    return lzma.open(path, "rb") if path.suffix.lower() == ".xz" else path.open("rb")


def _inner_suffix(path: Path) -> str:
    """The suffix that says the format: `x.jsonl.xz` -> `.jsonl`."""
    return (Path(path.stem) if path.suffix.lower() == ".xz" else path).suffix.lower()


def detect_format(path: str | Path) -> str:
    """The format of a file: plain by suffix, else from the keys of its first JSON object."""
    path = Path(path)
    suffix = _inner_suffix(path)
    jsonl = suffix in (".jsonl", ".ndjson", ".json")  # .json: never read a JSON array as text
    if suffix in _PLAIN_SUFFIXES:
        return "plain"
    with open_data(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                if not jsonl:
                    return "plain"  # a text file by another name
                continue
            if isinstance(obj, dict):
                for key in ("messages", "conversations", "text"):
                    if key in obj:
                        return key
                if "prompt" in obj or "response" in obj:
                    return "prompt_response"
                raise ValueError(f"{path}:{number}: cannot tell the format from the keys {sorted(obj)}; set format")
    raise ValueError(f"{path}: no line holds a JSON object, so the format cannot be detected; set format")


def chat_messages(obj: dict, fmt: str, answers_optional: bool = False) -> list[dict]:
    """The chat of a JSONL record as [{role, content}], roles system / user / assistant."""
    if fmt == "prompt_response":
        unanswered = answers_optional and obj.get("response") is None
        missing = [k for k in ("prompt", "response")[: 1 if unanswered else 2] if not isinstance(obj.get(k), str)]
        if missing or not isinstance(obj.get("system", ""), str):
            raise BadRecord("missing_field", f"no string {missing or ['system']}")
        system = [{"role": "system", "content": obj["system"]}] if "system" in obj else []
        answer = [] if unanswered else [{"role": "assistant", "content": obj["response"]}]
        return [*system, {"role": "user", "content": obj["prompt"]}, *answer]
    role_key, content_key = _TURN_KEYS[fmt]
    turns = obj.get(fmt)
    if not isinstance(turns, list) or not turns:
        raise BadRecord("missing_field", f"no non-empty list {fmt!r}")
    messages = []
    for turn in turns:
        read = _openai_turn(turn) if fmt == "messages" and isinstance(turn, dict) else turn
        if not isinstance(read, dict) or role_key not in read or not isinstance(read.get(content_key), str):
            raise BadRecord("invalid_message", json.dumps(turn, ensure_ascii=False)[:80])
        turn = read
        if turn[role_key] not in _ROLES[fmt]:
            raise BadRecord("unknown_role", f"{role_key} {turn[role_key]!r}")
        role = _ROLES[fmt][turn[role_key]]
        extra = {k: turn[k] for k in _TOOL_KEYS.get(role, ()) if k in turn} if fmt == "messages" else {}
        messages.append({"role": role, "content": turn[content_key], **extra})
    return messages


def _openai_turn(turn: dict) -> dict | None:
    """An OpenAI turn with its content as one string: text parts joined; "" for an assistant
    turn that only calls tools (content null or absent); None (an invalid message) for a part
    that is not text or malformed tool-use keys."""
    if isinstance(turn.get("content"), list):
        turn = {**turn, "content": _text_parts(turn["content"])}
    calls = turn.get("tool_calls")
    if calls is not None:
        valid = turn.get("role") == "assistant" and isinstance(calls, list) and calls
        if not valid or not all(isinstance(c, dict) for c in calls):
            return None
        turn = {**turn, "tool_calls": [_call_arguments(c) for c in calls]}
        if turn.get("content") is None:  # null or absent: the turn only calls tools
            turn = {**turn, "content": ""}
    if any(k in turn and not isinstance(turn[k], str) for k in _TOOL_KEYS["tool"]):
        return None
    return turn


def _call_arguments(call: dict) -> dict:
    """A tool call with OpenAI's JSON-string "arguments" parsed to the object chat templates
    expect (as vLLM does before rendering); arguments that are not a JSON object stay as given."""
    function = call.get("function")
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(arguments, str):
        return call
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": parsed}} if isinstance(parsed, dict) else call


def chat_tools(obj: dict, fmt: str) -> tuple[dict, ...] | None:
    """The record's tool definitions (OpenAI "tools": a list of objects), if it has any."""
    tools = obj.get("tools") if fmt == "messages" else None
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise BadRecord("missing_field", "'tools' is not a list of objects")
    return tuple(tools) or None


def _text_parts(parts: list) -> str | None:
    """OpenAI's list-of-parts content, [{"type": "text", "text": ...}, ...], as one string (the
    parts joined as the API joins them); None (an invalid message) when a part is not text."""
    if all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in parts):
        return "".join(p["text"] for p in parts)
    return None


def _record(number: int, obj, fmt: str, answers_optional: bool = False) -> Record:
    if not isinstance(obj, dict):
        raise BadRecord("not_an_object", type(obj).__name__)
    if fmt == "text":
        if not isinstance(obj.get("text"), str):
            raise BadRecord("missing_field", "no string 'text'")
        if not obj["text"].strip():
            raise BadRecord("empty_text", "'text' is blank")
        return Record(number, obj["text"], text=obj["text"])
    messages = chat_messages(obj, fmt, answers_optional)
    if not answers_optional and not any(m["role"] == "assistant" for m in messages):
        raise BadRecord("no_assistant_turn", f"roles {[m['role'] for m in messages]}")
    if messages[0]["role"] == "assistant":  # transformers renders no empty chat, so no prefix before it
        raise BadRecord("assistant_first", "the first turn is the assistant's")
    if not answers_optional and any(_blank_answer(m) for m in messages):
        raise BadRecord("empty_text", "an assistant turn is blank")
    # The split key leaves the assistant turns out, so regenerating the answers keeps the split;
    # it is the same for a chat in any of the chat formats.
    asked = [[m["role"], m["content"]] for m in messages if m["role"] != "assistant"]
    key = json.dumps(asked or [[m["role"], m["content"]] for m in messages], ensure_ascii=False)
    return Record(number, key, messages=tuple(messages), tools=chat_tools(obj, fmt))


def _blank_answer(message: dict) -> bool:
    """An assistant turn with no text and no tool call: nothing to train on."""
    return message["role"] == "assistant" and not message["content"].strip() and not message.get("tool_calls")


def read_records(
    path: Path, fmt: str, plain_chunk_chars: int, answers_optional: bool = False
) -> Iterator[tuple[int, Record | BadRecord]]:
    """(line number, Record or BadRecord) for every record of the file, in file order
    (`answers_optional`: prompts to answer, see the module docstring)."""
    if fmt == "plain":
        yield from _plain_records(path, plain_chunk_chars)
        return
    with open_data(path) as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8-sig"))  # -sig: a byte-order mark on line 1
            except ValueError as e:  # UnicodeDecodeError and JSONDecodeError both
                yield number, BadRecord("invalid_json", str(e)[:80])
                continue
            try:
                yield number, _record(number, obj, fmt, answers_optional)
            except BadRecord as bad:
                yield number, bad


def _plain_records(path: Path, chunk_chars: int) -> Iterator[tuple[int, Record]]:
    """Paragraphs (runs of non-blank lines) grouped into documents of >= chunk_chars characters."""
    with open_data(path) as f:
        lines = f.read().decode("utf-8", errors="replace").splitlines()
    chunk: list[str] = []
    first, start, size = 0, None, 0
    for i, line in enumerate([*lines, ""]):  # the sentinel blank line ends the last paragraph
        if line.strip():
            if start is None:
                start = i
            continue
        if start is not None:
            first = first if chunk else start + 1
            chunk.append("\n".join(lines[start:i]))
            start, size = None, size + len(chunk[-1])
            if size >= chunk_chars:
                yield first, Record(first, "\n\n".join(chunk), text="\n\n".join(chunk))
                chunk, size = [], 0
    if chunk:
        yield first, Record(first, "\n\n".join(chunk), text="\n\n".join(chunk))
