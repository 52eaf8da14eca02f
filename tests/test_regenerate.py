"""`specjax regenerate` (specjax/training/regenerate.py): every prompt answered by the target, in
source order, equal to plain greedy generation; every assistant turn of a chat replaced; bad
records by line; resume after kill -9 (and a torn last line) byte for byte; a drafter changes
no greedy answer; the output is a dataset; clean CLI errors."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TARGET_CONFIG
from test_datasets import CHAT, CHATML_TEMPLATE, SYSTEM, TURN_END, make_tokenizer, write_jsonl

import specjax
from specjax.cli import main
from specjax.training.dataset_records import BadRecord, read_records
from specjax.training.datasets import DatasetConfig, load_dataset
from specjax.training.regenerate import RegenerateConfig, batch_seed, regenerate

MAX_NEW = 12
EOS_BOOST = 3.0  # <|im_end|>'s output weights x this: some answers end at it, some are cut
QUESTIONS = [
    "What is a list?",
    "And a tuple?",
    "Name a fox.",
    "Why is the dog lazy?",
    "Say hello.",
    "Is a list a tuple?",
    "Count to three.",
    "What holds items in order?",
    "Tell me about the quick brown fox.",
    "Can a tuple change?",
]


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer(CHATML_TEMPLATE)


@pytest.fixture(scope="module")
def target_dir(tokenizer, tmp_path_factory):
    """A tiny random Llama with the ChatML tokenizer, saved as an HF directory."""
    return save_tiny_target(tokenizer, tmp_path_factory.mktemp("target"))


def save_tiny_target(tokenizer, path, eos_boost: float = EOS_BOOST) -> str:
    """A tiny random Llama with `tokenizer`, saved as an HF directory at `path` (<|im_end|>'s
    output weights x `eos_boost`)."""
    config = TARGET_CONFIG.replace(vocab_size=len(tokenizer), max_position_embeddings=512)
    # conftest's scaled_model in numpy: init_model would compile for this vocabulary (seconds).
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(lambda: specjax.init_model(config, 0).params)
    params = jax.tree.map(lambda x: rng.normal(0, 0.16, x.shape) if x.ndim > 1 else np.ones(x.shape), shapes)
    params["lm_head"][:, tokenizer.convert_tokens_to_ids(TURN_END)] *= eos_boost
    params = jax.tree.map(lambda x, s: jnp.asarray(x, s.dtype), params, shapes)
    specjax.save_model(specjax.Model(config, params, tokenizer), path)
    return str(path)


@pytest.fixture(scope="module")
def target(target_dir):
    return specjax.load_model(target_dir)


def greedy_answer(target, messages, tools=None) -> tuple[str, bool]:
    """What plain greedy `specjax.generate` answers to `messages` (rendered with the generation
    prompt, and `tools` if given), and whether it ended at <|im_end|>."""
    tokenizer = target.tokenizer
    extra = {"tools": tools} if tools else {}
    ids = tokenizer.encode(
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra),
        add_special_tokens=False,
    )
    end = tokenizer.convert_tokens_to_ids(TURN_END)
    config = specjax.GenerationConfig(max_new_tokens=MAX_NEW, eos_token_id=end)
    (tokens,) = specjax.generate(target, [ids], config).tokens
    stopped = bool(tokens) and tokens[-1] == end
    return tokenizer.decode(tokens[:-1] if stopped else tokens, skip_special_tokens=True), stopped


def prompt_records() -> list[dict]:
    rows = []
    for i, question in enumerate(QUESTIONS):
        row = {"prompt": question}  # prompt-only records, and ones whose response is replaced
        if i % 3 == 1:
            row["response"] = "An answer someone else wrote."
        if i % 4 == 2:
            row["system"] = "You answer briefly."
        rows.append(row)
    return rows


def config_for(target_dir, data, out, **changes) -> RegenerateConfig:
    return RegenerateConfig(target_dir, str(data), str(out), **{"max_new_tokens": MAX_NEW, "batch_size": 3, **changes})


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("data") / "prompts.jsonl", prompt_records())


@pytest.fixture(scope="module")
def greedy_run(target_dir, prompts_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("greedy") / "answers.jsonl"
    summary = regenerate(config_for(target_dir, prompts_file, out), progress=False)
    return out, summary


def read_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_prompt_only_records_are_read_as_prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    write_jsonl(path, [{"prompt": "Hi"}, {"prompt": "Hi", "response": None, "system": "S"}])
    strict = [r for _, r in read_records(path, "prompt_response", 1000)]
    assert all(isinstance(r, BadRecord) and r.reason == "missing_field" for r in strict)  # training needs answers
    loose = [r for _, r in read_records(path, "prompt_response", 1000, answers_optional=True)]
    assert [list(r.messages) for r in loose] == [
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}],
    ]


def test_every_prompt_answered_in_order_as_plain_greedy(greedy_run, target, target_dir):
    out, summary = greedy_run
    lines = read_lines(out)
    assert [x["source_line"] for x in lines] == list(range(1, len(QUESTIONS) + 1))
    assert summary["answered"] == summary["written"] == len(QUESTIONS) and summary["complete"] and not summary["bad"]
    assert summary["finished"] + summary["cut"] == len(QUESTIONS)
    assert 0 < summary["finished"] < len(QUESTIONS), "the test needs answers that end at EOS and ones cut"
    for row, line in zip(prompt_records(), lines, strict=True):
        system = [{"role": "system", "content": row["system"]}] if "system" in row else []
        asked = [*system, {"role": "user", "content": row["prompt"]}]
        text, stopped = greedy_answer(target, asked)
        assert line["messages"] == [*asked, {"role": "assistant", "content": text}]
        assert line["regenerated"]["finished"] is stopped
        assert line["regenerated"]["target"] == target_dir and line["regenerated"]["temperature"] == 0.0
        assert line["regenerated"]["max_new_tokens"] == MAX_NEW and line["regenerated"]["seed"] == 0


@pytest.mark.parametrize("fmt", ["messages", "conversations"])
def test_every_assistant_turn_is_replaced_in_order(target, target_dir, tmp_path, fmt):
    chats = [
        [SYSTEM, *CHAT],  # two assistant turns
        CHAT[:3],  # ends with a user turn: an answer is appended
        [CHAT[0], {"role": "assistant", "content": ""}],  # a blank answer is fine: it is replaced
    ]
    rows = [{"messages": c} if fmt == "messages" else {"conversations": sharegpt(c)} for c in chats]
    out, data = tmp_path / "out.jsonl", write_jsonl(tmp_path / "chats.jsonl", rows)
    system = {"role": "system", "content": "Be brief."}  # put first where a chat has no system turn
    regenerate(config_for(target_dir, data, out, batch_size=2, system_prompt=system["content"]), progress=False)
    lines = read_lines(out)
    assert [x["source_line"] for x in lines] == [1, 2, 3]
    for chat, line in zip(chats, lines, strict=True):
        messages = line["messages"]
        expected = chat if chat[0]["role"] == "system" else [system, *chat]
        expected += [] if chat[-1]["role"] == "assistant" else [{"role": "assistant", "content": ""}]
        assert [m["role"] for m in messages] == [m["role"] for m in expected]
        finished = True
        for k, m in enumerate(messages):
            if m["role"] != "assistant":
                assert m == expected[k]  # system and user turns are kept as they are
                continue
            text, stopped = greedy_answer(target, messages[:k])  # given the regenerated earlier answers
            assert m["content"] == text
            assert m["content"] != expected[k]["content"] or not m["content"]  # the source's answer is gone
            finished = finished and stopped
        assert line["regenerated"]["finished"] is finished


def sharegpt(messages: list[dict]) -> list[dict]:
    roles = {"system": "system", "user": "human", "assistant": "gpt"}
    return [{"from": roles[m["role"]], "value": m["content"]} for m in messages]


def test_bad_records_are_reported_by_line(target_dir, tmp_path):
    rows = [
        {"messages": CHAT[:1]},  # 1: good
        "{not json",  # 2
        {"messages": [{"role": "narrator", "content": "42"}, CHAT[0]]},  # 3
        {"messages": [*CHAT[:2], SYSTEM, CHAT[2]]},  # 4: the template raises (system not first)
        {"messages": [{"role": "assistant", "content": "Hello."}, CHAT[0]]},  # 5
        "",  # 6: blank, not a record
        {"messages": [{"role": "user", "content": "word " * 600}]},  # 7: longer than the target's positions
        {"messages": CHAT},  # 8: good
    ]
    out = tmp_path / "out.jsonl"
    summary = regenerate(config_for(target_dir, write_jsonl(tmp_path / "mixed.jsonl", rows), out), progress=False)
    assert [x["source_line"] for x in read_lines(out)] == [1, 8]
    assert summary["records"] == 7 and summary["answered"] == 2
    assert summary["bad_lines"] == {
        "invalid_json": [2],
        "unknown_role": [3],
        "template_error": [4],
        "assistant_first": [5],
        "prompt_too_long": [7],
    }
    assert "a system message must come first" in summary["bad_details"]["template_error"]


@pytest.mark.parametrize("name", ["docs.jsonl", "notes.txt"])
def test_text_records_are_bad_and_a_file_of_them_an_error(target_dir, tmp_path, name):
    path = tmp_path / name
    if name.endswith(".jsonl"):
        write_jsonl(path, [{"text": "A list holds items in order."}, {"text": "A tuple cannot change."}])
    else:
        path.write_text("A list holds items in order.\n\nA tuple cannot change.\n")
    with pytest.raises(ValueError, match=rf"{name}.*no usable record.*not_a_chat: \d+ \(lines \[1"):
        regenerate(config_for(target_dir, path, tmp_path / "out.jsonl"), progress=False)
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_resume_writes_what_an_uninterrupted_run_writes(target_dir, prompts_file, tmp_path, temperature):
    whole, parts = tmp_path / "whole.jsonl", tmp_path / "parts.jsonl"
    regenerate(config_for(target_dir, prompts_file, whole, temperature=temperature, seed=5), progress=False)
    config = config_for(target_dir, prompts_file, parts, temperature=temperature, seed=5)
    first = regenerate(config, progress=False, stop_after=1)
    assert first["written"] == 3 and not first["complete"]
    # Killed mid-write in batch 2: one of its lines made it, the next one is torn.
    lines = whole.read_bytes().splitlines(keepends=True)
    with parts.open("ab") as f:
        f.write(lines[3] + lines[4][:25])
    rest = regenerate(config, progress=False)
    assert rest["complete"] and rest["already_written"] == 4 and rest["written"] == len(QUESTIONS) - 4
    assert parts.read_bytes() == whole.read_bytes()
    again = regenerate(config, progress=False)  # nothing left: nothing generated, nothing written
    assert again["written"] == 0 and again["generated_tokens"] == 0 and parts.read_bytes() == whole.read_bytes()
    if temperature:
        greedy = regenerate(config_for(target_dir, prompts_file, tmp_path / "greedy.jsonl"), progress=False)
        assert greedy["answered"] == len(QUESTIONS)
        assert (tmp_path / "greedy.jsonl").read_bytes() != whole.read_bytes()  # sampling did sample


def test_resume_refuses_other_settings(target_dir, prompts_file, tmp_path):
    out = tmp_path / "out.jsonl"
    regenerate(config_for(target_dir, prompts_file, out), progress=False, stop_after=1)
    with pytest.raises(ValueError, match=r"written with temperature=0\.0, but this run has temperature=0\.5"):
        regenerate(config_for(target_dir, prompts_file, out, temperature=0.5), progress=False)


def test_kill_minus_9_then_rerun_equals_an_uninterrupted_run(target_dir, prompts_file, tmp_path):
    whole, killed = tmp_path / "whole.jsonl", tmp_path / "killed.jsonl"
    # The settings of test_resume_writes_what_an_uninterrupted_run_writes[1.0]: its programs are compiled.
    regenerate(config_for(target_dir, prompts_file, whole, temperature=1.0, seed=5), progress=False)
    args = ["regenerate", "--target", target_dir, "--data", prompts_file, "--out", str(killed), "--temperature", "1"]
    args += ["--seed", "5", "--batch-size", "3", "--max-new-tokens", str(MAX_NEW), "--no-progress"]
    process = subprocess.Popen([sys.executable, "-m", "specjax.cli", *args], stdout=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if killed.exists() and killed.stat().st_size:  # a batch is on disk
            break
        time.sleep(0.002)
    # Batches 2 and 3 reuse batch 1's programs, the last one (a single row) compiles its own: time enough.
    assert process.poll() is None, "the run finished before it could be killed; make it longer"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert 0 < killed.read_bytes().count(b"\n") < len(QUESTIONS)
    assert main(args) == 0  # the rerun, in this process (it has the programs compiled)
    assert killed.read_bytes() == whole.read_bytes()
    assert [x["source_line"] for x in read_lines(killed)] == list(range(1, len(QUESTIONS) + 1))


def test_a_drafter_changes_no_greedy_answer(greedy_run, target_dir, prompts_file, tmp_path):
    out = tmp_path / "lookup.jsonl"
    config = config_for(
        target_dir, prompts_file, out, drafter="prompt-lookup", num_speculative_tokens=3, batch_size=len(QUESTIONS)
    )  # one batch, one compile; greedy answers do not depend on the batch either
    summary = regenerate(config, progress=False)
    assert summary["answered"] == len(QUESTIONS)
    plain, speculative = read_lines(greedy_run[0]), read_lines(out)
    assert [x["messages"] for x in speculative] == [x["messages"] for x in plain]
    assert [x["regenerated"]["finished"] for x in speculative] == [x["regenerated"]["finished"] for x in plain]
    assert speculative[0]["regenerated"]["drafter"] == "prompt-lookup"


def test_the_output_is_a_dataset(greedy_run, tokenizer):
    out, _ = greedy_run
    loaded = load_dataset(DatasetConfig(path=str(out), seq_len=16), tokenizer)
    assert loaded.report.format == "messages" and loaded.report.records == len(QUESTIONS)
    empty = [x["source_line"] for x in read_lines(out) if not x["messages"][-1]["content"].strip()]
    assert [r.line for r in loaded.records] == [n for n in range(1, len(QUESTIONS) + 1) if n not in empty]


def test_cli_summary_and_errors(target_dir, prompts_file, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    base = ["regenerate", "--target", target_dir, "--max-new-tokens", str(MAX_NEW), "--no-progress"]
    assert main([*base, "--data", prompts_file, "--out", str(out), "--set", "batch_size=2"]) == 0
    printed = capsys.readouterr().out
    assert f"{len(QUESTIONS)} of {len(QUESTIONS)} records answered in {out}" in printed and "tokens/s" in printed
    assert read_lines(out)[0]["regenerated"]["batch_size"] == 2
    missing = tmp_path / "missing.jsonl"
    texts = write_jsonl(tmp_path / "texts.jsonl", [{"text": "no prompt here"}])
    for data, message in ((missing, f"data file {missing} does not exist"), (texts, f"{texts} (text): no usable")):
        assert main([*base, "--data", str(data), "--out", str(tmp_path / "x.jsonl")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"specjax: error: {message}") and err.count("\n") == 1
    assert main([*base, "--data", prompts_file, "--out", str(out), "--set", "bogus=1"]) == 2
    assert "unknown config key bogus" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()


def test_config_checks():
    with pytest.raises(ValueError, match="same file"):
        RegenerateConfig(target="t", data="a.jsonl", out="a.jsonl")
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        RegenerateConfig(target="t", data="a.jsonl", out="b.jsonl", batch_size=0)
    assert dataclasses.replace(RegenerateConfig("t", "a", "b"), drafter="x").provenance()["num_speculative_tokens"] == 4
    # Seeds are a pure function of (seed, first line, turn), distinct across each of them.
    seeds = {batch_seed(s, line, turn) for s in (0, 1) for line in (1, 4) for turn in (0, 1)}
    assert len(seeds) == 8 and batch_seed(0, 4, 1) == batch_seed(0, 4, 1) and all(0 <= s < 2**31 for s in seeds)
