"""A draft model with another tokenizer than the target's: universal assisted generation
(UAG; Hugging Face's `AssistedCandidateGeneratorDifferentTokenizers`, "Universal Assisted
Generation", 2024).

The draft proposes freely in its own vocabulary: `draft_length` tokens (K by default) from
its own, unrestricted distribution (argmax when greedy, a sample under sampling), each fed
back but the last. The drafted tokens are spelled as bytes (io/token_bytes.py), cut to
their longest valid UTF-8 prefix (a draft token may end mid-character) and at the first
special draft token, and the text is re-encoded by the target's own tokenizer on the host
(`jax.pure_callback`, inside the jitted loop). The first K target tokens are the
proposal; fewer are padded by repeating the last (a padded slot costs acceptance only). A
special draft token whose text is a special target token's (end of sequence) is proposed
as that token after the text.

The proposal is deterministic given the draft's own draws (q = None): verification accepts
draft d with probability p(d), which is exact whatever produced d (the rule conditions on
d), so no draft distribution over target tokens is needed.

Unlike token-level intersection (drafters/cross_vocab.py) the draft may propose any text,
not only tokens both vocabularies share: two vocabularies with nothing in common work.
The cost is a host round trip per round, and the text is re-encoded alone, without the
committed text before it (a tokenizer that merges across that boundary proposes a split
the target may not choose: acceptance, never exactness).

The draft cache is synced as TLI's (drafters/foreign_draft.py), trusting nothing fed while
drafting: the draft's tokens are its own tokenization, not the pieces of the target tokens
committed, so every round's catch-up feeds the committed target tokens' pieces from where
the last one ended (the `tolerating_lag` scheme of TLI, always).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafters.base import DraftContext, Proposal
from specjax.drafters.foreign_draft import CrossVocabState, ForeignDraft
from specjax.drafters.proposing import draft_chain
from specjax.drafters.vocab_tables import encode_texts, token_bytes
from specjax.io.model import Model
from specjax.models import forward


class Retokenizer:
    """Host side of a round: draft ids -> text -> target ids. Compared by identity (it is part
    of the jit cache key through the drafter); `between` returns the same one for the same
    two tokenizers, so rebuilding a drafter from the same models reuses compiled programs."""

    _made: ClassVar[dict[tuple, Retokenizer]] = {}  # holds the tokenizers too: their ids stay theirs

    def __init__(self, draft_tokenizer, draft_vocab: int, target_tokenizer, target_vocab: int):
        self.draft_tokenizer, self.target_tokenizer = draft_tokenizer, target_tokenizer
        self.target_vocab = target_vocab
        self.spelled, self.special = token_bytes(draft_tokenizer, draft_vocab)
        target, target_special = token_bytes(target_tokenizer, target_vocab)
        self.target_specials = {b: t for t, b in reversed(list(enumerate(target))) if b and target_special[t]}

    @classmethod
    def between(cls, draft_tokenizer, draft_vocab: int, target_tokenizer, target_vocab: int) -> Retokenizer:
        key = (id(draft_tokenizer), draft_vocab, id(target_tokenizer), target_vocab)
        if key not in cls._made:
            cls._made[key] = cls(draft_tokenizer, draft_vocab, target_tokenizer, target_vocab)
        return cls._made[key]

    def text(self, drafts) -> tuple[str, int | None]:
        """The text draft ids [K'] spell (to the first special or unknown id, cut to valid
        UTF-8) and the special target token that ends it (None: none)."""
        chunks, end = [], None
        for d in drafts.tolist():
            b = self.spelled[d] if 0 <= d < len(self.spelled) else None
            if b is None or self.special[d]:
                end = self.target_specials.get(b) if b is not None else None
                break
            chunks.append(b)
        raw = b"".join(chunks)
        try:
            return raw.decode("utf-8"), end
        except UnicodeDecodeError as e:  # cut mid-character: the special no longer follows the text
            return raw[: e.start].decode("utf-8"), None

    def __call__(self, drafts: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """drafts [.., K'] draft ids -> (target ids [.., K] int32, how many are real [..] int32)."""
        drafts = np.asarray(drafts)
        flat = drafts.reshape(-1, drafts.shape[-1])
        spelled = [self.text(row) for row in flat]
        texts = [text for text, _ in spelled]
        encoded = encode_texts(self.target_tokenizer, texts) if any(texts) else [[] for _ in texts]
        ids = np.zeros((len(flat), k), np.int32)
        counts = np.zeros(len(flat), np.int32)
        for i, (row, (_, end)) in enumerate(zip(encoded, spelled, strict=True)):
            row = [*row, end] if end is not None else list(row)
            n = next((j for j, t in enumerate(row) if not 0 <= t < self.target_vocab), len(row))
            row = row[: min(n, k)]
            if row:
                ids[i, : len(row)] = row
                ids[i, len(row) :] = row[-1]  # padding: repeats the last (rejected or not, it is exact)
            counts[i] = len(row)
        return ids.reshape(*drafts.shape[:-1], k), counts.reshape(drafts.shape[:-1])


@dataclasses.dataclass(frozen=True)
class Universal(ForeignDraft):
    """A draft `Model` with its own tokenizer, proposing through text (module docstring).

    `Universal.between(draft, target)` builds it from the two models' tokenizers.
    draft_length: draft tokens drafted per round (0: K; more suits a draft whose tokens are
    shorter than the target's, a byte-level draft for a BPE target). catch_up and
    length_ratio as for CrossVocab (drafters/foreign_draft.py).
    """

    retokenizer: Retokenizer | None = dataclasses.field(default=None, repr=False)  # by identity
    draft_length: int = 0
    name = "uag"
    proposes_shared_tokens = False  # only the pieces: it proposes text, so no shared token is needed
    title = "universal assisted generation"

    @classmethod
    def host_fields(cls, draft: Model, target: Model) -> dict:
        retokenizer = Retokenizer.between(draft.tokenizer, draft.config.vocab_size, target.tokenizer,
                                          target.config.vocab_size)  # fmt: skip
        return {"retokenizer": retokenizer}

    def __post_init__(self):
        super().__post_init__()
        if self.retokenizer is None:
            raise ValueError("Universal needs both tokenizers: build it with Universal.between(draft, target)")
        if not isinstance(self.draft_length, int) or self.draft_length < 0:
            raise ValueError(f"Universal.draft_length must be an integer >= 0 (0: K), got {self.draft_length!r}")

    def drafted(self, k: int) -> int:
        return (self.draft_length or k) - 1  # the last draft is never fed

    def retokenize(self, drafts: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
        """drafts [B, K'] draft ids -> (target ids [B, K] int32, real ones per row [B] int32), on the host."""
        lead = drafts.shape[:-1]
        shapes = (jax.ShapeDtypeStruct((*lead, k), jnp.int32), jax.ShapeDtypeStruct(lead, jnp.int32))
        host = functools.partial(self.retokenizer, k=k)
        return jax.pure_callback(host, shapes, drafts.astype(jnp.int32), vmap_method="expand_dims")

    def propose(self, weights, state: CrossVocabState, ctx: DraftContext, key):
        params, tables = weights
        k = ctx.num_speculative_tokens
        logits, cache, synced = self.catch_up_to(params, tables, state, ctx)

        def advance(carry, token):  # [B] draft ids, fed as themselves
            cache, position = carry
            out, cache = forward(self.config, params, token[:, None], position[:, None], cache)
            return out[:, 0].astype(jnp.float32), (cache, position + 1)

        # No grammar mask: it constrains target tokens, and the target's masked p rejects the rest.
        drafted, (fed_cache, _) = draft_chain(advance, (cache, cache.lengths), logits, key, self.draft_length or k,
                                              ctx.sampling)  # fmt: skip
        tokens, counts = self.retokenize(drafted.tokens, k)
        # Nothing fed while drafting is trusted: the next catch-up feeds the committed tokens.
        state = CrossVocabState(cache=fed_cache.replace(lengths=cache.lengths), synced=synced, fed=state.fed)
        return self.proposal(tokens, counts), state

    def proposal(self, tokens: jax.Array, counts: jax.Array) -> Proposal:
        """tokens [B, K] target ids, counts [B]: deterministic given the draft's draws (q = None)."""
        return Proposal(tokens=tokens, q=None, found=counts > 0)
