"""ByteTokenizer, and the tokenizer.json save_model writes for it: same ids, same text."""

from __future__ import annotations

import json

import pytest
import transformers

import specjax
from specjax.io.tokenizer import ByteTokenizer

TEXTS = [
    "hello world",
    "  leading spaces,\ttabs\nand newlines  ",
    "héllo wörld — ünïcode",
    "日本語のテキスト",
    "emoji 🎉👍🏽 and a zero-width joiner 👩‍💻",
    "<bos> special-token text <eos><pad> is plain bytes",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_byte_tokenizer_round_trip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    with_bos = tok.encode(text)  # HF's default: special tokens added
    assert with_bos == [tok.bos_token_id, *ids]
    assert tok.decode([*with_bos, tok.eos_token_id, tok.pad_token_id]) == text


def test_byte_tokenizer_replaces_split_characters():
    tok = ByteTokenizer()
    assert tok.decode(["é".encode()[0], ord("A")]) == "\ufffdA"
    assert tok(["ab", "c"], add_special_tokens=False) == {"input_ids": [[97, 98], [99]]}
    assert tok("ab") == {"input_ids": [256, 97, 98]}
    assert len(tok) == 259


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory):
    model = specjax.init_model(specjax.ModelConfig(num_hidden_layers=1))
    return specjax.save_model(specjax.Model(model.config, model.params, ByteTokenizer()), tmp_path_factory.mktemp("m"))


@pytest.fixture(scope="module")
def hf_tok(saved_dir):
    return transformers.AutoTokenizer.from_pretrained(saved_dir)


def test_saved_tokenizer_files(saved_dir):
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (saved_dir / name).is_file(), name
    config = json.loads((saved_dir / "config.json").read_text())
    assert config["specjax_tokenizer"] == "bytes"
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (256, 257, 258)


def test_auto_tokenizer_has_the_byte_vocabulary(hf_tok):
    byte_tok = ByteTokenizer()
    assert len(hf_tok) == byte_tok.vocab_size
    assert (hf_tok.bos_token_id, hf_tok.eos_token_id, hf_tok.pad_token_id) == (256, 257, 258)
    assert hf_tok.convert_tokens_to_ids(["<bos>", "<eos>", "<pad>"]) == [256, 257, 258]


@pytest.mark.parametrize("text", TEXTS)
def test_auto_tokenizer_matches_byte_tokenizer(hf_tok, text):
    byte_tok = ByteTokenizer()
    for add_special_tokens in (False, True):
        assert hf_tok.encode(text, add_special_tokens=add_special_tokens) == byte_tok.encode(
            text, add_special_tokens=add_special_tokens
        )
    assert hf_tok.encode(text) == byte_tok.encode(text)
    ids = [*byte_tok.encode(text), byte_tok.eos_token_id]
    assert hf_tok.decode(ids, skip_special_tokens=True) == byte_tok.decode(ids) == text


def test_load_model_returns_the_byte_tokenizer(saved_dir):
    assert isinstance(specjax.load_model(saved_dir).tokenizer, ByteTokenizer)


def test_hf_tokenizer_is_loaded_and_saved_with_save_pretrained(saved_dir, tmp_path):
    """Without the specjax marker the files are an ordinary HF tokenizer, and stay one."""
    plain = tmp_path / "plain"
    specjax.save_model(specjax.load_model(saved_dir), plain)
    config = json.loads((plain / "config.json").read_text())
    del config["specjax_tokenizer"]
    (plain / "config.json").write_text(json.dumps(config))

    model = specjax.load_model(plain)
    assert not isinstance(model.tokenizer, ByteTokenizer)
    again = specjax.load_model(specjax.save_model(model, tmp_path / "again"))
    assert "specjax_tokenizer" not in json.loads((tmp_path / "again" / "config.json").read_text())
    for text in TEXTS:
        assert again.tokenizer.encode(text) == ByteTokenizer().encode(text)


def test_byte_decode_keeps_multibyte_characters_around_specials():
    tok = ByteTokenizer()
    ids = [tok.bos_token_id, *"héllo 日本".encode(), tok.eos_token_id]
    assert tok.decode(ids) == "héllo 日本"
    assert tok.decode(ids, skip_special_tokens=False) == "<bos>héllo 日本<eos>"
