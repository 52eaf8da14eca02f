"""Prompt lookup (n-gram) drafting inside the jitted loop: no draft model, no host copy.

For each row, the last n committed tokens (the row's suffix) are searched for in the
row's own prompt + output, for n = max_ngram down to min_ngram; the longest n with a
match wins. The K tokens that followed the match are proposed. vLLM and tpu-inference run
this on the host after a device-to-host copy each step; here it is a few [B, S] compares.

Which occurrence wins (`prefer`):
  "latest" (default): the most recent earlier occurrence. Recent context predicts best
    in the cases prompt lookup is for: an identifier just used, a line being repeated, a
    list being continued, a loop of generated text.
  "earliest": the first occurrence, as vLLM's NgramProposer does; it favours copying
    from the prompt (summaries, edits of a given document).

A continuation that runs into the end of the committed tokens continues periodically:
if the match starts d tokens before the suffix, proposal i is the token at
match_end + (i mod d). That is exactly the repetition the match suggests ("abcabc" after
"abc" proposes "abcabc..."), and it never reads an uncommitted slot.

No match (or a row too short to have one): the row proposes its last committed token K
times, which costs nothing and is verified like any other proposal (exactness does not
depend on what is proposed); `stats()["no_match_rounds"]` counts those rounds per row.
Adaptive speculation asks first (`abstains`) and takes a plain step instead when no live
row has a match, as transformers' prompt lookup stops drafting when it finds none.
The proposal is deterministic: q is one-hot (None), so under sampling a draft token d is
accepted with probability p(d) and a rejection samples p with d removed.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import struct

from specjax.drafters.base import DraftContext, Drafter, Proposal


@struct.dataclass
class LookupState:
    no_match_rounds: jnp.ndarray  # [B] int32: live rounds in which the row had no match


def match_ngram(tokens, lengths, n: int, prefer: str):
    """Where the last n committed tokens of each row occurred before.

    tokens [B, S], lengths [B]. Returns (found [B] bool, start [B] int32): the start slot j
    of an occurrence with tokens[j:j+n] == tokens[L-n:L] and j + n < L (so the match lies
    strictly before the suffix and its first continuation token is committed).
    """
    s = tokens.shape[1]
    slots = jnp.arange(s)[None, :]  # [1, S]
    padded = jnp.pad(tokens, ((0, 0), (0, n)))  # reading j + t past the end: never a match (masked below)
    suffix_slots = jnp.maximum(lengths[:, None] - n + jnp.arange(n)[None, :], 0)  # [B, n]
    suffix = jnp.take_along_axis(tokens, suffix_slots, axis=1)  # [B, n]
    match = slots < (lengths - n)[:, None]  # [B, S]: j + n < L, hence j + t < L for every t < n
    for t in range(n):
        match &= padded[:, t : t + s] == suffix[:, t : t + 1]
    found = jnp.any(match, axis=1)
    # argmax returns the first True: of the reversed row for the latest occurrence.
    start = s - 1 - jnp.argmax(match[:, ::-1], axis=1) if prefer == "latest" else jnp.argmax(match, axis=1)
    return found, start.astype(jnp.int32)


def lookup(tokens, lengths, k: int, max_ngram: int, min_ngram: int, prefer: str):
    """Proposals [B, K] int32 and found [B] bool for every row (see the module docstring)."""
    found = jnp.zeros(lengths.shape, bool)
    start = jnp.zeros(lengths.shape, jnp.int32)
    ngram = jnp.ones(lengths.shape, jnp.int32)
    for n in range(max_ngram, min_ngram - 1, -1):  # longest first: a longer match wins
        found_n, start_n = match_ngram(tokens, lengths, n, prefer)
        take = found_n & ~found
        start = jnp.where(take, start_n, start)
        ngram = jnp.where(take, n, ngram)
        found = found | found_n
    follow = start + ngram  # [B]: first continuation slot, < L when found
    period = jnp.maximum(lengths - follow, 1)  # d = (L - n) - j >= 1
    slots = follow[:, None] + jnp.arange(k)[None, :] % period[:, None]  # [B, K], all < L
    last = jnp.maximum(lengths - 1, 0)[:, None]
    slots = jnp.where(found[:, None], slots, last)
    return jnp.take_along_axis(tokens, slots, axis=1), found


@dataclasses.dataclass(frozen=True)
class PromptLookup(Drafter):
    """Prompt-lookup drafting: propose what followed the last n-gram's previous occurrence."""

    max_ngram: int = 3
    min_ngram: int = 1
    prefer: str = "latest"
    name = "prompt_lookup"

    def __post_init__(self):
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(
                f"PromptLookup needs 1 <= min_ngram <= max_ngram, got min_ngram={self.min_ngram}, "
                f"max_ngram={self.max_ngram}"
            )
        if self.prefer not in ("latest", "earliest"):
            raise ValueError(f"PromptLookup.prefer must be 'latest' or 'earliest', got {self.prefer!r}")

    def init(self, weights, ctx: DraftContext, prompt, cache_length: int) -> LookupState:
        return LookupState(no_match_rounds=jnp.zeros(ctx.lengths.shape, jnp.int32))

    def propose(self, weights, state: LookupState, ctx: DraftContext, key):
        tokens, found = lookup(
            ctx.tokens, ctx.lengths, ctx.num_speculative_tokens, self.max_ngram, self.min_ngram, self.prefer
        )
        missed = (~found & ~ctx.done).astype(jnp.int32)
        return Proposal(tokens=tokens, q=None, found=found), LookupState(state.no_match_rounds + missed)

    def abstains(self, weights, state, ctx: DraftContext):
        # The same search as `propose` (a few [B, S] compares): no match, nothing to verify.
        _, found = lookup(ctx.tokens, ctx.lengths, 1, self.max_ngram, self.min_ngram, self.prefer)
        return ~found

    def stats(self, state: LookupState):
        return {"no_match_rounds": state.no_match_rounds}
