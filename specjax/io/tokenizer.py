"""The byte-level tokenizer of specjax's own models, with the interface HF tokenizers have,
and the tokenizer files of a Hugging Face model directory (`load_tokenizer`,
`save_byte_tokenizer`: a ByteTokenizer saved as files transformers loads)."""

from __future__ import annotations

import json
from pathlib import Path

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
BYTE_TOKENIZER_KEY = "specjax_tokenizer"  # config.json marker: the model uses specjax's ByteTokenizer
_BYTE_SPECIALS = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}


class ByteTokenizer:
    """UTF-8 bytes 0..255 plus BOS (256), EOS (257) and PAD (258): 259 ids, nothing unknown.

    Mirrors the part of `transformers.PreTrainedTokenizer` that specjax uses (`encode`,
    `decode`, `__call__`, the special-token ids), so code never asks which one it has.
    Like HF tokenizers, `encode` prepends <bos> unless add_special_tokens=False; the
    models saw <bos> at the start of every training document.
    """

    bos_token_id = 256
    eos_token_id = 257
    pad_token_id = 258
    vocab_size = 259

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        # Runs of bytes are decoded together (a character may span several bytes), with
        # errors replaced: a continuation may stop in the middle of a character.
        names = {256: "<bos>", 257: "<eos>", 258: "<pad>"}
        pieces, run = [], bytearray()
        for i in (int(i) for i in ids):
            if i < 256:
                run.append(i)
                continue
            pieces.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            if not skip_special_tokens:
                pieces.append(names[i])
        pieces.append(run.decode("utf-8", errors="replace"))
        return "".join(pieces)

    def __call__(self, text: str | list[str], add_special_tokens: bool = True) -> dict:
        if isinstance(text, str):
            return {"input_ids": self.encode(text, add_special_tokens)}
        return {"input_ids": [self.encode(t, add_special_tokens) for t in text]}

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=259)"


def load_tokenizer(directory: Path, hf: dict):
    """The tokenizer of the model directory whose config.json is `hf`: a ByteTokenizer when
    config.json says so, an HF AutoTokenizer when the directory has tokenizer files, else None."""
    marker = hf.get(BYTE_TOKENIZER_KEY)
    if marker is not None:
        if marker != "bytes":
            raise ValueError(f"{directory / 'config.json'}: unknown {BYTE_TOKENIZER_KEY} {marker!r} (known: 'bytes')")
        return ByteTokenizer()
    if not any((directory / name).is_file() for name in _TOKENIZER_FILES):
        return None
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(directory))


def _byte_level_chars() -> list[str]:
    """The printable stand-in character of each byte 0..255 (GPT-2's byte-level alphabet)."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    stand_ins = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(stand_ins)) for b in range(256)]


def save_byte_tokenizer(out_dir: str | Path, max_length: int) -> None:
    """Write tokenizer files that transformers' AutoTokenizer loads as a copy of ByteTokenizer.

    A BPE over the 256 byte characters with no merges gives one id per byte, in byte
    order; the specials take 256..258. `add_special_tokens=True` prepends <bos>, as
    ByteTokenizer does, and special-token text in the input is encoded as plain bytes.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    byte_tok = ByteTokenizer()
    vocab = {c: i for i, c in enumerate(_byte_level_chars())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in _BYTE_SPECIALS.values()])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", byte_tok.bos_token_id)]
    )
    assert [tok.token_to_id(s) for s in _BYTE_SPECIALS.values()] == [256, 257, 258], "special ids drifted"
    out = Path(out_dir)
    tok.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        # The class name both transformers 4.x and 5.x resolve to their tokenizers-backed class.
        "tokenizer_class": "PreTrainedTokenizerFast",
        **_BYTE_SPECIALS,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": True,
        "model_max_length": max_length,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(_BYTE_SPECIALS, indent=2) + "\n")
