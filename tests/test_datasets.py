"""User datasets (specjax/training/datasets.py): formats, assistant-only loss masks checked
against the chat template's rendering, bad-record reports, splits, and batches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specjax.io.tokenizer import ByteTokenizer
from specjax.training import datasets
from specjax.training.data import SPLITS
from specjax.training.dataset_records import detect_format
from specjax.training.datasets import DatasetConfig

# SmolLM2-Instruct's ChatML template (a default system turn when the chat has none), plus the
# check many templates make that a system message comes first.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('a system message must come first') }}{% endif %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SENTENCES = [
    "What is a list? A list holds items in order.",
    "And a tuple? A tuple cannot change once it is made.",
    "You answer briefly and you answer well.",
    "The quick brown fox jumps over the lazy dog.",
]
TURN_END = "<|im_end|>"
GENERATION_PROMPT = "<|im_start|>assistant\n"


def make_tokenizer(chat_template: str):
    """A tiny byte-level BPE with ChatML specials and `chat_template` (EOS = <|im_end|>, as in
    SmolLM2-Instruct; PAD a token of its own, so padding is told apart from EOS)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", TURN_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SENTENCES, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=TURN_END, pad_token="<|endoftext|>")
    hf.chat_template = chat_template
    return hf


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer(CHATML_TEMPLATE)


def write_jsonl(path, rows) -> str:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


SYSTEM = {"role": "system", "content": "You answer briefly."}
CHAT = [
    {"role": "user", "content": "What is a list?"},
    {"role": "assistant", "content": "A list holds items in order."},
    {"role": "user", "content": "And a tuple?"},
    {"role": "assistant", "content": "A tuple cannot change once it is made."},
]
SHAREGPT = {"user": "human", "assistant": "gpt", "system": "system"}


def as_record(fmt: str, messages: list[dict]) -> dict:
    if fmt == "messages":
        return {"messages": messages}
    if fmt == "conversations":
        return {"conversations": [{"from": SHAREGPT[m["role"]], "value": m["content"]} for m in messages]}
    system = [m["content"] for m in messages if m["role"] == "system"]
    user, assistant = (m["content"] for m in messages if m["role"] != "system")
    return {"prompt": user, "response": assistant, **({"system": system[0]} if system else {})}


def expected_mask(tokenizer, messages: list[dict]) -> np.ndarray:
    """The tokens of each assistant turn's text and its <|im_end|>, found by character offsets in
    the template's rendering of the whole chat (independent of the prefix rendering under test)."""
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    spans, at = [], 0
    for m in messages:
        if m["role"] == "assistant":
            start = full.index(GENERATION_PROMPT + m["content"] + TURN_END, at) + len(GENERATION_PROMPT)
            at = start + len(m["content"] + TURN_END)
            spans.append((start, at))
    return np.array([any(s <= a and b <= e for s, e in spans) for a, b in encoded["offset_mapping"]])


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    return list(zip(edges[::2], edges[1::2], strict=True))


CHATS = {
    "messages": [[SYSTEM, *CHAT], CHAT, CHAT[:2]],
    "conversations": [[SYSTEM, *CHAT], CHAT],
    "prompt_response": [[SYSTEM, *CHAT[:2]], CHAT[2:4]],
}


@pytest.mark.parametrize("fmt", list(CHATS))
def test_masks_cover_exactly_the_assistant_turns(tokenizer, tmp_path, fmt):
    chats = CHATS[fmt]
    path = write_jsonl(tmp_path / "chats.jsonl", [as_record(fmt, chat) for chat in chats])
    loaded = datasets.load_dataset(DatasetConfig(path=path, seq_len=16), tokenizer)
    assert loaded.report.format == fmt and not loaded.report.bad
    assert [r.line for r in loaded.records] == list(range(1, len(chats) + 1))
    for record, chat in zip(loaded.records, chats, strict=True):
        full = tokenizer.apply_chat_template(chat, tokenize=False)
        assert record.ids.tolist() == tokenizer.encode(full, add_special_tokens=False)
        np.testing.assert_array_equal(record.mask, expected_mask(tokenizer, chat))
        # Each masked run decodes to one assistant turn and its end-of-turn token, in order;
        # ChatML's newline after <|im_end|> and the next turn's header are not trained on.
        answers = [m["content"] + TURN_END for m in chat if m["role"] == "assistant"]
        decoded = [tokenizer.decode(record.ids[a:b], skip_special_tokens=False) for a, b in runs(record.mask)]
        assert decoded == answers
        assert record.prompt == tokenizer.apply_chat_template(chat[:-1], tokenize=False, add_generation_prompt=True)


def test_two_turn_chat_mask_positions(tokenizer, tmp_path):
    """The exact spans, not only their text: two turns, each ending at <|im_end|>."""
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [SYSTEM, *CHAT]}])
    (record,) = datasets.load_dataset(DatasetConfig(path=path, seq_len=16), tokenizer).records
    end = tokenizer.convert_tokens_to_ids(TURN_END)
    ends = np.flatnonzero(record.ids == end)  # system, user, assistant, user, assistant
    assert len(ends) == 5
    (a0, b0), (a1, b1) = runs(record.mask)
    assert (b0 - 1, b1 - 1) == (ends[2], ends[4])
    for start, chat in ((a0, [SYSTEM, CHAT[0]]), (a1, [SYSTEM, *CHAT[:3]])):
        prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        assert start == len(prompt_ids) and record.ids[:start].tolist() == prompt_ids
    assert record.ids[b1:].tolist() == tokenizer.encode("\n", add_special_tokens=False)


def test_bad_records_are_reported_by_line(tokenizer, tmp_path):
    good = {"messages": CHAT}
    rows = [
        good,  # 1
        "{not json",  # 2
        "[1, 2]",  # 3
        {"text": "a document in a chat file"},  # 4
        {"messages": [{"role": "narrator", "content": "42"}, *CHAT[:2]]},  # 5
        {"messages": [CHAT[0], {"role": "assistant", "content": "  "}]},  # 6
        {"messages": [CHAT[0]]},  # 7
        "",  # 8: blank, not a record
        {"messages": [*CHAT[:2], SYSTEM, *CHAT[2:]]},  # 9: the template raises
        {"messages": [{"role": "assistant", "content": "Hello."}, *CHAT]},  # 10
        {"messages": [{"role": "user", "content": None}, CHAT[1]]},  # 11
        good,  # 12
        "{}}",  # 13
    ]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    report = datasets.dataset_report(DatasetConfig(path=path, seq_len=16), tokenizer)
    assert report.format == "messages" and report.records == 12
    assert report.bad == {
        "invalid_json": 2,
        "not_an_object": 1,
        "missing_field": 1,
        "unknown_role": 1,
        "empty_text": 1,
        "no_assistant_turn": 1,
        "template_error": 1,
        "assistant_first": 1,
        "invalid_message": 1,
    }
    assert report.bad_lines == {
        "invalid_json": (2, 13),
        "not_an_object": (3,),
        "missing_field": (4,),
        "unknown_role": (5,),
        "empty_text": (6,),
        "no_assistant_turn": (7,),
        "template_error": (9,),
        "assistant_first": (10,),
        "invalid_message": (11,),
    }
    assert "a system message must come first" in report.bad_details["template_error"]
    assert "'narrator'" in report.bad_details["unknown_role"]
    assert sum(report.used.values()) == 2
    assert [r.line for r in datasets.load_dataset(DatasetConfig(path=path), tokenizer).records] == [1, 12]
    assert "template_error: 1 (lines [9]" in report.summary()
    short = datasets.dataset_report(DatasetConfig(path=path, report_lines=1), tokenizer)
    assert short.bad["invalid_json"] == 2 and short.bad_lines["invalid_json"] == (2,)


def test_openai_list_of_parts_content_is_read_as_its_joined_text(tokenizer, tmp_path):
    def parts(message, cut):
        text = message["content"]
        return {**message, "content": [{"type": "text", "text": text[:cut]}, {"type": "text", "text": text[cut:]}]}

    as_parts = [parts(m, 3) for m in CHAT]
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}}]}
    rows = [{"messages": CHAT}, {"messages": as_parts}, {"messages": [image, *CHAT[1:]]}]
    loaded = datasets.load_dataset(DatasetConfig(path=write_jsonl(tmp_path / "p.jsonl", rows), seq_len=16), tokenizer)
    assert [r.line for r in loaded.records] == [1, 2] and loaded.report.bad_lines == {"invalid_message": (3,)}
    plain, joined = loaded.records
    assert joined.ids.tolist() == plain.ids.tolist() and joined.mask.tolist() == plain.mask.tolist()


def test_a_template_that_rewrites_earlier_turns_is_reported(tmp_path):
    """Like Qwen3's, which renders an empty <think></think> into the last assistant turn only:
    the chat through the first answer is then no prefix of the whole chat."""
    thinking = CHATML_TEMPLATE.replace(
        "'\\n' + message['content']",
        "'\\n' + ('<think></think>' if message['role'] == 'assistant' and loop.last else '') + message['content']",
    )
    assert thinking != CHATML_TEMPLATE
    rows = [{"messages": CHAT}, {"messages": CHAT[:2]}]
    path = write_jsonl(tmp_path / "chats.jsonl", rows)
    tok = make_tokenizer(thinking)
    loaded = datasets.load_dataset(DatasetConfig(path=path), tok)
    assert loaded.report.bad == {"template_not_prefix_stable": 1}
    assert loaded.report.bad_lines == {"template_not_prefix_stable": (1,)}
    (record,) = loaded.records  # one assistant turn: stable, and <think></think> is trained on
    ((a, b),) = runs(record.mask)
    assert record.line == 2
    assert tok.decode(record.ids[a:b], skip_special_tokens=False) == "<think></think>" + CHAT[1]["content"] + TURN_END


def test_file_without_usable_records_is_an_error(tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "broken.jsonl", [{"messages": CHAT[:1]}, "{oops", {"messages": []}])
    with pytest.raises(ValueError, match=r"broken\.jsonl: no usable record") as error:
        datasets.load_dataset(DatasetConfig(path=path), tokenizer)
    for reason in ("no_assistant_turn: 1 (lines [1]", "invalid_json: 1 (lines [2]", "missing_field: 1 (lines [3]"):
        assert reason in str(error.value)
    with pytest.raises(ValueError, match="does not exist"):
        datasets.load_dataset(DatasetConfig(path=str(tmp_path / "missing.jsonl")), tokenizer)
    with pytest.raises(ValueError, match="cannot tell the format"):
        datasets.load_dataset(DatasetConfig(path=write_jsonl(tmp_path / "odd.jsonl", [{"body": "x"}])), tokenizer)


def test_byte_tokenizer_reads_text_but_not_chats(tmp_path):
    texts = ["héllo world", "second document"]
    path = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in texts])
    loaded = datasets.load_dataset(DatasetConfig(path=path, seq_len=8), ByteTokenizer())
    for record, text in zip(loaded.records, texts, strict=True):
        assert record.ids.tolist() == [256, *text.encode("utf-8"), 257]  # <bos> bytes <eos>
        assert record.mask.all()
    chats = write_jsonl(tmp_path / "chats.jsonl", [{"messages": CHAT}])
    with pytest.raises(ValueError, match="no chat template"):
        datasets.load_dataset(DatasetConfig(path=chats), ByteTokenizer())


def qa_records(count: int, answer: str = "It is {i} times {i}.") -> list[dict]:
    return [{"prompt": f"What is {i} squared?", "response": answer.format(i=i)} for i in range(count)]


def test_split_is_deterministic_and_stable_under_reordering(tokenizer, tmp_path):
    def splits(path, fmt="auto") -> dict[str, str]:
        loaded = datasets.load_dataset(DatasetConfig(path=path, format=fmt), tokenizer)
        lines = Path(path).read_text().splitlines()
        prompts = {}
        for r in loaded.records:
            obj = json.loads(lines[r.line - 1])
            prompts[obj["prompt"] if "prompt" in obj else obj["messages"][0]["content"]] = r.split
        return prompts

    rows = qa_records(300)
    first = splits(write_jsonl(tmp_path / "a.jsonl", rows))
    counts = {s: list(first.values()).count(s) for s in SPLITS}
    assert counts["train"] > 240 and counts["validation"] > 0 and counts["test"] > 0
    # Reordered, answers regenerated, and as OpenAI messages instead: every prompt keeps its split.
    order = np.random.default_rng(0).permutation(len(rows))
    regenerated = qa_records(300, answer="The square of {i}.")
    moved = [{"messages": [{"role": "user", "content": regenerated[i]["prompt"]}, CHAT[1]]} for i in order]
    assert splits(write_jsonl(tmp_path / "b.jsonl", moved)) == first
    assert splits(write_jsonl(tmp_path / "c.jsonl", rows[::-1])) == first


@pytest.mark.parametrize("pack", [True, False])
def test_batches_are_a_pure_function_of_seed_and_step(tokenizer, tmp_path, pack):
    path = write_jsonl(tmp_path / "qa.jsonl", qa_records(120))
    config = DatasetConfig(path=path, seq_len=16, batch_size=8, pack=pack)
    tokens, mask = datasets.dataset_batch(config, tokenizer, seed=0, step=5)
    assert tokens.shape == mask.shape == (8, 17) and tokens.dtype == np.int32 and mask.dtype == bool
    again = datasets.dataset_batch(config, tokenizer, seed=0, step=5)
    np.testing.assert_array_equal(tokens, again[0])
    np.testing.assert_array_equal(mask, again[1])
    assert not np.array_equal(tokens, datasets.dataset_batch(config, tokenizer, seed=0, step=6)[0])
    assert not np.array_equal(tokens, datasets.dataset_batch(config, tokenizer, seed=1, step=5)[0])
    # A fresh process (empty caches) sees the same batch: resume after a kill is exact.
    datasets._load.cache_clear()
    datasets._examples.cache_clear()
    datasets._epoch_order.cache_clear()
    np.testing.assert_array_equal(tokens, datasets.dataset_batch(config, tokenizer, seed=0, step=5)[0])
    # One epoch of batches holds every training example exactly once.
    examples, example_mask = datasets.dataset_examples(config, tokenizer, "train")
    steps = -(-len(examples) // 8)
    drawn = np.concatenate([datasets.dataset_batch(config, tokenizer, 0, s)[0] for s in range(steps)])
    assert sorted(map(tuple, drawn[: len(examples)].tolist())) == sorted(map(tuple, examples.tolist()))
    assert example_mask[:, 1:].any(axis=1).all()  # every example has a target
    assert not example_mask[examples == tokenizer.pad_token_id].any()


def test_packed_windows_overlap_by_one_and_keep_every_token(tokenizer, tmp_path):
    texts = [" ".join(SENTENCES[: 1 + i % 4]) + f" number {i}" for i in range(40)]
    path = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in texts])
    config = DatasetConfig(path=path, seq_len=8, batch_size=2)
    loaded = datasets.load_dataset(config, tokenizer)
    train = [r for r in loaded.records if r.split == "train"]
    tokens, mask = datasets.dataset_examples(config, tokenizer, "train")
    np.testing.assert_array_equal(tokens[1:, 0], tokens[:-1, -1])
    stream, stream_mask = (
        np.concatenate([tokens[0], tokens[1:, 1:].ravel()]),
        np.concatenate([mask[0], mask[1:, 1:].ravel()]),
    )
    real = np.concatenate([r.ids for r in train])
    np.testing.assert_array_equal(stream[: len(real)], real)
    assert stream_mask[: len(real)].all() and not stream_mask[len(real) :].any()
    assert (stream[len(real) :] == tokenizer.pad_token_id).all() and len(stream) - len(real) < 8
    eos = tokenizer.eos_token_id
    assert all(
        r.ids[-1] == eos and r.ids.tolist() == [*tokenizer.encode(t), eos]
        for r, t in zip(loaded.records, texts, strict=True)
    )


def test_plain_text_and_text_jsonl_train_on_every_real_token(tokenizer, tmp_path):
    paragraphs = ["The quick brown fox.", "It jumps over\nthe lazy dog.", "A list holds items."]
    plain = tmp_path / "notes.txt"
    plain.write_text("\n" + "\n\n\n".join(paragraphs) + "\n")
    jsonl = write_jsonl(tmp_path / "docs.jsonl", [{"text": p} for p in paragraphs])
    for path, lines in ((str(plain), [2, 5, 9]), (jsonl, [1, 2, 3])):
        config = DatasetConfig(path=path, seq_len=40, pack=False, plain_chunk_chars=1)
        loaded = datasets.load_dataset(config, tokenizer)
        assert [r.line for r in loaded.records] == lines
        for record, text in zip(loaded.records, paragraphs, strict=True):
            assert record.ids.tolist() == [*tokenizer.encode(text), tokenizer.eos_token_id]
            assert record.mask.all()
        for split in {r.split for r in loaded.records}:
            tokens, mask = datasets.dataset_examples(config, tokenizer, split)
            lengths = [len(r.ids) for r in loaded.records if r.split == split]
            np.testing.assert_array_equal(mask, np.arange(41)[None, :] < np.array(lengths)[:, None])
            assert (tokens[~mask] == tokenizer.pad_token_id).all()
    # Grouped paragraphs: one document, and a long document is cut into overlapping rows.
    grouped = datasets.load_dataset(DatasetConfig(path=str(plain), plain_chunk_chars=1000), tokenizer)
    (record,) = grouped.records
    assert tokenizer.decode(record.ids, skip_special_tokens=True) == "\n\n".join(paragraphs)
    config = DatasetConfig(path=str(plain), seq_len=8, pack=False)
    tokens, mask = datasets.dataset_examples(config, tokenizer, record.split)
    assert len(tokens) == -(-(len(record.ids) - 1) // 8)
    np.testing.assert_array_equal(tokens[0], record.ids[:9])
    np.testing.assert_array_equal(tokens[1, 0], record.ids[8])


def test_held_out_chat_prompts_come_from_the_validation_split(tokenizer, tmp_path):
    rows = qa_records(300)
    config = DatasetConfig(path=write_jsonl(tmp_path / "qa.jsonl", rows))
    loaded = datasets.load_dataset(config, tokenizer)
    validation = [rows[r.line - 1] for r in loaded.records if r.split == "validation"]
    expected = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}], tokenize=False, add_generation_prompt=True
        )
        for row in validation
    ]
    assert datasets.held_out_chat_prompts(config, tokenizer) == expected
    assert datasets.held_out_chat_prompts(config, tokenizer, count=2) == expected[:2]
    assert all(p.endswith(GENERATION_PROMPT) for p in expected) and len(expected) > 3
    text = DatasetConfig(path=write_jsonl(tmp_path / "docs.jsonl", [{"text": "hello"}]))
    with pytest.raises(ValueError, match="not chats"):
        datasets.held_out_chat_prompts(text, tokenizer)


def test_cache_is_per_file_version_and_tokenizer(tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", [{"text": "hello world"}])
    config = DatasetConfig(path=path)
    first = datasets.load_dataset(config, tokenizer)
    assert datasets.load_dataset(config, tokenizer) is first
    assert datasets.load_dataset(DatasetConfig(path=path, seq_len=8), tokenizer) is first  # windows only
    write_jsonl(tmp_path / "docs.jsonl", [{"text": "hello there world"}])
    edited = datasets.load_dataset(config, tokenizer)
    assert edited is not first and len(edited.records[0].ids) != len(first.records[0].ids)
    assert datasets.load_dataset(config, ByteTokenizer()).records[0].ids[0] == 256
    assert datasets.load_dataset(config, ByteTokenizer()) is datasets.load_dataset(config, ByteTokenizer())


def test_xz_compressed_file_reads_as_its_contents(tokenizer, tmp_path):
    """The committed training snapshots are `.jsonl.xz`: read in place, same records."""
    import lzma

    plain = write_jsonl(tmp_path / "chats.jsonl", [{"messages": CHAT}, {"messages": [SYSTEM, *CHAT]}])
    packed = tmp_path / "chats.jsonl.xz"
    packed.write_bytes(lzma.compress(Path(plain).read_bytes()))
    assert detect_format(packed) == "messages"
    a = datasets.load_dataset(DatasetConfig(path=plain, seq_len=16), tokenizer)
    b = datasets.load_dataset(DatasetConfig(path=str(packed), seq_len=16), tokenizer)
    assert len(b.records) == 2 and not b.report.bad
    for x, y in zip(a.records, b.records, strict=True):
        assert x.ids.tolist() == y.ids.tolist() and x.mask.tolist() == y.mask.tolist()


def test_format_detection_and_override(tmp_path):
    cases = {
        "messages": {"messages": CHAT},
        "conversations": {"conversations": []},
        "prompt_response": {"prompt": "p", "response": "r"},
        "text": {"text": "t"},
    }
    for fmt, row in cases.items():
        assert detect_format(write_jsonl(tmp_path / f"{fmt}.jsonl", ["{bad", row])) == fmt  # the bad line skipped
    assert detect_format(write_jsonl(tmp_path / "e.txt", [{"text": "t"}])) == "plain"
    assert detect_format(write_jsonl(tmp_path / "f.data", ["plain words", {"text": "t"}])) == "plain"
    pretty = tmp_path / "h.json"  # a JSON array, not JSONL: an error, never plain text
    pretty.write_text(json.dumps([{"text": "t"}], indent=2))
    with pytest.raises(ValueError, match="no line holds a JSON object"):
        detect_format(pretty)
    lines = write_jsonl(tmp_path / "g.jsonl", [{"text": "one"}, {"text": "two"}])
    loaded = datasets.load_dataset(DatasetConfig(path=lines, format="plain"), ByteTokenizer())
    assert (
        loaded.report.format == "plain"
        and bytes(loaded.records[0].ids[1:-1].tolist()).decode() == '{"text": "one"}\n{"text": "two"}'
    )


def test_bad_dataset_config():
    for kwargs, match in (
        ({"format": "yaml"}, "format"),
        ({"seq_len": 1}, "seq_len"),
        ({"batch_size": 0}, "batch_size"),
        ({"plain_chunk_chars": 0}, "plain_chunk_chars"),
    ):
        with pytest.raises(ValueError, match=match):
            DatasetConfig(path="x.jsonl", **kwargs)
    with pytest.raises(ValueError, match="path"):
        DatasetConfig(path="")
