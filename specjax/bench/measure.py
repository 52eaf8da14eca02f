"""End-to-end generation measurements: latency, TTFT, TPOT, tokens/s and acceptance.

A `Workload` fixes what every measured generation shares (the pair, the held-out
prompts, the token budget); a `RunSpec` says how to generate (plain or speculative, K,
batch size, temperature). `measure` times many specs round-robin and returns one row of
metrics per spec, with the definitions of README "Metrics" (NOTES.md).

Batch size B splits the prompt set into requests of B rows (or repeats prompts to fill B
when there are fewer), so batch 1 still pools acceptance over every prompt. Each request
is timed twice per repetition: the whole generation (latency) and a one-token run of the
same compiled program (time to first token).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from specjax.bench.timing import median, timed
from specjax.engine.decode import prepare_generate
from specjax.engine.output import GenerationStats, PreparedGeneration
from specjax.engine.speculative import prepare_speculative_generate
from specjax.io.model import Model


@dataclasses.dataclass(frozen=True)
class RunSpec:
    method: str  # "plain" or "speculative"
    batch_size: int
    num_speculative_tokens: int = 0  # 0 for plain decoding
    temperature: float = 0.0

    @property
    def plain(self) -> RunSpec:
        """The baseline this spec's speedup is measured against."""
        return RunSpec("plain", self.batch_size, 0, self.temperature)


@dataclasses.dataclass(frozen=True)
class Workload:
    target: Model
    draft: Model
    prompts: list[list[int]]  # token ids, all of one length
    max_new_tokens: int
    seed: int = 0

    def requests(self, batch_size: int) -> list[list[list[int]]]:
        """The prompt set cut into batches of `batch_size` rows (cycled to fill the last)."""
        count = max(len(self.prompts), batch_size)
        count = -(-count // batch_size) * batch_size
        rows = list(itertools.islice(itertools.cycle(self.prompts), count))
        return [rows[i : i + batch_size] for i in range(0, count, batch_size)]

    def prepare(self, spec: RunSpec, prompts: list[list[int]]) -> PreparedGeneration:
        common = dict(max_new_tokens=self.max_new_tokens, temperature=spec.temperature, seed=self.seed)
        if spec.method == "plain":
            return prepare_generate(self.target, prompts, **common)
        return prepare_speculative_generate(
            self.target, self.draft, prompts, num_speculative_tokens=spec.num_speculative_tokens, **common
        )


def merge_stats(stats: list[GenerationStats]) -> dict:
    """Pool the counters of several requests and derive every acceptance metric from them."""
    rounds = sum(s.rounds for s in stats)
    accepted = sum(s.accepted_tokens for s in stats)
    drafted = sum(s.drafted_tokens for s in stats)
    counts = np.sum([s.accepted_counts for s in stats], axis=0) if stats[0].accepted_counts else np.zeros(0)
    reached = np.concatenate([[rounds], counts])  # row-rounds that got to draft position i
    k = len(counts)
    return {
        "rounds": rounds,
        "target_forwards": sum(s.target_forwards for s in stats),
        "generated_tokens": sum(s.generated_tokens for s in stats),
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "wasted_positions": drafted - accepted,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "mean_acceptance_length": 1.0 + accepted / rounds if rounds else 1.0,
        "accepted_per_position": [float(reached[i + 1] / reached[i]) if reached[i] else 0.0 for i in range(k)],
        # rounds_accepting[n]: row-rounds that accepted exactly n draft tokens, n = 0..K.
        "rounds_accepting": [int(reached[n] - (reached[n + 1] if n < k else 0)) for n in range(k + 1)],
    }


def acceptance(workload: Workload, k: int, temperature: float) -> dict:
    """Acceptance statistics of the pair on every prompt at one K (no timing)."""
    spec = RunSpec("speculative", len(workload.prompts), k, temperature)
    return merge_stats([workload.prepare(spec, workload.prompts).run().stats])


def _row(spec: RunSpec, requests, latency, first, outputs, tpot_target_ms, max_new_tokens) -> dict:
    """Metrics of one spec from per-repetition, per-request seconds [R][Q]."""
    latency, first = np.asarray(latency), np.asarray(first)
    stats = merge_stats([out.stats for out in outputs])
    tokens_per_request = spec.batch_size * max_new_tokens
    ttft = float(np.median(first))
    forwards_per_request = stats["target_forwards"] / len(requests)
    tpot = (latency - ttft) / (max_new_tokens - 1)  # per request, seconds
    meets = tpot * 1e3 <= tpot_target_ms
    row = {
        "method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "batch_size": spec.batch_size,
        "temperature": spec.temperature,
        "max_new_tokens": max_new_tokens,
        "requests": len(requests),
        "latency_ms": 1e3 * median(latency.ravel()),
        "ttft_ms": 1e3 * ttft,
        "tpot_ms": 1e3 * median(tpot.ravel()),
        # A plain step or a speculative round: the loop iteration the cost model predicts.
        "ms_per_iteration": 1e3 * (median(latency.ravel()) - ttft) / max(forwards_per_request - 1, 1),
        # Per repetition: every request's tokens over the time all requests took.
        "tokens_per_second": median(tokens_per_request * len(requests) / latency.sum(axis=1)),
        "goodput_tokens_per_second": float(tokens_per_request * meets.sum() / latency.sum()),
        "fraction_meeting_tpot_target": float(meets.mean()),
        "tpot_target_ms": tpot_target_ms,
        "target_forwards_per_token": stats["target_forwards"] * spec.batch_size / stats["generated_tokens"],
        **stats,
        "latency_seconds": latency.tolist(),
        "first_token_seconds": first.tolist(),
    }
    if spec.method == "plain":
        row.update(drafted_tokens=0, accepted_tokens=0, wasted_positions=0, mean_acceptance_length=1.0)
    return row


def measure(workload: Workload, specs: list[RunSpec], repeats: int, warmup: int, tpot_target_ms: float, progress=None):
    """Rows of metrics for every spec (plus the plain baseline of each), timed round-robin."""
    specs = list(dict.fromkeys([*(s.plain for s in specs), *specs]))  # baselines first, no duplicates
    prepared = {s: [workload.prepare(s, r) for r in workload.requests(s.batch_size)] for s in specs}
    for calls in prepared.values():
        for call in calls:
            for _ in range(warmup):  # the first call compiles; n = 1 runs the same program
                call.run()
    latency = {s: [] for s in specs}
    first = {s: [] for s in specs}
    for _ in range(repeats):
        for spec, calls in prepared.items():
            latency[spec].append([timed(call.launch) for call in calls])
            first[spec].append([timed(lambda call=call: call.launch(1)) for call in calls])
            if progress is not None:
                progress.update(1)
    rows = {}
    for spec, calls in prepared.items():
        outputs = [call.run() for call in calls]
        rows[spec] = _row(spec, calls, latency[spec], first[spec], outputs, tpot_target_ms, workload.max_new_tokens)
        rows[spec]["tokens"] = [t for out in outputs for t in out.tokens]
    for spec, row in rows.items():
        base = rows[spec.plain]
        row["speedup_vs_plain"] = row["tokens_per_second"] / base["tokens_per_second"]
        if spec.temperature == 0.0:  # greedy speculation must reproduce plain greedy exactly
            row["output_matches_plain"] = row["tokens"] == base["tokens"]
    for row in rows.values():
        del row["tokens"]
    return [rows[s] for s in specs]
