"""Regenerating a dataset's answers with the target itself (`specjax regenerate`).

A drafter is verified against the target's distribution, so it is trained on the target's own
answers rather than the ones a dataset's authors wrote (EAGLE's practice; published acceptance
lengths are not reached without it). Every prompt of the file is answered, and every assistant
turn of a chat is replaced:

  prompt_response  {"prompt", "response"?, "system"?}: the response is written anew (a
                   prompt-only record gets one).
  messages / conversations: each assistant turn in order, generated from the chat before it
                   with the earlier turns already regenerated, rendered with the tokenizer's chat
                   template (add_generation_prompt=True); a chat that ends with a user (or
                   system, or tool) turn gets an answer to it appended. Tool use (OpenAI's
                   "tool_calls", tool turns, the record's "tools"): an assistant turn that calls
                   tools is kept as written, since the tool outputs after it answer that call,
                   and only the text answers are regenerated; "tools" goes to the template and
                   is written back with the chat.
  text / plain     documents have no prompt: each is a bad record ("not_a_chat").
Bad records (specjax/training/dataset_records.py's reasons, plus REGENERATE_REASONS) are
counted and reported by line; a file with no usable record is a ValueError.

The output is JSONL, one line per usable source record in source order, in OpenAI `messages`
form plus provenance, so it is itself a dataset (`DatasetConfig(path=out)` reads `messages`
and ignores the other keys):
    {"source_line": 7, "messages": [...], "regenerated": {"target": ..., "temperature": ...,
     "seed": ..., "max_new_tokens": ..., ..., "finished": true}}
`finished`: every answer of the record ended at EOS / the end-of-turn token (which is not part
of the text); false: at least one was cut at max_new_tokens.

Batches and seeds: batches are formed once, from all usable records in source order, in
chunks of `batch_size` (the engine already pads prompt lengths to powers of two and rows to
batch buckets, so compiles stay few; grouping by length would decouple the output order from
the source order). Turn t of every chat of a batch is one `specjax.generate` call, seeded by
(seed, the batch's first source line, t). A batch's rows and seeds therefore never depend on
where a run started, so sampled output is reproducible too.

Resume: each batch's lines are appended in one write, then flushed and fsynced. On restart the
output is read, a torn last line (no newline: killed mid-write) is cut off, lines must match
this run's settings, and batches whose lines are all written are skipped. The batch holding the
last written line is generated again (the same rows and seeds give the same answers) and only
its missing lines are written, so a resumed run's file equals an uninterrupted run's, byte for
byte.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from specjax.api import generate, load_drafter
from specjax.config import GenerationConfig, SpeculativeConfig
from specjax.configs import parse_yaml
from specjax.io.presets import load_model
from specjax.training.dataset_records import BAD_REASONS, FORMATS, BadRecord, detect_format, read_records
from specjax.training.datasets import check_chat_tools, render_chat

REGENERATE_REASONS = (
    "not_a_chat",  # a text document: nothing to answer
    "prompt_too_long",  # the prompt + max_new_tokens (+ K + 1) runs past the target's positions
    "ends_in_tool_call",  # the chat ends waiting for a tool's output: no answer to write
)
# End-of-turn tokens of common chat templates: generation stops at them as at EOS.
_TURN_ENDS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>")


@dataclasses.dataclass(frozen=True)
class RegenerateConfig:
    target: str  # a model name or path, as `specjax generate --target` takes it
    data: str  # the prompts: a JSONL file (specjax/training/dataset_records.py)
    out: str  # the JSONL file written (appended to: a rerun resumes it)
    format: str = "auto"  # one of dataset_records.FORMATS
    temperature: float = 0.0  # 0 = greedy
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    max_new_tokens: int = 256  # per answer
    batch_size: int = 8
    seed: int = 0  # sampling; turn t of the batch starting at source line n uses (seed, n, t)
    drafter: str | dict | None = None  # speculative decoding: a spec as `specjax generate --drafter` takes
    num_speculative_tokens: int = 4  # K, with a drafter
    system_prompt: str | None = None  # a system turn put first in chats that have none (it is written out)
    stop_token_ids: tuple[int, ...] = ()  # stop at these too (the tokenizer's EOS and end-of-turn tokens always)
    dtype: str = "float32"  # the target's params
    report_lines: int = 10  # line numbers the report keeps per bad-record reason

    def __post_init__(self):
        for name in ("target", "data", "out"):
            if not getattr(self, name):
                raise ValueError(f"regenerate: {name} is empty")
        if self.format not in FORMATS:
            raise ValueError(f"unknown dataset format {self.format!r}; expected one of {FORMATS}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        for name in ("max_new_tokens", "batch_size", "num_speculative_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seed < 0 or self.report_lines < 0:
            raise ValueError(f"seed and report_lines must be >= 0, got {self.seed}, {self.report_lines}")
        if Path(self.out).resolve() == Path(self.data).resolve():
            raise ValueError(f"out and data are the same file ({self.data}): write the answers elsewhere")

    def provenance(self) -> dict:
        """What each output line records; also what a resumed run must share with the lines there
        (anything that changes an answer: batch composition and K change sampled ones)."""
        speculative = self.drafter is not None
        return {
            "target": self.target,
            "drafter": self.drafter,
            "num_speculative_tokens": self.num_speculative_tokens if speculative else None,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "seed": self.seed,
            "max_new_tokens": self.max_new_tokens,
            "batch_size": self.batch_size,
            "system_prompt": self.system_prompt,
            "dtype": self.dtype,
        }


@dataclasses.dataclass(frozen=True)
class _Chat:
    line: int
    messages: tuple[dict, ...]  # the source chat, ending with an assistant turn (empty if appended)
    turns: tuple[int, ...]  # indices of the assistant turns to generate, in order (not tool calls)
    tools: tuple[dict, ...] | None = None  # the record's tool definitions, for the template


class _Report:
    """Bad records by reason: counts, the first line numbers and the first detail."""

    def __init__(self, keep: int):
        self.keep, self.count, self.lines, self.details = keep, Counter(), {}, {}

    def add(self, line: int, reason: str, detail: str) -> None:
        assert reason in BAD_REASONS + REGENERATE_REASONS, reason
        self.count[reason] += 1
        self.details.setdefault(reason, detail)
        if len(lines := self.lines.setdefault(reason, [])) < self.keep:
            lines.append(line)

    def as_dict(self) -> dict:
        return {
            "bad": dict(self.count),
            "bad_lines": {r: sorted(lines) for r, lines in self.lines.items()},
            "bad_details": dict(self.details),
        }


def _render(tokenizer, messages, tools=None) -> list[int]:
    text = render_chat(tokenizer, messages, tools, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)  # the template holds the special tokens


def _read_chats(config: RegenerateConfig, tokenizer, max_prompt: int, report: _Report) -> tuple[str, int, list]:
    """(format, records read, usable chats in source order); bad ones go to `report`."""
    path = Path(config.data)
    fmt = detect_format(path) if config.format == "auto" else config.format
    system = [] if config.system_prompt is None else [{"role": "system", "content": config.system_prompt}]
    chats, read = [], 0
    for line, record in read_records(path, fmt, plain_chunk_chars=1000, answers_optional=True):
        read += 1
        if isinstance(record, BadRecord):
            report.add(line, record.reason, record.detail)
            continue
        if record.messages is None:
            report.add(line, "not_a_chat", f"a {fmt} document has no prompt to answer")
            continue
        messages = list(record.messages)
        if system and messages[0]["role"] != "system":
            messages = [*system, *messages]
        if messages[-1]["role"] != "assistant":
            messages.append({"role": "assistant", "content": ""})  # the answer to the last prompt
        if messages[-1].get("tool_calls"):
            report.add(line, "ends_in_tool_call", "the last turn calls a tool; no tool output follows")
            continue
        turns = tuple(k for k, m in enumerate(messages) if m["role"] == "assistant" and not m.get("tool_calls"))
        try:  # the template is the user's code: whatever it raises rejects the chat
            longest = max(len(_render(tokenizer, messages[:k], record.tools)) for k in turns)
            check_chat_tools(tokenizer, messages[: turns[-1]], record.tools)
        except BadRecord as bad:
            report.add(line, bad.reason, bad.detail)
            continue
        except Exception as e:
            report.add(line, "template_error", f"{type(e).__name__}: {e}"[:120])
            continue
        # Checked with the source's answers; regenerated ones may be longer (checked again then).
        if longest > max_prompt:
            report.add(line, "prompt_too_long", f"{longest} prompt tokens, at most {max_prompt} fit")
            continue
        chats.append(_Chat(line, tuple(messages), turns, record.tools))
    return fmt, read, chats


def _stop_ids(tokenizer, extra: tuple[int, ...]) -> tuple[int, ...]:
    added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    ids = [tokenizer.eos_token_id, *(added.get(t) for t in _TURN_ENDS), *extra]
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


def batch_seed(seed: int, first_line: int, turn: int) -> int:
    """The sampling seed of turn `turn` of the batch starting at source line `first_line`."""
    return int(np.random.SeedSequence([seed, first_line, turn]).generate_state(1)[0] >> 1)


def _written_lines(out: Path, settings: dict, usable: set[int]) -> list[int]:
    """Source lines the output already holds, in order, after cutting off a torn last line;
    a line that does not belong to this run (other settings, another input) is an error."""
    if not out.exists():
        return []
    data = out.read_bytes()
    end = data.rfind(b"\n") + 1
    lines: list[int] = []
    for number, raw in enumerate(data[:end].split(b"\n")[:-1], 1):
        try:
            obj = json.loads(raw)
            line, written = obj["source_line"], dict(obj["regenerated"])
        except (ValueError, KeyError, TypeError):
            raise ValueError(
                f"{out}:{number}: not a line of `specjax regenerate`; choose another output file"
            ) from None
        written.pop("finished", None)
        for key, value in settings.items():
            if written.get(key) != value:
                raise ValueError(
                    f"{out} was written with {key}={written.get(key)!r}, but this run has {key}={value!r}: "
                    "resume with the same settings, or choose another output file"
                )
        if line not in usable or (lines and line <= lines[-1]):
            raise ValueError(f"{out}:{number}: source line {line} is not a next record of the data: another input?")
        lines.append(line)
    if end < len(data):  # killed mid-write: the partial line goes, its batch is generated again
        with out.open("r+b") as f:
            f.truncate(end)
            os.fsync(f.fileno())
    return lines


def regenerate(config: RegenerateConfig, progress: bool = True, stop_after: int | None = None) -> dict:
    """Answer every prompt of `config.data` with the target into `config.out` (see the module
    docstring), resuming what the output already holds. `stop_after`: generate at most this
    many batches in this call. Returns a summary (counts, bad records, tokens, seconds)."""
    data, out = Path(config.data), Path(config.out)
    if not data.is_file():
        raise ValueError(f"data file {data} does not exist")
    if out.is_dir():
        raise ValueError(f"out {out} is a directory: name the JSONL file to write")
    target = load_model(config.target, dtype=config.dtype, seed=config.seed)
    tokenizer = target.tokenizer
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"target {config.target!r} has no tokenizer with a chat template ({type(tokenizer).__name__}): "
            "regeneration renders every prompt with it"
        )
    stops = _stop_ids(tokenizer, config.stop_token_ids)
    if not stops:
        raise ValueError("the tokenizer has no EOS token, so answers would never end; set stop_token_ids")
    drafter = _drafter(config, target)
    headroom = config.num_speculative_tokens + 1 if drafter is not None else 0
    max_prompt = target.config.max_position_embeddings - config.max_new_tokens - headroom
    if max_prompt < 1:
        raise ValueError(
            f"max_new_tokens {config.max_new_tokens} leaves no room for a prompt in the target's "
            f"{target.config.max_position_embeddings} positions"
        )
    report = _Report(config.report_lines)
    fmt, read, chats = _read_chats(config, tokenizer, max_prompt, report)
    if not chats:
        summary = "; ".join(f"{r}: {n} (lines {report.lines[r]}; {report.details[r]})" for r, n in report.count.items())
        raise ValueError(f"{data} ({fmt}): no usable record to regenerate among {read}: {summary}")
    answerer = _Answerer(
        target, drafter, SpeculativeConfig(num_speculative_tokens=config.num_speculative_tokens),
        GenerationConfig.at_temperature(
            config.temperature, top_k=config.top_k, top_p=config.top_p, min_p=config.min_p,
            max_new_tokens=config.max_new_tokens, eos_token_id=stops,
        ),
        stops, config.seed, max_prompt, report,
    )  # fmt: skip
    settings = {**config.provenance(), "stop_token_ids": list(stops)}  # the stops used, not only the extra ones
    written = _written_lines(out, settings, {c.line for c in chats})
    last, present = (written[-1] if written else 0), set(written)
    batches = [chats[i : i + config.batch_size] for i in range(0, len(chats), config.batch_size)]
    done = [b for b in batches if b[-1].line <= last]
    for batch in done:  # a usable record missing from a finished batch was too long once regenerated
        for chat in batch:
            if chat.line not in present:
                report.add(chat.line, "prompt_too_long", "a turn after the regenerated earlier answers")
    bar = tqdm(total=len(chats), initial=sum(map(len, done)), desc="regenerate", unit="record", disable=not progress)
    tokens, ended, cut, new_lines, ran, start = 0, 0, 0, 0, 0, time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("ab") as f:
        for batch in batches[len(done) :]:
            if stop_after is not None and ran >= stop_after:
                break
            answers, batch_tokens = answerer(batch)
            lines = [
                {
                    "source_line": chat.line,
                    "messages": messages,
                    **({"tools": list(chat.tools)} if chat.tools else {}),
                    "regenerated": {**settings, "finished": ended_all},
                }
                for chat, (messages, ended_all) in zip(batch, answers, strict=True)
                if messages is not None and chat.line > last  # lines up to `last` are there already
            ]
            f.write(b"".join(json.dumps(x, ensure_ascii=False).encode() + b"\n" for x in lines))
            f.flush()
            os.fsync(f.fileno())  # a kill -9 after this point loses nothing of this batch
            ran, tokens, new_lines = ran + 1, tokens + batch_tokens, new_lines + len(lines)
            ended += sum(x["regenerated"]["finished"] for x in lines)
            cut += sum(not x["regenerated"]["finished"] for x in lines)
            seconds = time.perf_counter() - start
            bar.update(len(batch))
            bar.set_postfix(tokens=tokens, tok_s=f"{tokens / max(seconds, 1e-9):.1f}")
    bar.close()
    seconds = time.perf_counter() - start
    return {
        "out": str(out),
        "data": str(data),
        "format": fmt,
        "records": read,
        "usable": len(chats),
        "answered": len(written) + new_lines,  # lines in the output now
        "already_written": len(written),
        "written": new_lines,
        "finished": ended,  # of the lines written now: every answer ended at EOS
        "cut": cut,  # ... at least one answer cut at max_new_tokens
        "complete": len(done) + ran == len(batches),
        "generated_tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / max(seconds, 1e-9),
        **report.as_dict(),
    }


def _drafter(config: RegenerateConfig, target):
    if config.drafter is None:
        return None
    spec: Any = config.drafter
    if isinstance(spec, str) and spec.lstrip().startswith("{"):
        spec = parse_yaml(spec, "drafter")

    def load(name: str):  # random presets draw the draft's weights with seed + 1, as the CLI does
        return load_model(name, dtype=config.dtype, seed=config.seed + 1)

    return load_drafter(SpeculativeConfig.parse(spec, "drafter"), target, load=load)


@dataclasses.dataclass(frozen=True)
class _Answerer:
    target: Any
    drafter: Any
    speculative: SpeculativeConfig
    generation: GenerationConfig
    stops: tuple[int, ...]
    seed: int
    max_prompt: int
    report: _Report

    def __call__(self, batch: list[_Chat]) -> tuple[list[tuple[list | None, bool]], int]:
        """(regenerated chat, every answer ended at a stop token) per record of a batch (chat
        None: too long once regenerated), and the tokens generated. Turn t of every chat that
        has one is one batched call, seeded by (seed, the batch's first line, t)."""
        tokenizer = self.target.tokenizer
        chats = [[dict(m) for m in chat.messages] for chat in batch]
        finished, alive, tokens = [True] * len(batch), [True] * len(batch), 0
        for turn in range(max(len(chat.turns) for chat in batch)):
            rows, prompts = [], []
            for i, chat in enumerate(batch):
                if not alive[i] or turn >= len(chat.turns):
                    continue
                ids = _render(tokenizer, chats[i][: chat.turns[turn]], chat.tools)
                if len(ids) > self.max_prompt:  # the regenerated earlier answers are longer than the source's
                    alive[i] = False
                    self.report.add(chat.line, "prompt_too_long", "a turn after the regenerated earlier answers")
                    continue
                rows.append(i)
                prompts.append(ids)
            if not rows:
                continue
            config = self.generation.replace(seed=batch_seed(self.seed, batch[0].line, turn))
            speculative = None if self.drafter is None else self.speculative
            output = generate(self.target, prompts, config, draft=self.drafter, speculative=speculative)
            tokens += output.stats.generated_tokens
            for i, ids in zip(rows, output.tokens, strict=True):
                stopped = bool(ids) and ids[-1] in self.stops  # the stop token ends the turn; it is no text
                text = tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=True)
                chats[i][batch[i].turns[turn]] = {"role": "assistant", "content": text}
                finished[i] = finished[i] and stopped
        return [(c if a else None, e) for c, e, a in zip(chats, finished, alive, strict=True)], tokens
