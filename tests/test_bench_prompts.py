"""Bench prompts from files (JSONL, text, chat template) with per-category rows, a drafter
mapping as the bench's draft, and E8 (drafting methods) on tiny byte-level models."""

from __future__ import annotations

import csv
import json
import math

import pytest
from conftest import TARGET_CONFIG, scaled_model

import specjax
from specjax.api import load_drafter
from specjax.bench import BenchConfig, run_bench
from specjax.bench.cost_model import CostTable, round_seconds
from specjax.bench.prompt_sets import Prompts, encode, load_prompts, read_source
from specjax.config import SpeculativeConfig
from specjax.configs import from_dict
from specjax.drafters import PromptLookup
from specjax.io.tokenizer import ByteTokenizer

BYTES = ByteTokenizer()


def _jsonl(path, records) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


# --- Reading prompt files -------------------------------------------------------------------


def test_jsonl_takes_prompt_or_the_first_turn_and_categories(tmp_path):
    records = [
        {"prompt": "def f(x):", "category": "code"},
        {"turns": ["Tell me a story.", "Now shorter."], "category": "writing", "question_id": 81},
        "",  # blank lines are skipped
        {"prompt": "no category of its own"},
    ]
    path = _jsonl(tmp_path / "questions.jsonl", records)
    expected = [("code", "def f(x):"), ("writing", "Tell me a story."), ("questions", "no category of its own")]
    assert read_source(Prompts(file=path)) == expected  # the file's stem is the default category
    assert read_source(Prompts(file=path, category="misc", count=1)) == expected[:1]
    assert read_source(Prompts(file=path, category="misc"))[2] == ("misc", "no category of its own")


def test_text_prompts_are_separated_by_blank_lines(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("def f(x):\n    return x\n\n\n  \nsecond prompt\n\nthird\n")
    assert read_source(Prompts(file=str(path))) == [
        ("notes", "def f(x):\n    return x"),  # a prompt keeps its own line breaks
        ("notes", "second prompt"),
        ("notes", "third"),
    ]


def test_corpus_prompts_share_one_length_and_file_prompts_stay_whole(tmp_path):
    path = _jsonl(tmp_path / "mine.jsonl", [{"prompt": "a"}, {"prompt": "a much longer prompt than that"}])
    sources = [Prompts("code", 2, 24), Prompts("prose", 2, 40), Prompts(file=path)]
    prompts = load_prompts(sources, BYTES)
    assert prompts.categories == ["code", "code", "prose", "prose", "mine", "mine"]
    assert len({len(t) for t in prompts.tokens[:4]}) == 1  # cut to the shortest corpus prompt
    assert prompts.tokens[4:] == [BYTES.encode("a"), BYTES.encode("a much longer prompt than that")]


@pytest.mark.parametrize(
    ("name", "content", "error", "match"),
    [
        ("missing.jsonl", None, FileNotFoundError, "missing.jsonl does not exist"),
        (
            "bad.jsonl",
            '{"prompt": "ok"}\n{"prompt": "unterminated\n',
            ValueError,
            r"bad\.jsonl, line 2: not valid JSON",
        ),
        (
            "neither.jsonl",
            '{"text": "hi"}\n',
            ValueError,
            r"line 1: the object has no 'prompt', 'turns' or 'messages' field",
        ),
        ("list.jsonl", '["hi"]\n', ValueError, r"line 1: expected a JSON object"),
        ("turns.jsonl", '{"turns": []}\n', ValueError, r"line 1: 'turns' must be a non-empty list"),
        ("number.jsonl", '{"prompt": 3}\n', ValueError, r"line 1: the prompt must be a string"),
        ("pooled.jsonl", '{"prompt": "hi", "category": "all"}\n', ValueError, r"line 1: 'category' must be"),
        ("array.json", '[{"prompt": "hi"}]', ValueError, r"use JSONL"),
        ("empty.txt", "\n \n", ValueError, "holds no prompts"),
    ],
)
def test_bad_prompt_files_name_the_problem(tmp_path, name, content, error, match):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(error, match=match):
        read_source(Prompts(file=str(path)))


class ChatBytes(ByteTokenizer):
    """A byte tokenizer with a chat template, as HF tokenizers have."""

    chat_template = "<user>{content}<assistant>"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert not tokenize and add_generation_prompt and messages[0]["role"] == "user"
        return self.chat_template.format(content=messages[0]["content"])


def test_chat_template_wraps_each_prompt_or_names_the_missing_template():
    assert encode(ChatBytes(), "hi", chat_template=True) == list(b"<user>hi<assistant>")  # no extra BOS
    assert encode(ChatBytes(), "hi", chat_template=False) == BYTES.encode("hi")
    with pytest.raises(ValueError, match=r"tokenizer \(ByteTokenizer\) has no chat template"):
        encode(BYTES, "hi", chat_template=True)


class TurnBytes(ByteTokenizer):
    """A byte tokenizer whose chat template renders every turn (and tools, when given)."""

    chat_template = "<{role}>{content}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, tools=None):
        assert not tokenize and add_generation_prompt
        text = "".join(self.chat_template.format(**m) for m in messages)
        return ("<tools>" + ",".join(t["function"]["name"] for t in tools) if tools else "") + text + "<assistant>"


# Lines as `specjax regenerate` writes them: OpenAI `messages` ending in the regenerated answer.
REGENERATED = [
    {"source_line": 1, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"},
                                    {"role": "assistant", "content": "Hello."}], "regenerated": {"target": "t"}},
    {"source_line": 2, "messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                                    {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "6"}],
     "regenerated": {"target": "t"}, "category": "math"},
    {"messages": [{"role": "user", "content": "Weather?"}], "tools": [{"type": "function", "function": {"name": "w"}}]},
]  # fmt: skip


def test_messages_records_are_chats_up_to_their_last_assistant_turn(tmp_path):
    """regenerate's output is a prompt file: each chat before its final answer, rendered by the
    chat template whether or not one was asked for (a chat means nothing as raw text)."""
    path = _jsonl(tmp_path / "regen.jsonl", REGENERATED)
    prompts = read_source(Prompts(file=path))
    assert [c for c, _ in prompts] == ["regen", "math", "regen"]
    assert [str(p) for _, p in prompts] == ["Hi?", "and 3+3?", "Weather?"]  # what a listing shows
    assert [m["role"] for m in prompts[1][1].messages] == ["user", "assistant", "user"]
    expected = [
        "<system>Be brief.<user>Hi?<assistant>",
        "<user>2+2?<assistant>4<user>and 3+3?<assistant>",
        "<tools>w<user>Weather?<assistant>",
    ]
    for chat_template in (False, True):
        loaded = load_prompts([Prompts(file=path, chat_template=chat_template)], TurnBytes())
        assert loaded.tokens == [list(text.encode()) for text in expected]
    with pytest.raises(ValueError, match=r"a prompt is a chat \(a 'messages' record\).*has no chat template"):
        load_prompts([Prompts(file=path)], BYTES)


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ({"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]},
         r"bad\.jsonl, line 2: the chat's prompt \(before its final assistant turn\) has no user turn: "
         r"roles \['system'\]"),
        ({"messages": [{"role": "user"}]}, r"bad\.jsonl, line 2: not a valid 'messages' chat \(invalid message"),
        ({"messages": [{"role": "robot", "content": "x"}]}, r"line 2: not a valid 'messages' chat \(unknown role"),
        ({"messages": []}, r"line 2: not a valid 'messages' chat \(missing field"),
    ],
)  # fmt: skip
def test_bad_messages_records_name_the_line(tmp_path, line, match):
    path = _jsonl(tmp_path / "bad.jsonl", [REGENERATED[0], line])
    with pytest.raises(ValueError, match=match):
        read_source(Prompts(file=path))


def test_generate_reads_regenerated_chats_as_templated_prompts(tmp_path):
    """`specjax generate --prompt-file regen.jsonl`: chats become token ids through the template,
    with or without --chat; plain --prompt strings stay strings for the engine when no chat is there."""
    import argparse

    from specjax.cli.generate import encode_prompts, read_prompts

    path = _jsonl(tmp_path / "regen.jsonl", REGENERATED[:1])
    args = argparse.Namespace(prompt=["def "], prompt_file=path)
    texts = read_prompts(args)
    assert texts[0] == "def " and str(texts[1]) == "Hi?"
    for chat in (False, True):
        ids = encode_prompts(TurnBytes(), texts, chat)
        assert ids[1] == list(b"<system>Be brief.<user>Hi?<assistant>")
    assert encode_prompts(TurnBytes(), ["def "], False) == ["def "]


def test_drafter_and_prompt_config_errors_name_the_key():
    cases = [
        ({"draft": {"method": "prompt_lookup", "max_ngrams": 3}}, r"draft: unknown key 'max_ngrams'; valid keys: "),
        ({"draft": {"method": "prompt_lookupp"}}, r"draft: unknown speculative method 'prompt_lookupp'"),
        ({"draft": {"method": "prompt_lookup", "layers": 2}}, r"'prompt_lookup' does not take layers \(it takes "),
        ({"draft": {"kind": "layer_skip", "max_ngram": 2}}, r"'layer_skip' does not take prompt_lookup_max"),
        ({"draft": {"method": "ngram", "prompt_lookup_min": 4}}, r"PromptLookup needs 1 <= min_ngram"),
        ({"draft": {"hidden_sizee": 8}}, r"unknown config key draft\.hidden_sizee;"),  # a ModelConfig mapping
        ({"prompts": [{"domain": "code"}, {"fiel": "x"}]}, r"unknown config key prompts\[1\]\.fiel;"),
        ({"methods": {"drafters": [{"name": "a"}, {"name": "a"}]}}, "unique names"),
    ]
    for data, match in cases:
        with pytest.raises(ValueError, match=match):
            config = from_dict(BenchConfig, data)
            if "draft" in data:  # value errors of a drafter's own come when it is built, before any run
                load_drafter(config.draft, TARGET_CONFIG, load=lambda name: None)
    config = from_dict(BenchConfig, {"draft": {"kind": "layer-skip", "layers": 1}, "prompts": {"file": "p.jsonl"}})
    assert config.draft == SpeculativeConfig(method="layer_skip", layers=1)
    assert config.prompt_sources == [Prompts(file="p.jsonl")]


# --- A bench run: a drafter mapping as draft, prompts from files, E3, E6 and E8 --------------


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_prompts")
    jsonl = _jsonl(
        out / "mixed.jsonl",
        [
            {"prompt": "x = 1\nx = 1\nx =", "category": "code"},
            {"prompt": "def f(a): a", "category": "code"},
            {"turns": ["again and again", "and?"], "category": "chat"},
        ],
    )
    # Ragged, but all in one 16-token bucket: one compiled program per spec and batch shape.
    (out / "notes.txt").write_text("the cat sat on\nthe mat\n\nthe cat")
    config = {
        "draft": {"method": "ngram", "prompt_lookup_max": 2},
        "prompts": [{"file": jsonl}, {"file": str(out / "notes.txt")}],
        "experiments": ["tokens_per_round", "k_sweep", "waste", "methods"],
        "max_new_tokens": 8,
        "timing": {"repeats": 2, "cost_inner": 2, "tpot_target_ms": 1000.0},
        # Keep compiled programs between experiments (bench/runner.py clears them by default, for
        # big models), so that E8's lookup rows reuse E3's programs, as `methods` below intends.
        "clear_caches": False,
        "tokens_per_round": {"ks": [2], "temperatures": [0.0]},
        "k_sweep": {"ks": [2]},
        "waste": {"ks": [2]},
        "methods": {
            "num_speculative_tokens": 2,
            "temperatures": [0.0],  # shares compiled programs with E3 (T = 1 proposals: the test below)
            "drafters": [{"name": "lookup"}, {"name": "skip", "draft": {"method": "layer_skip", "layers": 1}}],
        },
    }
    model = scaled_model(TARGET_CONFIG.replace(vocab_size=259), seed=0)
    target = specjax.Model(model.config, model.params, tokenizer=BYTES)
    results = run_bench(from_dict(BenchConfig, config), out / "out", target=target, progress=False)
    return results, out / "out"


CATEGORIES = {"all", "code", "chat", "notes"}


def test_the_draft_may_be_any_drafter(run):
    results, _ = run
    draft = results["models"]["draft"]
    assert draft["kind"] == "prompt_lookup" and draft["parameters"] == 0
    assert draft["name"] == "{method: prompt_lookup, prompt_lookup_max: 2}"
    (spec,) = [
        r for r in results["experiments"]["k_sweep"]["rows"] if r["method"] != "plain" and r["category"] == "all"
    ]
    # Not a draft model: its share of a round is its proposal timed beside the round.
    assert spec["draft_time_share_definition"] == "propose" and math.isfinite(spec["draft_time_share"])
    assert spec["output_matches_plain"] and spec["drafter_kind"] == "prompt_lookup"


def test_every_row_is_reported_per_category_and_pooled(run):
    results, out = run
    for name in ("tokens_per_round", "k_sweep", "waste", "methods"):
        rows = results["experiments"][name]["rows"]
        assert {r["category"] for r in rows} == CATEGORIES, name
    for row in results["experiments"]["tokens_per_round"]["rows"]:  # each category's own profile, at K = 2
        assert row["predicted_per_position"] == pytest.approx(row["measured_tokens_per_round"])
    for row in results["rows"]:  # timed rows: the pooled row sums its categories' requests
        if row["category"] != "all":
            continue
        parts = [
            r
            for r in results["rows"]
            if r["experiment"] == row["experiment"]
            and r["category"] != "all"
            and (r["drafter"], r["temperature"]) == (row["drafter"], row["temperature"])
        ]
        assert len(parts) == 3
        for key in ("requests", "generated_tokens", "rounds", "accepted_tokens"):
            assert row[key] == sum(p[key] for p in parts), key
    waste = {r["category"]: r for r in results["experiments"]["waste"]["rows"]}
    assert waste["all"]["rounds"] == sum(waste[c]["rounds"] for c in ("code", "chat", "notes"))
    with (out / "results.csv").open() as f:
        assert {row["category"] for row in csv.DictReader(f)} == CATEGORIES


def test_e8_compares_methods_per_temperature_and_category(run):
    results, out = run
    e8 = results["experiments"]["methods"]
    assert e8["id"] == "E8" and (out / e8["plot"]).stat().st_size > 10_000
    assert set(e8["drafters"]) == {"lookup", "skip"} and e8["drafters"]["skip"]["kind"] == "layer_skip"
    spec = [r for r in e8["rows"] if r["method"] == "speculative"]
    assert len(spec) == 2 * len(CATEGORIES)  # methods x (categories + pooled)
    for row in spec:
        # A ratio of two separately timed quantities: its value is the bench's to report, not a test's to bound
        # (on a loaded machine a lookup's tiny propose time can come out at or past either end).
        assert row["draft_time_share_definition"] == "propose" and math.isfinite(row["draft_time_share"])
        assert row["drafted_tokens"] == row["accepted_tokens"] + row["wasted_positions"]
        assert 1.0 <= row["mean_acceptance_length"] <= 3.0
        assert row["speedup_vs_plain"] > 0 and row["speedup_vs_plain_paired"] > 0
        assert row["output_matches_plain"]  # greedy: each category's outputs equal plain decoding's
        if row["drafter"] == "lookup":  # prompt lookup counts the rounds it had no match
            assert row["no_match_rounds"] <= row["rounds"] and row["no_match_share"] == pytest.approx(
                row["no_match_rounds"] / row["rounds"]
            )
        else:
            assert "no_match_rounds" not in row
    assert e8["summary"]["best_method (T=0.0, chat)"] in ("lookup", "skip")
    assert e8["summary"]["greedy_outputs_match_plain"] is True
    summary = (out / "summary.md").read_text()
    assert "| temperature | category | drafter |" in summary and "`skip`: {method: layer_skip, layers: 1}" in summary


def test_a_forward_based_draft_share_needs_a_draft_model():
    model = scaled_model(TARGET_CONFIG, seed=0)
    with pytest.raises(ValueError, match="needs a draft model, not prompt_lookup"):
        round_seconds(CostTable(1, 1), model, PromptLookup(), 1, 2, 64, share="forwards")
