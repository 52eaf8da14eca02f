"""Tables between two vocabularies, built once on the host from the two tokenizers: what a
draft with another tokenizer needs to draft for a target (drafters/cross_vocab.py).

Every token is read as the bytes it stands for (io/token_bytes.py): a byte-level BPE's
characters mapped back to bytes (GPT-2's alphabet), a SentencePiece "▁" as a space and
<0xHH> as that byte, an added or special token as its text. Special tokens are marked:
a special token matches only a special token with the same text, a plain one only a
plain one.

  draft_to_target [V_draft]  the target id of each draft token whose bytes are exactly one
                             target token's (the intersection), -1 elsewhere (Timor et al.,
                             arXiv 2502.05202, token-level intersection)
  pieces, offsets            CSR: target token t is draft tokens pieces[offsets[t]:offsets[t+1]],
                             the draft tokenizer's encoding of t's bytes (a single draft id for
                             a token in the intersection). Feeding the pieces of each committed
                             target token in turn gives the draft a tokenization of the committed
                             text without re-tokenizing anything inside the loop.
  draft_feed [V_draft]       the draft id fed back after drafting a token: the single piece of its
                             target token (the same draft id unless two draft tokens share bytes)
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from specjax.io.token_bytes import spellings
from specjax.io.tokenizer import ByteTokenizer


@dataclasses.dataclass(frozen=True)
class VocabTables:
    """The host-side tables (module docstring); `arrays()` is what the jitted loop reads."""

    draft_to_target: np.ndarray  # [V_draft] int32, -1 outside the intersection
    draft_feed: np.ndarray  # [V_draft] int32: the draft id fed after drafting this one
    offsets: np.ndarray  # [V_target + 1] int32
    pieces: np.ndarray  # [P] int32 draft ids
    target_names: tuple[str, ...] = ()  # for messages only

    @property
    def intersection(self) -> int:
        """How many target tokens a draft token can stand for."""
        return int(np.unique(self.draft_to_target[self.draft_to_target >= 0]).size)

    @property
    def max_pieces(self) -> int:
        return int(np.diff(self.offsets).max(initial=0))

    def pieces_of(self, target_id: int) -> list[int]:
        return self.pieces[self.offsets[target_id] : self.offsets[target_id + 1]].tolist()

    @functools.cached_property
    def device_arrays(self) -> dict:
        """`arrays()` on the device, made once: the same objects every call (a loop's cache key
        reads the ids of its weights)."""
        import jax.numpy as jnp

        return {k: jnp.asarray(v) for k, v in self.arrays().items()}

    def arrays(self) -> dict[str, np.ndarray]:
        lengths = np.diff(self.offsets).astype(np.int32)
        pieces = self.pieces if self.pieces.size else np.zeros(1, np.int32)  # a gather needs one entry
        return dict(draft_to_target=self.draft_to_target, draft_feed=self.draft_feed, offsets=self.offsets[:-1],
                    lengths=lengths, pieces=pieces)  # fmt: skip


def token_bytes(tokenizer, vocab_size: int) -> tuple[tuple[bytes | None, ...], np.ndarray]:
    """(bytes of each id < vocab_size, None where the tokenizer has no such id; [V] bool: special)."""
    spelled = spellings(tokenizer, vocab_size)
    return spelled.spelled, spelled.special


def build_tables(
    target_tokenizer, target_vocab: int, draft_tokenizer, draft_vocab: int, intersection: bool = True
) -> VocabTables:
    """The tables for a target of `target_vocab` ids drafted by a draft of `draft_vocab` ids.

    intersection=False: only the pieces (UAG proposes through text, never through shared
    tokens: draft_to_target is -1 everywhere and draft_feed the identity).
    ValueError when the intersection is empty (no draft token could ever be proposed; only
    with intersection=True), or when a target token's bytes cannot be written in draft
    tokens at all (a draft vocabulary without those bytes and without an unknown token)."""
    target, target_special = token_bytes(target_tokenizer, target_vocab)
    draft, draft_special = token_bytes(draft_tokenizer, draft_vocab)
    by_bytes: dict[tuple[bool, bytes], int] = {}
    for i, b in enumerate(draft):
        if b is not None and b:
            by_bytes.setdefault((bool(draft_special[i]), b), i)  # the lowest id is canonical
    target_single: dict[int, int] = {}  # target id -> its draft id, for the intersection
    for t, b in enumerate(target):
        d = by_bytes.get((bool(target_special[t]), b)) if b else None
        if d is not None:
            target_single[t] = d
    owner: dict[int, int] = {}  # canonical draft id -> the lowest target id with its bytes
    for t, d in target_single.items():
        owner.setdefault(d, t)
    draft_to_target = np.full(draft_vocab, -1, np.int32)
    for i, b in enumerate(draft):
        if b and intersection:  # draft ids with the same bytes all stand for the same target token
            draft_to_target[i] = owner.get(by_bytes[(bool(draft_special[i]), b)], -1)
    if intersection and not (draft_to_target >= 0).any():
        raise ValueError(
            "the draft and target tokenizers share no token (the token-level intersection is empty): "
            "this draft could never propose a target token"
        )
    encoded = _encode_all(target, target_special, target_single, draft, draft_special, draft_tokenizer)
    names = tuple(repr(b) for b in target)
    for t, pieces in enumerate(encoded):
        if pieces is None:
            raise ValueError(f"target token {t} ({names[t]}) cannot be written in the draft's tokens")
    lengths = np.array([len(p) for p in encoded], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    pieces = np.array([d for p in encoded for d in p], np.int32)
    draft_feed = np.where(draft_to_target >= 0, 0, np.arange(draft_vocab)).astype(np.int32)
    for i in np.flatnonzero(draft_to_target >= 0):
        draft_feed[i] = target_single[int(draft_to_target[i])]
    return VocabTables(draft_to_target, draft_feed, offsets, pieces, names)


def _encode_all(target, target_special, target_single, draft, draft_special, draft_tokenizer):
    """Draft pieces of every target token: the single draft id for one in the intersection;
    else the draft tokenizer's encoding when it spells the same bytes; else a greedy longest
    match over the draft's plain tokens; else the draft's unknown token; else None."""
    out: list[list[int] | None] = [None] * len(target)
    texts, which = [], []
    for t, b in enumerate(target):
        if t in target_single:
            out[t] = [target_single[t]]
        elif b is None or not b:
            out[t] = []
        else:
            try:
                texts.append(b.decode("utf-8"))
                which.append(t)
            except UnicodeDecodeError:
                pass
    if texts:
        for t, ids in zip(which, encode_texts(draft_tokenizer, texts), strict=True):
            spelled = all(0 <= i < len(draft) and draft[i] is not None for i in ids)
            if spelled and b"".join(draft[i] for i in ids) == target[t]:
                out[t] = list(ids)
    plain = {b: i for i, b in reversed(list(enumerate(draft))) if b and not draft_special[i]}
    longest = max((len(b) for b in plain), default=0)
    unknown = getattr(draft_tokenizer, "unk_token_id", None)
    for t, b in enumerate(target):
        if out[t] is None:
            out[t] = _greedy(b, plain, longest)
            if out[t] is None and unknown is not None:
                out[t] = [int(unknown)]
    return out


def encode_texts(tokenizer, texts: list[str]) -> list[list[int]]:
    if isinstance(tokenizer, ByteTokenizer):
        return [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def _greedy(b: bytes, plain: dict[bytes, int], longest: int) -> list[int] | None:
    ids, i = [], 0
    while i < len(b):
        for n in range(min(longest, len(b) - i), 0, -1):
            if b[i : i + n] in plain:
                ids.append(plain[b[i : i + n]])
                i += n
                break
        else:
            return None
    return ids
