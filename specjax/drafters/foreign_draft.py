"""What every draft with another tokenizer than the target's shares: a draft KV cache kept
in draft-token positions, synced to the committed target tokens by feeding their pieces.

Token-level intersection (drafters/cross_vocab.py) and universal assisted generation
(drafters/universal.py) differ in how they propose; both keep the draft in sync the same
way. The draft cache holds the pieces (the draft's encoding of each target token's bytes,
drafters/vocab_tables.py) of the committed target tokens [0, synced) at draft slots
[0, cache.lengths). Each round's catch-up (`feed_pieces`) feeds the pieces of target tokens
[synced, L) in forwards of `width` draft tokens (a while loop: one forward in the steady
state, more after plain steps of adaptive speculation or a long token); the last fed
piece's logits give the first draft. Chunks may split a token's pieces (a carried piece
offset), so no width depends on the longest token. Slots of a chunk past a row's pieces
take garbage at positions after its last valid one: no valid query sees them and the next
write overwrites them.

The draft cache has min(`length_ratio`, the longest token's pieces) draft slots per target
slot (+ one chunk and the drafts of a round). A row whose text needs more (a byte-level
draft on text of long tokens) overflows it: writes past the end are dropped and its drafts
degrade, which costs acceptance, never exactness.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from specjax.drafters.base import DraftContext, Drafter
from specjax.drafters.vocab_tables import VocabTables, build_tables
from specjax.io.model import Model
from specjax.models import KVCache, ModelConfig, forward, init_cache

PREFILL_CHUNK = 256  # draft tokens per forward when init feeds the prompt


@struct.dataclass
class CrossVocabState:
    cache: KVCache  # [layers, B, S_draft, n_kv, d_head]; lengths: draft slots of committed pieces
    synced: jax.Array  # [B] int32: target tokens whose pieces fill cache slots [0, cache.lengths)
    fed: jax.Array  # [B] int32: drafts fed past cache.lengths by the last propose (0 after update)


def feed_pieces(config: ModelConfig, params, tables, ctx: DraftContext, cache: KVCache, synced, until, width: int):
    """Feed the pieces of target tokens [synced, until) per row, `width` draft tokens per
    forward. Returns (logits [B, V_draft] of the last piece fed, cache with lengths advanced,
    synced = until for live rows)."""
    b, s = ctx.tokens.shape
    j = jnp.arange(width)
    live = ~ctx.done

    def cond_fn(carry):
        _, synced, offset, _ = carry
        return jnp.any(live & ((synced < until) | (offset > 0)))

    def body_fn(carry):
        cache, synced, offset, logits = carry
        index = synced[:, None] + j  # [B, W]: target tokens that may start in this chunk
        tokens = jnp.take_along_axis(ctx.tokens, jnp.minimum(index, s - 1), axis=1)
        counts = jnp.where((index < until[:, None]) & live[:, None], tables["lengths"][tokens], 0)
        counts = counts.at[:, 0].add(-offset)  # pieces of the first token fed by the last chunk
        ends = jnp.cumsum(counts, axis=1)  # [B, W]
        which = jnp.sum(ends[:, None, :] <= j[None, :, None], axis=2)  # [B, W]: the token of slot j
        valid = which < width
        which = jnp.minimum(which, width - 1)
        first = jnp.take_along_axis(ends - counts, which, axis=1)  # slot where that token's pieces start
        piece = j[None, :] - first + jnp.where(which == 0, offset[:, None], 0)
        start = tables["offsets"][jnp.take_along_axis(tokens, which, axis=1)]
        feed = jnp.where(valid, tables["pieces"][start + piece], 0)
        out, cache_new = forward(config, params, feed, cache.lengths[:, None] + j, cache)
        n = jnp.minimum(ends[:, -1], width)  # [B] draft tokens fed
        done_tokens = jnp.sum((ends <= n[:, None]) & (index < until[:, None]), axis=1)  # tokens fully fed
        before = jnp.take_along_axis(ends, jnp.maximum(done_tokens - 1, 0)[:, None], axis=1)[:, 0]
        partial = n - jnp.where(done_tokens > 0, before, 0)  # pieces of the next token fed
        offset = jnp.where(done_tokens > 0, partial, offset + partial)
        last = jnp.take_along_axis(out, jnp.maximum(n - 1, 0)[:, None, None], axis=1)[:, 0]
        logits = jnp.where((n > 0)[:, None], last.astype(logits.dtype), logits)
        cache_new = cache_new.replace(lengths=cache.lengths + n)
        return cache_new, synced + done_tokens, jnp.where(synced + done_tokens < until, offset, 0), logits

    logits = jnp.zeros((b, config.vocab_size), jnp.float32)
    carry = (cache, synced, jnp.zeros_like(synced), logits)
    cache, synced, _, logits = jax.lax.while_loop(cond_fn, body_fn, carry)
    return logits, cache, synced


@dataclasses.dataclass(frozen=True)
class ForeignDraft(Drafter):
    """A draft `Model` with its own tokenizer, kept in sync by its pieces (module docstring).
    Subclasses add how it proposes; `between(draft, target)` builds it from two models.

    catch_up: draft tokens per catch-up forward (a wider one catches up in fewer forwards);
    length_ratio: draft cache slots per target cache slot.
    """

    model: Model | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)
    tables: VocabTables | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)
    config: ModelConfig | None = None
    target_vocab: int = 0
    max_pieces: int = 1  # the most draft tokens one target token takes (from the tables)
    catch_up: int = 16
    length_ratio: float = 6.0
    title: ClassVar[str] = "a draft with another tokenizer"  # in messages
    proposes_shared_tokens: ClassVar[bool] = True  # TLI: the tables map draft ids to target ids

    @classmethod
    def between(cls, draft: Model, target: Model, **fields) -> ForeignDraft:
        for what, model in (("draft", draft), ("target", target)):
            if getattr(model, "tokenizer", None) is None:
                raise ValueError(f"{cls.title} needs the {what}'s tokenizer; this {what} model has none")
        tables = cls.build_tables(draft, target)
        return cls(model=draft, tables=tables, config=draft.config, target_vocab=target.config.vocab_size,
                   max_pieces=max(tables.max_pieces, 1), **cls.host_fields(draft, target), **fields)  # fmt: skip

    @classmethod
    def build_tables(cls, draft: Model, target: Model) -> VocabTables:
        """The pieces of every target token, and the intersection when the subclass proposes
        shared tokens (`proposes_shared_tokens`; UAG proposes text and needs none)."""
        return build_tables(target.tokenizer, target.config.vocab_size, draft.tokenizer, draft.config.vocab_size,
                            intersection=cls.proposes_shared_tokens)  # fmt: skip

    @classmethod
    def host_fields(cls, draft: Model, target: Model) -> dict:
        """Static fields a subclass builds from the two models (none here)."""
        del draft, target
        return {}

    @property
    def width(self) -> int:
        """Draft tokens per catch-up forward: `catch_up`, or less where two target tokens (a
        round's usual lag: the correction, or d_K and the bonus) never need that many."""
        return min(self.catch_up, 2 * self.max_pieces)

    def drafted(self, k: int) -> int:
        """Draft slots reserved in the cache past the committed pieces for a round of K drafts
        (0: none beyond one catch-up chunk)."""
        del k
        return 0

    def __post_init__(self):
        name = type(self).__name__
        if self.model is not None:
            object.__setattr__(self, "config", self.model.config)
        if self.config is None:
            raise ValueError(f"{name} needs a draft Model ({name}.between(draft, target))")
        if not isinstance(self.catch_up, int) or self.catch_up < 1:
            raise ValueError(f"{name}.catch_up must be an integer >= 1, got {self.catch_up!r}")
        if not self.length_ratio >= 1.0:
            raise ValueError(f"{name}.length_ratio must be >= 1, got {self.length_ratio!r}")

    def weights(self):
        if self.model is None or self.tables is None:
            raise ValueError(f"this {type(self).__name__} holds no weights (it is the static part of one)")
        return (self.model.params, self.tables.device_arrays)

    def without_weights(self) -> ForeignDraft:
        return dataclasses.replace(self, model=None, tables=None)

    def check(self, target_config: ModelConfig, num_speculative_tokens: int) -> None:
        if target_config.vocab_size != self.target_vocab:
            raise ValueError(
                f"these {self.title} tables were built for a target of {self.target_vocab} tokens, "
                f"the target has {target_config.vocab_size}"
            )

    def init(self, weights, ctx: DraftContext, prompt, cache_length: int) -> CrossVocabState:
        params, tables = weights
        b, t = prompt.shape
        width = min(PREFILL_CHUNK, t * self.max_pieces)
        ratio = min(self.length_ratio, self.max_pieces)
        slots = math.ceil(cache_length * ratio) + max(self.width, width, self.drafted(ctx.num_speculative_tokens))
        cache = init_cache(self.config, b, slots, dtype=ctx.cache.dtype, block_size=ctx.cache.block_size)
        zeros = jnp.zeros((b,), jnp.int32)
        # Every prompt token but the last: the first round's catch-up feeds it and drafts from there.
        _, cache, synced = feed_pieces(self.config, params, tables, ctx, cache, zeros, ctx.lengths - 1, width)
        return CrossVocabState(cache=cache, synced=synced, fed=zeros)

    def catch_up_to(self, params, tables, state: CrossVocabState, ctx: DraftContext):
        """Feed every committed target token not yet fed: (logits [B, V_draft] for the first
        draft, cache with lengths at the committed pieces, synced = ctx.lengths)."""
        return feed_pieces(self.config, params, tables, ctx, state.cache, state.synced, ctx.lengths, self.width)

    def stats(self, state: CrossVocabState):
        # Rows whose text outgrew the draft cache (length_ratio): their drafts degrade from there.
        overflowed = state.cache.lengths + self.width > state.cache.max_length
        return {"draft_cache_overflowed": overflowed.astype(jnp.int32)}
