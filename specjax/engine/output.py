"""What a generation call returns: the tokens and the counters behind every metric."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from specjax.engine.adaptive_policy import RoundCosts
from specjax.parallel.placement import gather_rows
from specjax.runtime import bound_live_programs, install

install()  # count compiles, for bound_live_programs (specjax/runtime.py)


def acceptance_metrics(drafts: int, drafted: int, accepted: int, accepted_counts, position_rounds) -> dict:
    """Every acceptance rate, derived from counters (the one place they are derived; the
    engine, adaptive speculation and the bench's pooled rows all call this).

    drafts: row-rounds that drafted (vLLM's num_drafts); drafted / accepted: draft tokens;
    accepted_counts[i]: row-rounds that accepted draft position i + 1; position_rounds[i]:
    row-rounds that drafted position i + 1 and reached it.
    """
    counts = [int(c) for c in accepted_counts]
    reached = [int(n) for n in position_rounds]
    return {
        "acceptance_rate": _ratio(accepted, drafted),
        "mean_acceptance_length": 1.0 + _ratio(accepted, drafts),
        "accepted_per_position": [_ratio(c, n) for c, n in zip(counts, reached, strict=True)],
        "rounds_accepting": _histogram(drafts, counts),  # row-rounds that accepted exactly n = 0..K
    }


@dataclasses.dataclass(frozen=True)
class GenerationStats:
    """Counters of one generation call, summed over the rows of the batch, and the rates
    derived from them (by `acceptance_metrics`, nowhere else).

    Counters (vLLM's names in brackets where they differ):
      rounds: row-rounds, i.e. for every row the number of rounds (speculative) or decode
        steps (plain) in which it was still generating, summed over rows.
      num_drafts: row-rounds that drafted (rounds minus adaptive speculation's plain steps).
      target_forwards: batched target forward passes of the loop (one per round or step,
        however many rows it served); the prompt prefill is not counted.
      drafted_tokens [num_draft_tokens]: K (a tree: its N nodes) per drafting row-round.
      accepted_tokens [num_accepted_tokens]: draft tokens the target accepted.
      accepted_counts [num_accepted_tokens_per_pos]: for i = 1..K, the row-rounds in which
        draft token i was accepted.
      position_rounds: for i = 1..K, the row-rounds that drafted position i and reached it
        (every earlier one accepted).
      emitted_tokens: tokens the rounds produced, rounds + accepted_tokens (each round
        commits its accepted draft tokens plus one correction/bonus token).
      truncated_tokens: emitted_tokens - generated_tokens, the emitted tokens cut because
        a row reached max_new_tokens or EOS mid-round; so the summary adds up.
      stopped_at_eos: per row, whether it ended at an EOS token (else at max_new_tokens).
      accepted_length_histogram: per row, rounds that accepted exactly n = 0..K tokens.
      verify_width: tokens per row in each target forward: K + 1 (a tree: N + 1; plain: 1).
    Derived (definitions: docs/metrics.md):
      acceptance_rate: accepted_tokens / drafted_tokens (a tree drafts N to accept at most
        its depth, so compare trees by mean_acceptance_length, not by this).
      mean_acceptance_length: 1 + accepted_tokens / num_drafts, pooled over rows: tokens a
        drafting round yields counting the correction/bonus token (gpt-fast reports it
        without the +1).
      accepted_per_position: for i = 1..K, P(draft token i accepted | tokens 1..i-1 were),
        accepted_counts[i] / position_rounds[i]; for a tree, i is the depth.
      rounds_accepting: row-rounds that accepted exactly n = 0..K draft tokens.
    """

    rounds: int
    target_forwards: int
    drafted_tokens: int
    verify_width: int
    accepted_tokens: int
    generated_tokens: int
    acceptance_rate: float
    mean_acceptance_length: float
    accepted_per_position: list[float]
    accepted_counts: list[int]
    per_row_mean_acceptance_length: list[float]
    position_rounds: list[int] = dataclasses.field(default_factory=list)
    num_drafts: int = 0
    rounds_accepting: list[int] = dataclasses.field(default_factory=list)
    accepted_length_histogram: list[list[int]] = dataclasses.field(default_factory=list)
    emitted_tokens: int = 0
    truncated_tokens: int = 0
    stopped_at_eos: list[bool] = dataclasses.field(default_factory=list)
    drafter: dict = dataclasses.field(default_factory=dict)
    # Adaptive speculation only: the K set, rounds per K, plain steps, and per round the K
    # chosen and the estimated acceptance of position 1 (engine/adaptive.py).
    adaptive: dict | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def with_drafts(self, row_drafts, accepted_at, tried_at, drafted_tokens: int) -> GenerationStats:
        """These stats with the draft counters of rounds whose K varies (adaptive speculation,
        where plain steps draft nothing): row_drafts [B] drafting rounds, accepted_at [B, W],
        tried_at [B, W] row-rounds that drafted position i and reached it, drafted_tokens.
        Every rate is derived again from the counters."""
        row_drafts = np.asarray(row_drafts, np.int64)
        accepted_at = np.asarray(accepted_at, np.int64)
        tried = np.asarray(tried_at, np.int64).sum(axis=0)
        drafts = int(row_drafts.sum())
        return dataclasses.replace(
            self,
            num_drafts=drafts,
            drafted_tokens=int(drafted_tokens),
            position_rounds=[int(t) for t in tried],
            accepted_length_histogram=[_histogram(d, row) for d, row in zip(row_drafts, accepted_at, strict=True)],
            per_row_mean_acceptance_length=[
                1.0 + _ratio(row.sum(), d) for d, row in zip(row_drafts, accepted_at, strict=True)
            ],
            **acceptance_metrics(drafts, drafted_tokens, self.accepted_tokens, self.accepted_counts, tried),
        )


@dataclasses.dataclass(frozen=True)
class GenerationOutput:
    tokens: list[list[int]]  # generated ids per prompt, prompt excluded, cut after EOS
    stats: GenerationStats
    text: list[str] | None = None  # decoded `tokens`, when the prompts were text

    def with_text(self, tokenizer) -> GenerationOutput:
        decoded = [tokenizer.decode(t, skip_special_tokens=True) for t in self.tokens]
        return dataclasses.replace(self, text=decoded)


def _ratio(num, den) -> float:
    return float(num) / float(den) if den else 0.0


def _histogram(drafts: int, counts) -> list[int]:
    """Rounds that accepted exactly n = 0..K tokens, from the rounds that drafted and the
    rounds that accepted position n (acceptance is a prefix)."""
    counts = [int(c) for c in counts]
    k = len(counts)
    return [int(drafts) - (counts[0] if k else 0)] + [
        counts[n - 1] - (counts[n] if n < k else 0) for n in range(1, k + 1)
    ]


def collect_output(
    tokens,
    prompt_lengths,
    lengths,
    row_rounds,
    target_forwards,
    accepted_at=None,
    num_rows=None,
    drafted_per_round=None,
    eos_token_id=None,
):
    """Host-side assembly from final loop state arrays (numpy).

    tokens [B, S]; prompt_lengths, lengths, row_rounds [B]; accepted_at [B, K] counts how
    often draft position i (a tree: depth i) was accepted (None for plain decoding).
    `num_rows`: keep only the first num_rows rows (the rest pad the batch to its bucket);
    None keeps all. `drafted_per_round`: tokens drafted per row-round when it is not K
    (a tree's node count N); the verify width is drafted_per_round + 1. `eos_token_id`
    (None, an id or a list of ids) marks the rows that stopped at EOS.
    """
    if num_rows is not None:
        tokens, prompt_lengths, lengths, row_rounds = (
            np.asarray(x)[:num_rows] for x in (tokens, prompt_lengths, lengths, row_rounds)
        )
        accepted_at = None if accepted_at is None else np.asarray(accepted_at)[:num_rows]
    generated = [tokens[b, prompt_lengths[b] : lengths[b]].tolist() for b in range(tokens.shape[0])]
    row_rounds = np.asarray(row_rounds, np.int64)
    rounds = int(row_rounds.sum())
    plain = accepted_at is None
    if plain:
        accepted_at = np.zeros((len(generated), 0), np.int64)
    accepted_at = np.asarray(accepted_at, np.int64)
    k = accepted_at.shape[1]
    drafted = k if drafted_per_round is None else drafted_per_round
    row_drafts = np.zeros_like(row_rounds) if plain else row_rounds  # every round of a fixed K drafts
    drafts = int(row_drafts.sum())
    row_accepted = accepted_at.sum(axis=1)
    accepted = int(row_accepted.sum())
    counts = accepted_at.sum(axis=0)
    reached = np.concatenate([[drafts], counts])[:k]  # row-rounds that drafted and got to position i
    generated_tokens = sum(len(g) for g in generated)
    stops = set() if eos_token_id is None else {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)
    metrics = acceptance_metrics(drafts, drafted * drafts, accepted, counts, reached)
    stats = GenerationStats(
        rounds=rounds,
        num_drafts=drafts,
        target_forwards=int(target_forwards),
        drafted_tokens=drafted * drafts,
        verify_width=drafted + 1,
        accepted_tokens=accepted,
        generated_tokens=generated_tokens,
        accepted_counts=[int(c) for c in counts],
        position_rounds=[int(c) for c in reached],
        per_row_mean_acceptance_length=[1.0 + _ratio(a, r) for a, r in zip(row_accepted, row_drafts, strict=True)],
        accepted_length_histogram=[_histogram(d, row) for d, row in zip(row_drafts, accepted_at, strict=True)],
        emitted_tokens=rounds + accepted,
        truncated_tokens=rounds + accepted - generated_tokens,
        stopped_at_eos=[bool(g) and g[-1] in stops for g in generated],
        **metrics,
    )
    return GenerationOutput(tokens=generated, stats=stats)


@dataclasses.dataclass(frozen=True)
class PreparedGeneration:
    """A checked, padded and planned generation call that has not run yet.

    `run()` is what `specjax.generate` returns: it prefills, then runs the rounds in chunks
    of about CHUNK_SECONDS (engine/generation.py), returning to the host between chunks so
    that Ctrl-C stops it promptly; `decode(n)` is the same without collecting the output.
    `compile()` compiles those programs ahead of time without running them, so a caller can
    time compilation apart from decoding. `launch(n)` starts the whole loop as one compiled
    program and returns the final loop state without waiting for it (JAX dispatch is
    asynchronous), so a benchmark can time `jax.block_until_ready(launch(n))`; it cannot be
    interrupted midway. Both give the same tokens bit for bit. Every n <= max_new_tokens
    runs the same compiled programs: the token budget is a traced value and the cache is
    sized for `max_new_tokens`.
    """

    max_new_tokens: int
    batch_size: int
    cache_length: int
    launch_fn: Callable[[int], Any]  # n -> final loop state (device arrays), one program
    collect_fn: Callable[[Any], GenerationOutput]  # final loop state -> host-side output
    tokenizer: Any = None  # set when the prompts were text: outputs are decoded too
    decode_fn: Callable[..., Any] | None = None  # (n, chunk_rounds) -> final loop state, in chunks of rounds
    compile_fn: Callable[[], None] | None = None  # compiles what decode_fn runs, running nothing
    costs: RoundCosts | None = None  # adaptive K's round costs and where they came from (engine/costs.py)

    def _budget(self, max_new_tokens: int | None) -> int:
        n = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        if not 1 <= n <= self.max_new_tokens:
            raise ValueError(f"max_new_tokens must lie in [1, {self.max_new_tokens}] for this prepared call, got {n}")
        return n

    def launch(self, max_new_tokens: int | None = None):
        n = self._budget(max_new_tokens)
        bound_live_programs()
        return self.launch_fn(n)

    def compile(self) -> PreparedGeneration:
        """Compile the programs `run` and `decode` use, ahead of time (a no-op when jit's
        cache already holds them)."""
        bound_live_programs()
        if self.compile_fn is not None:
            self.compile_fn()
        return self

    def decode(self, max_new_tokens: int | None = None, *, chunk_rounds: int | None = None):
        """The final loop state (device arrays, ready: the last chunk has been waited for).
        `chunk_rounds`: rounds per chunk; None sizes chunks to take about CHUNK_SECONDS."""
        n = self._budget(max_new_tokens)
        bound_live_programs()
        return self.launch_fn(n) if self.decode_fn is None else self.decode_fn(n, chunk_rounds)

    def collect(self, state) -> GenerationOutput:
        out = self.collect_fn(gather_rows(state))  # multi-host: rows other processes hold (specjax/parallel)
        if self.costs is not None:  # host-side knowledge the loop state does not hold
            adaptive = {**out.stats.adaptive, "costs": self.costs.report()}
            out = dataclasses.replace(out, stats=dataclasses.replace(out.stats, adaptive=adaptive))
        return out if self.tokenizer is None else out.with_text(self.tokenizer)

    def run(self, max_new_tokens: int | None = None) -> GenerationOutput:
        return self.collect(self.decode(max_new_tokens))
