"""Suffix decoding (Arctic's SuffixDecoding, Snowflake 2024-2025, as vLLM and SGLang serve
it) inside the jitted loop: no draft model, no host copy, static shapes.

SuffixDecoding keeps suffix trees over the request's own text and over earlier outputs,
finds the longest match of the request's recent tokens, and walks the tree from there,
taking the most frequent child at each step; a continuation is speculated as far as its
estimated probability (child count / parent count, multiplied along the path) stays above
`min_token_prob` and for at most `spec_factor` x the match length tokens.

Here the suffix tree is replaced by what it answers, computed with [B, N] compares:

  1. For every slot c of the row's own prompt + output ([B, S]) and of every sequence of
     a fixed-size pool of earlier outputs ([P, S_pool], -1 padded), the length m(c) <=
     max_match of the match between the tokens before c and the row's last tokens
     (max_match compares, all lengths at once: a running AND over t = 1..max_match).
  2. The longest match m* wins; of its occurrences, the `max_candidates` highest-priority
     ones are kept (own text before the pool, later before earlier), without a sort.
  3. The walk down the tree: at depth i the continuation token shared by the most live
     occurrences is proposed (ties: the highest-priority occurrence's), and only the
     occurrences that agree stay live. This is the most frequent child at every node.

An own-text continuation that runs into the end of the committed tokens repeats
periodically, as prompt lookup's does (it never reads an uncommitted slot); a pool
continuation ends with its sequence, and an ended occurrence stops counting.

Choosing the speculation length. A chain round verifies K tokens in every row, so a
per-row length cannot shorten the round. What the engine permits is used instead: a row
whose first token is not worth verifying (no match of >= min_match tokens, or estimated
probability < min_token_prob) has no real proposal (`Proposal.found` False, so
`Fallback(suffix, model)` drafts it with the model), and `abstains` says so: adaptive
speculation takes a plain step when no live row has one. Tokens past the chosen length
are still proposed (the walk goes on; verifying them costs nothing extra). The chosen
length is reported per row (`stats()["chosen_tokens"]`) beside the match length and the
match's number of occurrences.

The proposal is deterministic: q is one-hot (None), so exactness holds whatever the pool
holds, and under sampling a draft token d is accepted with probability p(d).

The pool: `SuffixDecoding(pool=[[ids...], ...])` (token-id lists; `pool_entries` reads
files and text; `drafter.remember(out.tokens)` adds a call's outputs) is the drafter's
weights, a traced argument of the compiled loop: a second generation over the same
prompts can speculate from the first one's answers (the regenerating / agent-loop
workload), and pools of one shape share one compiled program. By name:
`SpeculativeConfig(method="suffix", suffix_pool=...)`, `--drafter suffix`, or
`{method: suffix, suffix_pool: FILE, prompt_lookup_max: M}` (the match lengths are read
from prompt lookup's fields).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.drafters.base import DraftContext, Proposal
from specjax.drafters.common import HoldsWeights
from specjax.models import ModelConfig

PAD = -1  # pool padding and reads past a pool sequence's end: never equal to a token


@struct.dataclass
class SuffixState:
    """Per-row counters [B] int32 over live rounds (a round = one `propose`)."""

    no_match_rounds: jnp.ndarray  # no match of >= min_match tokens anywhere
    match_length: jnp.ndarray  # sum of the longest match's length m*
    match_occurrences: jnp.ndarray  # sum of its number of occurrences (at most max_candidates)
    pool_rounds: jnp.ndarray  # rounds whose proposed first token the pool supported
    chosen_tokens: jnp.ndarray  # sum of the speculation length SuffixDecoding would verify


def _match_lengths(source, suffix, max_match: int):
    """m [..., N]: for every slot c of source [..., N], the largest t <= max_match with
    source[c - t : c] == the row's last t tokens. suffix [B, max_match]: suffix[:, t - 1] =
    the token t places before the row's end. source [B, N] (the own text) or [1, P, N] (the
    pool, shared by the rows); m is [B, N] or [B, P, N]."""
    n = source.shape[-1]
    widths = [(0, 0)] * (source.ndim - 1) + [(max_match, 0)]
    shifted = jnp.pad(source, widths, constant_values=PAD)  # slot c - t < 0 reads PAD: no match
    suffix = suffix.reshape(suffix.shape[:1] + (1,) * (source.ndim - 1) + suffix.shape[1:])
    run = None
    length = 0
    for t in range(1, max_match + 1):
        equal = shifted[..., max_match - t : max_match - t + n] == suffix[..., t - 1]  # source[c - t]
        run = equal if run is None else run & equal
        length = length + run.astype(jnp.int32)
    return length


def suffix_search(tokens, lengths, pool, k: int, max_match: int, min_match: int, max_candidates: int,
                  spec_factor: float, min_token_prob: float):  # fmt: skip
    """The proposal for every row (module docstring).

    tokens [B, S] committed tokens by position, lengths [B], pool [P, S_pool] int32
    (PAD-padded; P may be 0). Returns (proposal [B, K] int32, chosen [B] int32: the
    speculation length worth verifying, 0 = no real proposal, info: per-row [B] match
    length, occurrences and pool support of the first token).
    """
    b, s = tokens.shape
    p, s_pool = pool.shape
    n_pool = p * s_pool
    n = n_pool + s  # candidates: every pool slot, then every own slot (priority = index)

    # The row's last max_match tokens, the last first; before the row's start: never a match.
    back = lengths[:, None] - 1 - jnp.arange(max_match)[None, :]  # [B, M]
    suffix = jnp.where(back >= 0, jnp.take_along_axis(tokens, jnp.maximum(back, 0), axis=1), PAD - 1)

    slots = jnp.arange(s)[None, :]
    own_m = jnp.where(slots < lengths[:, None], _match_lengths(tokens, suffix, max_match), 0)  # [B, S]: c < L
    parts = [own_m]
    if p:
        pool_ok = jnp.arange(s_pool)[None, :] < jnp.sum(pool >= 0, axis=1)[:, None]  # [P, S_pool]: c < length
        pool_m = jnp.where(pool_ok[None], _match_lengths(pool[None], suffix, max_match), 0)  # [B, P, S_pool]
        parts.insert(0, pool_m.reshape(b, n_pool))
    m = jnp.concatenate(parts, axis=1)  # [B, N]
    best = jnp.max(m, axis=1)  # [B]
    match = jnp.where(best >= min_match, best, 0)  # [B]: m*, 0 when none
    hit = (m == match[:, None]) & (match[:, None] > 0)  # [B, N]: occurrences of the longest match
    # The C highest-priority hits, highest first, without a sort (top_k costs 10x this on CPU):
    # rank r = hits at or after the slot; the hit of rank r goes to column r - 1.
    c = min(max_candidates, n)
    rank = jnp.cumsum(hit[:, ::-1].astype(jnp.int32), axis=1)[:, ::-1]  # [B, N]
    column = jnp.where(hit & (rank <= c), rank - 1, c)  # c: dropped
    index = jnp.zeros((b, c), jnp.int32).at[jnp.arange(b)[:, None], column].set(jnp.arange(n)[None, :], mode="drop")
    alive = jnp.arange(c)[None, :] < rank[:, :1]  # [B, C]: columns that received a hit

    # Continuations [B, C, K]: own slot c reads c + i mod (L - c); pool slot c reads c + i.
    depth = jnp.arange(k)[None, None, :]
    own_c = jnp.clip(index - n_pool, 0, s - 1)  # [B, C]
    period = jnp.maximum(lengths[:, None] - own_c, 1)
    own_slots = own_c[..., None] + depth % period[..., None]  # [B, C, K], all < L
    cont = jnp.take_along_axis(tokens, own_slots.reshape(b, -1), axis=1).reshape(b, -1, k)
    from_pool = index < n_pool  # [B, C]
    if p:
        padded = jnp.pad(pool, ((0, 0), (0, k)), constant_values=PAD).reshape(-1)  # [P * (S_pool + K)]
        row, col = jnp.minimum(index, n_pool - 1) // s_pool, jnp.minimum(index, n_pool - 1) % s_pool
        pool_cont = padded[(row * (s_pool + k) + col)[..., None] + depth]  # [B, C, K]
        cont = jnp.where(from_pool[..., None], pool_cont, cont)

    last = jnp.take_along_axis(tokens, jnp.maximum(lengths - 1, 0)[:, None], axis=1)[:, 0]  # [B]
    limit = jnp.minimum(k, jnp.ceil(spec_factor * match).astype(jnp.int32))  # [B]
    proposal, prev = [], last
    probability = jnp.ones((b,), jnp.float32)
    still = match > 0
    chosen = jnp.zeros((b,), jnp.int32)
    occurrences = jnp.sum(alive, axis=1).astype(jnp.int32)
    for i in range(k):
        tok = cont[:, :, i]  # [B, C]
        ok = alive & (tok >= 0)
        count = jnp.sum((tok[:, :, None] == tok[:, None, :]) & ok[:, None, :], axis=2) * ok  # [B, C]
        best = jnp.argmax(count, axis=1)[:, None]  # the first maximum: the highest priority among ties
        support = jnp.take_along_axis(count, best, axis=1)[:, 0]
        choice = jnp.where(support > 0, jnp.take_along_axis(tok, best, axis=1)[:, 0], prev)
        probability = probability * support / jnp.maximum(jnp.sum(ok, axis=1), 1)
        still = still & (support > 0) & (probability >= min_token_prob) & (i < limit)
        chosen = chosen + still.astype(jnp.int32)
        alive = ok & (tok == choice[:, None])
        if i == 0:
            pool_support = jnp.any(alive & from_pool, axis=1)
        proposal.append(choice)
        prev = choice
    info = {"match_length": match, "match_occurrences": occurrences, "pool_support": pool_support & (chosen > 0)}
    return jnp.stack(proposal, axis=1).astype(tokens.dtype), chosen, info


@dataclasses.dataclass(frozen=True)
class SuffixDecoding(HoldsWeights):
    """Suffix decoding: the most frequent continuation of the longest match of the row's last
    tokens, in its own text and in a pool of earlier outputs (module docstring).

    pool: earlier outputs, a sequence of token-id lists (the drafter's weights; () = none).
    max_match: the longest match compared (SuffixDecoding's tree depth for the match).
    min_match: shorter matches do not count.
    max_candidates: occurrences of the longest match counted (the frequency saturates here).
    spec_factor, min_token_prob: SuffixDecoding's length rule (vLLM's max_spec_factor and
      min_token_prob): speculate at most spec_factor x the match length tokens, and only
      while the path's estimated probability stays >= min_token_prob.
    """

    pool: Any = dataclasses.field(default=(), compare=False, hash=False)
    max_match: int = 8
    min_match: int = 1
    max_candidates: int = 32
    spec_factor: float = 1.0
    min_token_prob: float = 0.1
    name = "suffix"
    weights_field: ClassVar[str] = "pool"

    def __post_init__(self):
        if not 1 <= self.min_match <= self.max_match:
            raise ValueError(
                f"SuffixDecoding needs 1 <= min_match <= max_match, got min_match={self.min_match}, "
                f"max_match={self.max_match}"
            )
        if self.max_candidates < 1:
            raise ValueError(f"SuffixDecoding.max_candidates must be >= 1, got {self.max_candidates}")
        if not self.spec_factor > 0 or not 0 <= self.min_token_prob <= 1:
            raise ValueError(
                f"SuffixDecoding needs spec_factor > 0 and 0 <= min_token_prob <= 1, got spec_factor="
                f"{self.spec_factor}, min_token_prob={self.min_token_prob}"
            )
        if self.pool is not None and not isinstance(self.pool, jax.Array):  # None: the static part
            object.__setattr__(self, "pool", pool_array(self.pool))

    def remember(self, outputs, max_sequences: int | None = None) -> SuffixDecoding:
        """This drafter with `outputs` (token-id lists: a call's `out.tokens`) added to its pool,
        keeping the newest `max_sequences` (None: all): the agent loop's drafter after a turn.
        A pool of another shape compiles the loop anew (the pool is a traced argument)."""
        if self.pool is None:
            raise ValueError("this SuffixDecoding holds no pool (it is the static part of one)")
        kept = [[int(t) for t in row if t >= 0] for row in np.asarray(self.pool)]
        kept += [list(row) for row in outputs]
        return dataclasses.replace(self, pool=kept[-max_sequences:] if max_sequences else kept)

    def check(self, target_config: ModelConfig, num_speculative_tokens: int) -> None:
        if self.pool is not None and self.pool.size and int(jnp.max(self.pool)) >= target_config.vocab_size:
            raise ValueError(
                f"the suffix pool holds token id {int(jnp.max(self.pool))}, but the target's vocabulary has "
                f"{target_config.vocab_size} tokens: the pool was tokenized for another model"
            )

    def _search(self, pool, ctx: DraftContext, k: int):
        return suffix_search(ctx.tokens, ctx.lengths, pool, k, self.max_match, self.min_match, self.max_candidates,
                             self.spec_factor, self.min_token_prob)  # fmt: skip

    def init(self, weights, ctx: DraftContext, prompt, cache_length: int) -> SuffixState:
        zeros = jnp.zeros(ctx.lengths.shape, jnp.int32)
        return SuffixState(zeros, zeros, zeros, zeros, zeros)

    def propose(self, weights, state: SuffixState, ctx: DraftContext, key):
        tokens, chosen, info = self._search(weights, ctx, ctx.num_speculative_tokens)
        live = (~ctx.done).astype(jnp.int32)
        state = SuffixState(
            no_match_rounds=state.no_match_rounds + live * (info["match_length"] == 0),
            match_length=state.match_length + live * info["match_length"],
            match_occurrences=state.match_occurrences + live * info["match_occurrences"],
            pool_rounds=state.pool_rounds + live * info["pool_support"],
            chosen_tokens=state.chosen_tokens + live * chosen,
        )
        return Proposal(tokens=tokens, q=None, found=chosen > 0), state

    def abstains(self, weights, state, ctx: DraftContext):
        # The same search at K = 1: is the first token worth verifying?
        _, chosen, _ = self._search(weights, ctx, 1)
        return chosen == 0

    def stats(self, state: SuffixState):
        return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}


def pool_array(entries) -> jax.Array:
    """[P, S_pool] int32, PAD-padded, from token-id lists (P = 0 for none)."""
    rows = [list(e) for e in entries]
    for row in rows:
        if not all(isinstance(t, int | np.integer) and not isinstance(t, bool) and t >= 0 for t in row):
            raise ValueError(f"a suffix pool entry is a list of token ids >= 0, got {row[:8]!r}...")
    rows = [r for r in rows if r]
    out = np.full((len(rows), max((len(r) for r in rows), default=1)), PAD, np.int32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return jnp.asarray(out)


def pool_entries(value, tokenizer=None) -> list[list[int]]:
    """Token-id lists from what a spec's `suffix_pool` holds: a list of entries, or the path of
    a .json file (a list of entries, or a `specjax generate --json` record: its "tokens") or a
    .jsonl file (an entry per line). An entry is a token-id list, a text (tokenized with
    `tokenizer`, no special tokens), or an object with "tokens", "text" or "messages" (its
    assistant turns, as `specjax regenerate` writes)."""
    if isinstance(value, str | os.PathLike):
        path = Path(value).expanduser()
        if not path.is_file():
            raise ValueError(f"suffix_pool: no such file: {path}")
        text = path.read_text()
        try:
            if path.suffix == ".jsonl":
                value = [json.loads(line) for line in text.splitlines() if line.strip()]
            else:
                value = json.loads(text)
        except json.JSONDecodeError as error:
            kind = "JSONL" if path.suffix == ".jsonl" else "JSON"
            raise ValueError(f"suffix_pool: {path} is not {kind}: {error}") from None
        if isinstance(value, dict) and "tokens" in value:  # a `specjax generate --json` record
            value = value["tokens"]
    if not isinstance(value, list | tuple):
        raise ValueError(f"suffix_pool is a list of earlier outputs or a .json/.jsonl file, got {value!r}")
    out: list[list[int]] = []
    for entry in value:
        out.extend(_entry_tokens(entry, tokenizer))
    return out


def _entry_tokens(entry, tokenizer) -> list[list[int]]:
    if isinstance(entry, dict):
        if "tokens" in entry:
            entry = entry["tokens"]
        elif "text" in entry:
            entry = entry["text"]
        elif "messages" in entry:
            return [t for m in entry["messages"] if m.get("role") == "assistant"
                    for t in _entry_tokens(m.get("content") or "", tokenizer)]  # fmt: skip
        else:
            raise ValueError(f"a suffix pool object needs 'tokens', 'text' or 'messages', got keys {sorted(entry)}")
    if isinstance(entry, str):
        if tokenizer is None:
            raise ValueError("a suffix pool entry is text, but the target has no tokenizer: give token-id lists")
        return [list(tokenizer.encode(entry, add_special_tokens=False))]
    if isinstance(entry, list | tuple) and entry and all(isinstance(t, list | tuple) for t in entry):
        return [list(t) for t in entry]  # a batch of outputs ("tokens" of a generate record)
    if isinstance(entry, list | tuple):
        return [list(entry)]
    raise ValueError(f"a suffix pool entry is a token-id list, a text or an object, got {entry!r}")


def suffix_drafter(pool=None, tokenizer=None, **fields) -> SuffixDecoding:
    """A SuffixDecoding whose pool is read by `pool_entries` (None: no pool)."""
    entries = () if pool is None else pool_entries(pool, tokenizer)
    return SuffixDecoding(pool=entries, **fields)


__all__ = ["SuffixDecoding", "SuffixState", "pool_array", "pool_entries", "suffix_drafter", "suffix_search"]
