"""A draft model with another tokenizer than the target's: token-level intersection (TLI;
Timor et al., arXiv 2502.05202, "Accelerating LLM Inference with Lossless Speculative
Decoding Algorithms for Heterogeneous Vocabularies"; Hugging Face's
`UniversalSpeculativeDecodingGenerator`).

The draft proposes only tokens whose bytes are exactly one target token (the intersection,
drafters/vocab_tables.py), drawn from its distribution restricted to them (-inf elsewhere,
then the same SamplingConfig as the target's) and mapped to target ids. q is that
restricted, processed distribution scattered into target ids, so speculative sampling is
exact against the target whatever the draft is.

The draft keeps its own KV cache in draft-token positions. It holds the pieces (the
draft's encoding, vocab_tables.py) of the committed target tokens [0, synced) at draft
slots [0, cache.lengths). A round:
  1. catch-up: feed the pieces of target tokens [synced, L) in forwards of `catch_up`
     draft tokens (a while loop: one forward in the steady state, more after plain steps of
     adaptive speculation or a long token); the last fed piece's logits give draft 1.
     Chunks may split a token's pieces (a carried piece offset), so no width depends on
     the longest token. Slots of a chunk past a row's pieces take garbage at positions after
     its last valid one: no valid query sees them and the next write overwrites them.
  2. K drafts, each fed back (as its draft id, one piece) but the K-th.
  3. update: the accepted drafts that were fed are committed pieces: synced and
     cache.lengths advance by min(num_accepted, K - 1). The last committed token (the
     correction or bonus) is never fed, so every round has something to catch up on.
Behind another drafter (Fallback) the accepted tokens may be another drafter's: then
nothing fed while drafting is trusted (`tolerating_lag`) and the catch-up re-feeds them.

The draft cache has min(`length_ratio`, the longest token's pieces) draft slots per target
slot (+ one chunk). A row whose text needs more (a byte-level draft on text of long tokens)
overflows it: writes past the end are dropped and its drafts degrade, which costs
acceptance, never exactness.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import struct

from specjax.core.sampling import SamplingConfig
from specjax.drafters.base import DraftContext, Drafter, Proposal
from specjax.drafters.proposing import draw
from specjax.drafters.vocab_tables import VocabTables, build_tables
from specjax.io.model import Model
from specjax.models import KVCache, ModelConfig, forward, init_cache

PREFILL_CHUNK = 256  # draft tokens per forward when init feeds the prompt


@struct.dataclass
class CrossVocabState:
    cache: KVCache  # [layers, B, S_draft, n_kv, d_head]; lengths: draft slots of committed pieces
    synced: jax.Array  # [B] int32: target tokens whose pieces fill cache slots [0, cache.lengths)
    fed: jax.Array  # [B] int32: drafts fed past cache.lengths by the last propose (0 after update)


def _feed(config: ModelConfig, params, tables, ctx: DraftContext, cache: KVCache, synced, until, width: int):
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
class CrossVocab(Drafter):
    """A draft `Model` with its own tokenizer, for a target with another (module docstring).

    `CrossVocab.between(draft, target)` builds the tables from the two models' tokenizers.
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
    trust_drafts: bool = True  # False behind another drafter: accepted tokens may not be ours
    name = "tli"

    @classmethod
    def between(cls, draft: Model, target: Model, **fields) -> CrossVocab:
        for what, model in (("draft", draft), ("target", target)):
            if getattr(model, "tokenizer", None) is None:
                raise ValueError(f"token-level intersection needs the {what}'s tokenizer; this {what} model has none")
        tables = build_tables(target.tokenizer, target.config.vocab_size, draft.tokenizer, draft.config.vocab_size)
        return cls(model=draft, tables=tables, config=draft.config, target_vocab=target.config.vocab_size,
                   max_pieces=max(tables.max_pieces, 1), **fields)  # fmt: skip

    @property
    def width(self) -> int:
        """Draft tokens per catch-up forward: `catch_up`, or less where two target tokens (a
        round's usual lag: the correction, or d_K and the bonus) never need that many."""
        return min(self.catch_up, 2 * self.max_pieces)

    def __post_init__(self):
        if self.model is not None:
            object.__setattr__(self, "config", self.model.config)
        if self.config is None:
            raise ValueError("CrossVocab needs a draft Model (CrossVocab.between(draft, target))")
        if not isinstance(self.catch_up, int) or self.catch_up < 1:
            raise ValueError(f"CrossVocab.catch_up must be an integer >= 1, got {self.catch_up!r}")
        if not self.length_ratio >= 1.0:
            raise ValueError(f"CrossVocab.length_ratio must be >= 1, got {self.length_ratio!r}")

    def weights(self):
        if self.model is None or self.tables is None:
            raise ValueError("this CrossVocab holds no weights (it is the static part of one)")
        return (self.model.params, self.tables.device_arrays)

    def without_weights(self) -> CrossVocab:
        return dataclasses.replace(self, model=None, tables=None)

    def tolerating_lag(self, lag: int) -> CrossVocab:
        return dataclasses.replace(self, trust_drafts=False)

    def check(self, target_config: ModelConfig, num_speculative_tokens: int) -> None:
        if target_config.vocab_size != self.target_vocab:
            raise ValueError(
                f"these token-level intersection tables were built for a target of {self.target_vocab} tokens, "
                f"the target has {target_config.vocab_size}"
            )

    def init(self, weights, ctx: DraftContext, prompt, cache_length: int) -> CrossVocabState:
        params, tables = weights
        b, t = prompt.shape
        width = min(PREFILL_CHUNK, t * self.max_pieces)
        ratio = min(self.length_ratio, self.max_pieces)
        slots = math.ceil(cache_length * ratio) + max(self.width, width)
        cache = init_cache(self.config, b, slots, dtype=ctx.cache.dtype, block_size=ctx.cache.block_size)
        zeros = jnp.zeros((b,), jnp.int32)
        # Every prompt token but the last: the first round's catch-up feeds it and drafts from there.
        _, cache, synced = _feed(self.config, params, tables, ctx, cache, zeros, ctx.lengths - 1, width)
        return CrossVocabState(cache=cache, synced=synced, fed=zeros)

    def restricted(self, tables, logits):
        """logits [.., V_draft] with every draft token outside the intersection at -inf."""
        return jnp.where(tables["draft_to_target"] >= 0, logits, -jnp.inf)

    def draw(self, key, logits, tables, sampling: SamplingConfig):
        """Draft token [B] and the draft-vocabulary distribution [B, V_draft] it was drawn
        from (None when greedy), from the draft's logits [B, V_draft]."""
        return draw(key, self.restricted(tables, logits), sampling)

    def propose(self, weights, state: CrossVocabState, ctx: DraftContext, key):
        params, tables = weights
        k, sampling = ctx.num_speculative_tokens, ctx.sampling
        logits, cache, synced = _feed(self.config, params, tables, ctx, state.cache, state.synced, ctx.lengths,
                                      self.width)  # fmt: skip

        def step(carry, step_key):
            cache, position, logits = carry
            token, q = self.draw(step_key, logits, tables, sampling)
            feed = tables["draft_feed"][token][:, None]
            out, cache = forward(self.config, params, feed, position[:, None], cache)
            return (cache, position + 1, out[:, 0].astype(jnp.float32)), (token, q)

        keys = jax.random.split(key, k)
        (fed_cache, _, logits_k), (tokens, qs) = jax.lax.scan(step, (cache, cache.lengths, logits), keys[:-1])
        last_token, last_q = self.draw(keys[-1], logits_k, tables, sampling)
        drafts = jnp.concatenate([tokens.T, last_token[:, None]], axis=1)  # [B, K] draft ids
        targets = tables["draft_to_target"][drafts]  # [B, K]: in the intersection by construction
        q = None
        if last_q is not None:
            q_draft = jnp.concatenate([qs.transpose(1, 0, 2), last_q[:, None]], axis=1)  # [B, K, V_draft]
            q = self.target_q(q_draft, tables, ctx.target.vocab_size)
        state = CrossVocabState(
            cache=fed_cache.replace(lengths=cache.lengths),
            synced=synced,
            fed=jnp.full_like(synced, k - 1),
        )
        return Proposal(tokens=targets.astype(jnp.int32), q=q), state

    @staticmethod
    def target_q(q_draft, tables, target_vocab: int):
        """[B, K, V_draft] -> [B, K, V_target]: each draft token's mass at its target id (summed
        over draft tokens with the same bytes); outside the intersection q_draft is 0."""
        ids = tables["draft_to_target"]
        index = jnp.where(ids >= 0, ids, target_vocab)  # past the end: dropped
        shape = (*q_draft.shape[:-1], target_vocab)
        return jnp.zeros(shape, jnp.float32).at[..., index].add(q_draft, mode="drop")

    def update(self, weights, state: CrossVocabState, ctx: DraftContext, num_accepted):
        trusted = jnp.minimum(num_accepted, state.fed) if self.trust_drafts else jnp.zeros_like(state.fed)
        # Never past the last committed token: the next catch-up must feed at least it.
        trusted = jnp.clip(jnp.minimum(trusted, ctx.lengths - 1 - state.synced), 0, None)
        cache = state.cache.replace(lengths=state.cache.lengths + trusted)
        return CrossVocabState(cache=cache, synced=state.synced + trusted, fed=jnp.zeros_like(state.fed))

    def stats(self, state: CrossVocabState):
        # Rows whose text outgrew the draft cache (length_ratio): their drafts degrade from there.
        overflowed = state.cache.lengths + self.width > state.cache.max_length
        return {"draft_cache_overflowed": overflowed.astype(jnp.int32)}
