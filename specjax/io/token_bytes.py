"""The bytes each token id spells: what a grammar constrains (specjax/constraints) and what two
vocabularies share (drafters/vocab_tables.py) are both questions about bytes, not ids.

Three tokenizer families:

- specjax's ByteTokenizer: id i < 256 is the byte i; 256-258 are BOS, EOS and PAD (special).
- byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen): token strings stand for bytes through
  GPT-2's printable alphabet (io/tokenizer.py `_byte_level_chars`), mapped back here.
- SentencePiece style (Llama 2, Gemma): "▁" is a space and `<0xNN>` byte-fallback tokens are
  the byte NN; other strings are their UTF-8.

Added tokens are their text (they are stored as plain text, not in the byte-level alphabet);
special ones (BOS, chat markers, padding) are flagged, so a caller can drop them (a grammar
never allows them) or match them only with each other (a cross-vocabulary table).
Done once per tokenizer (SmolLM2's 49,152 tokens: tens of milliseconds).
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np

from specjax.io.tokenizer import ByteTokenizer, _byte_level_chars

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_BYTE_NAMES = {256: b"<bos>", 257: b"<eos>", 258: b"<pad>"}


@dataclasses.dataclass(frozen=True)
class Spellings:
    """[V] the bytes of each id (None: an id the tokenizer does not have, e.g. a model's padded
    embedding rows) and [V] bool: the id is a special token."""

    spelled: tuple[bytes | None, ...]
    special: np.ndarray


def spellings(tokenizer, vocab_size: int) -> Spellings:
    """The bytes of ids 0..vocab_size-1 of `tokenizer` (a ByteTokenizer or a transformers one)."""
    special = np.zeros(vocab_size, bool)
    if isinstance(tokenizer, ByteTokenizer):
        out: list[bytes | None] = [bytes([i]) for i in range(min(256, vocab_size))]
        out += [_BYTE_NAMES.get(i) for i in range(256, vocab_size)]
        special[256 : min(259, vocab_size)] = True
        return Spellings(tuple(out), special)
    if not hasattr(tokenizer, "convert_ids_to_tokens"):
        raise ValueError(f"cannot read the token strings of tokenizer {type(tokenizer).__name__}")
    n = min(vocab_size, len(tokenizer))
    names = tokenizer.convert_ids_to_tokens(list(range(n)))
    added = {int(i): t for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    special_ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
    style = _decoder_style(tokenizer)
    inverse = {c: b for b, c in enumerate(_byte_level_chars())}
    out = []
    for i, name in enumerate(names):
        special[i] = i in special_ids or bool(getattr(added.get(i), "special", False))
        if name is None:
            out.append(None)
        elif i in added:
            out.append(str(getattr(added[i], "content", added[i])).encode("utf-8"))
        elif style == "byte_level" and all(c in inverse for c in name):
            out.append(bytes(inverse[c] for c in name))
        elif style == "metaspace":
            fallback = _BYTE_FALLBACK.fullmatch(name)
            out.append(bytes([int(fallback.group(1), 16)]) if fallback else name.replace("\u2581", " ").encode())
        else:
            out.append(name.encode("utf-8"))
    return Spellings(tuple(out) + (None,) * (vocab_size - n), special)


def _decoder_style(tokenizer) -> str:
    """ "byte_level" (GPT-2 style), "metaspace" (SentencePiece style) or "plain"."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return "byte_level" if hasattr(tokenizer, "byte_decoder") else "metaspace"
    decoder = json.dumps(json.loads(backend.to_str()).get("decoder"))
    if "ByteLevel" in decoder:
        return "byte_level"
    return "metaspace" if ("Metaspace" in decoder or "\\u2581" in decoder or "ByteFallback" in decoder) else "plain"
