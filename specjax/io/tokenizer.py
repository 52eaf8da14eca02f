"""The byte-level tokenizer of specjax's own models, with the interface HF tokenizers have."""

from __future__ import annotations


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
