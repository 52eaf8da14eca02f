"""The tokenizer of a GGUF file, built without torch (specjax/io/gguf_tokenizer.py), against
transformers' own GGUF route (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`, which
imports torch): the same `tokenizers` backend (its JSON, byte for byte), special tokens,
ids, decoding and chat template. Byte-level BPE files are covered in tests/test_gguf.py, on
every tiny model there, and here on the real SmolLM2 file; here also a sentencepiece
('llama') vocabulary, and the route an older transformers takes.
"""

from __future__ import annotations

import sys

import gguf
import numpy as np
import pytest

from specjax.io import gguf_tokenizer as gt
from specjax.io.gguf_file import packaged_path

CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
TEXTS = (
    "the thin hen in the tent",
    " leading space,  two spaces\tand a tab\n\nnewlines",
    "naïve café 日本語 🙂 12345",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>x<s>y</s>",
    "def f(x):\n    return x  # comment",
)


def assert_same_tokenizer(ours, theirs) -> None:
    """Equal as far as anything can observe: backend JSON, special tokens, encoding (with and
    without specials), decoding, and the chat template, rendered and tokenized."""
    assert ours.backend_tokenizer.to_str() == theirs.backend_tokenizer.to_str()
    assert ours.special_tokens_map == theirs.special_tokens_map
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "all_special_ids"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert len(ours) == len(theirs) and ours.get_vocab() == theirs.get_vocab()
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == theirs.encode(text), text
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    assert ours.chat_template == theirs.chat_template
    chat = [{"role": "user", "content": TEXTS[0]}, {"role": "assistant", "content": TEXTS[2]}]
    for tokenize in (False, True):
        ours_chat = ours.apply_chat_template(chat, add_generation_prompt=True, tokenize=tokenize)
        assert ours_chat == theirs.apply_chat_template(chat, add_generation_prompt=True, tokenize=tokenize)


def _transformers_tokenizer(path):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def write_sentencepiece_gguf(path):
    """A Llama file with a sentencepiece ('llama') vocabulary: byte tokens, scored pieces, no
    merges (transformers derives them from the scores) and no add_bos flag (so BOS is added,
    as llama.cpp does). Metadata and one tensor: enough for both tokenizer routes."""
    pieces = ["▁", "t", "h", "e", "i", "n", "▁t", "he", "▁the", "in", "▁in"]
    tokens = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], *pieces]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)  # unknown, control, byte, normal
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(pieces))])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_chat_template(CHAT_TEMPLATE)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def sentencepiece_file(tmp_path_factory):
    return write_sentencepiece_gguf(tmp_path_factory.mktemp("spm") / "m.gguf")


def test_sentencepiece_vocabulary_matches_transformers(sentencepiece_file):
    ours = gt.gguf_tokenizer(sentencepiece_file)
    assert_same_tokenizer(ours, _transformers_tokenizer(sentencepiece_file))
    assert ours.encode("the")[0] == 1  # BOS, which the file does not ask for


def test_smollm2_tokenizer_matches_transformers():
    """The real SmolLM2 file (49k tokens and merges, ChatML template, bos 1 / eos 2 / pad 2)."""
    path = packaged_path("smollm2-135m-instruct")
    ours = gt.gguf_tokenizer(path)
    assert_same_tokenizer(ours, _transformers_tokenizer(path))
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (1, 2, 2)
    assert "<|im_start|>assistant" in ours.chat_template


def test_an_older_transformers_takes_its_own_route_which_needs_torch(sentencepiece_file, monkeypatch):
    """Without transformers' torch-free converter (transformers < 5.17), transformers' own
    route builds the same tokenizer with torch, and without torch the error names the fix."""
    monkeypatch.setattr(gt, "_converter", lambda: None)
    assert_same_tokenizer(gt.gguf_tokenizer(sentencepiece_file), _transformers_tokenizer(sentencepiece_file))
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails, as when not installed
    with pytest.raises(ValueError, match=r"needs torch; upgrade transformers .*or install torch"):
        gt.gguf_tokenizer(sentencepiece_file)


def test_a_file_without_a_tokenizer_has_none(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert gt.gguf_tokenizer(tmp_path / "m.gguf") is None
