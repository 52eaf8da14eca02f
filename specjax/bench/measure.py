"""End-to-end generation measurements: latency, TTFT, TPOT, tokens/s and acceptance.

A `Workload` fixes what every measured generation shares (the target, its drafters, the
prompts and their categories, the token budget); a `RunSpec` says how to generate (plain
or speculative with which drafter, K, batch size, temperature). `measure` times many
specs round-robin and returns rows of metrics per spec, with the definitions of
docs/metrics.md: one pooled row (category "all") and, when the prompts have several
categories, one row per category from the same timed requests.

Batch size B splits each category's prompts into requests of B rows (or repeats prompts
to fill B when there are fewer), so batch 1 still pools acceptance over every prompt and
no request mixes categories. Each request is timed twice per repetition: the whole
generation (latency) and a one-token run of the same compiled program (time to first
token).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import jax
import numpy as np

from specjax.api import prepare
from specjax.bench.timing import median, timed_warm
from specjax.config import GenerationConfig, SpeculativeConfig
from specjax.core.loop import CacheConfig
from specjax.drafters import Drafter
from specjax.engine.output import GenerationStats, PreparedGeneration, acceptance_metrics
from specjax.io.model import Model

POOLED = "all"  # the category of rows pooled over every prompt
DRAFT = "draft"  # the label of the bench's own `draft` among a workload's drafters


@dataclasses.dataclass(frozen=True)
class RunSpec:
    method: str  # "plain" or "speculative"
    batch_size: int
    num_speculative_tokens: int = 0  # 0 for plain decoding
    temperature: float = 0.0
    drafter: str = DRAFT  # which of the workload's drafters proposes ("none" for plain decoding)
    adaptive: bool = False  # each round picks K <= num_speculative_tokens (engine/adaptive.py)

    @property
    def plain(self) -> RunSpec:
        """The baseline this spec's speedup is measured against."""
        return RunSpec("plain", self.batch_size, 0, self.temperature, "none")


@dataclasses.dataclass(frozen=True)
class Workload:
    target: Model
    drafters: dict[str, Drafter]  # label -> drafter; DRAFT is the bench's `draft`
    prompts: list[list[int]]  # token ids (one length for corpus prompts, ragged from files)
    categories: list[str]  # one per prompt
    max_new_tokens: int
    seed: int = 0
    cache_config: CacheConfig | None = None  # the KV-cache layout of every generation (None: default)
    # label -> the round settings its spec names beside the drafter (SpeculativeConfig's
    # `rule` and `verify_schedule`, as keyword arguments); absent: the defaults
    round_settings: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    constraint: Any = None  # a specjax Constraint every generation follows (None: free)

    @property
    def category_names(self) -> list[str]:
        return list(dict.fromkeys(self.categories))

    def with_drafters(self, drafters: dict[str, Drafter], settings: dict[str, dict] | None = None) -> Workload:
        return dataclasses.replace(
            self, drafters={**self.drafters, **drafters}, round_settings={**self.round_settings, **(settings or {})}
        )

    def prompts_of(self, category: str) -> list[list[int]]:
        return [p for p, c in zip(self.prompts, self.categories, strict=True) if category in (c, POOLED)]

    def requests(self, batch_size: int) -> list[tuple[str, list[list[int]]]]:
        """(category, rows) batches of `batch_size` rows, one category each (cycled to fill
        the last). Prompts are sorted by length within a category, so a batch pads little
        and ragged prompts compile few programs."""
        out = []
        for category in self.category_names:
            prompts = sorted(self.prompts_of(category), key=len)
            count = -(-max(len(prompts), batch_size) // batch_size) * batch_size
            rows = list(itertools.islice(itertools.cycle(prompts), count))
            out += [(category, rows[i : i + batch_size]) for i in range(0, count, batch_size)]
        return out

    def prepare(self, spec: RunSpec, prompts: list[list[int]]) -> PreparedGeneration:
        if spec.method == "plain":
            return prepare(self.target, prompts, self.config(spec))
        speculative = SpeculativeConfig(
            num_speculative_tokens=spec.num_speculative_tokens,
            adaptive=spec.adaptive,
            **self.round_settings.get(spec.drafter, {}),
        )
        return prepare(
            self.target, prompts, self.config(spec), draft=self.drafters[spec.drafter], speculative=speculative
        )

    def config(self, spec: RunSpec) -> GenerationConfig:
        return GenerationConfig.at_temperature(
            spec.temperature,
            max_new_tokens=self.max_new_tokens,
            seed=self.seed,
            cache=self.cache_config,
            ignore_eos=True,  # fixed lengths: every row of every configuration times the same tokens
            constraint=self.constraint,
        )


def merge_stats(stats: list[GenerationStats]) -> dict:
    """Pool the counters of several requests and derive every acceptance metric from them
    (engine/output.py `acceptance_metrics`, the one place rates are derived)."""
    drafts = sum(s.num_drafts for s in stats)
    accepted = sum(s.accepted_tokens for s in stats)
    drafted = sum(s.drafted_tokens for s in stats)
    width = len(stats[0].accepted_counts)
    counts = np.sum([s.accepted_counts for s in stats], axis=0) if width else np.zeros(0, np.int64)
    reached = np.sum([s.position_rounds for s in stats], axis=0) if width else np.zeros(0, np.int64)
    return {
        "rounds": sum(s.rounds for s in stats),
        "num_drafts": drafts,
        "target_forwards": sum(s.target_forwards for s in stats),
        "generated_tokens": sum(s.generated_tokens for s in stats),
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "wasted_positions": drafted - accepted,
        **acceptance_metrics(drafts, drafted, accepted, counts, reached),
    }


def pooled(rows: list[dict]) -> list[dict]:
    """The rows pooled over every prompt (rows without a category are pooled too)."""
    return [r for r in rows if r.get("category", POOLED) == POOLED]


def drafter_counters(stats: list[GenerationStats]) -> dict[str, int]:
    """The drafter's own counters (GenerationStats.drafter, e.g. no_match_rounds), summed."""
    out: dict[str, int] = {}
    for s in stats:
        for name, value in s.drafter.items():
            if name != "kind":
                out[name] = out.get(name, 0) + int(value)
    return out


def adaptive_counters(stats: list[GenerationStats]) -> dict:
    """What the adaptive policy did over several requests: rounds per K (summed), plain steps,
    and its mean K per round (the K of each round, not per row)."""
    rounds_per_k: dict[int, int] = {}
    for s in stats:
        for k, n in s.adaptive["rounds_per_k"].items():
            rounds_per_k[k] = rounds_per_k.get(k, 0) + n
    total = sum(rounds_per_k.values())
    return {
        "adaptive_rounds_per_k": rounds_per_k,
        "adaptive_plain_steps": sum(s.adaptive["plain_steps"] for s in stats),
        "adaptive_mean_k": sum(k * n for k, n in rounds_per_k.items() if isinstance(k, int)) / total if total else 0.0,
        "adaptive_costs_seconds": dict(zip(stats[0].adaptive["ks"], stats[0].adaptive["costs_seconds"], strict=True)),
    }


def acceptance(workload: Workload, k: int, temperature: float, drafter: str = DRAFT) -> dict[str, dict]:
    """Acceptance statistics at one K (no timing): {category: stats}, plus POOLED over all.

    One batch per category holds all its prompts; the pooled stats merge the counters."""
    spec = RunSpec("speculative", 1, k, temperature, drafter)
    calls = {c: workload.prepare(spec, workload.prompts_of(c)) for c in workload.category_names}
    stats = {c: call.collect(call.launch()).stats for c, call in calls.items()}  # one program each
    return {**{c: merge_stats([s]) for c, s in stats.items()}, POOLED: merge_stats(list(stats.values()))}


def _row(spec: RunSpec, latency, first, outputs, tpot_target_ms, max_new_tokens) -> dict:
    """Metrics of one spec over some requests, from per-repetition, per-request seconds [R][Q]."""
    latency, first = np.asarray(latency), np.asarray(first)
    requests = latency.shape[1]
    stats = merge_stats([out.stats for out in outputs])
    tokens_per_request = spec.batch_size * max_new_tokens
    ttft = float(np.median(first))
    forwards_per_request = stats["target_forwards"] / requests
    tpot = (latency - ttft) / (max_new_tokens - 1)  # per request, seconds
    meets = tpot * 1e3 <= tpot_target_ms
    row = {
        "method": spec.method,
        "drafter": spec.drafter,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "batch_size": spec.batch_size,
        "temperature": spec.temperature,
        "max_new_tokens": max_new_tokens,
        "requests": requests,
        "latency_ms": 1e3 * median(latency.ravel()),
        "ttft_ms": 1e3 * ttft,
        "tpot_ms": 1e3 * median(tpot.ravel()),
        # A plain step or a speculative round: the loop iteration the cost model predicts.
        "ms_per_iteration": 1e3 * (median(latency.ravel()) - ttft) / max(forwards_per_request - 1, 1),
        # Per repetition: every request's tokens over the time all requests took.
        "tokens_per_second": median(tokens_per_request * requests / latency.sum(axis=1)),
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
    else:
        counters = drafter_counters([out.stats for out in outputs])
        row.update(drafter_kind=outputs[0].stats.drafter.get("kind"), drafter_counters=counters)
        if spec.adaptive:
            row.update(adaptive=True, **adaptive_counters([out.stats for out in outputs]))
        no_match = [v for name, v in counters.items() if name.endswith("no_match_rounds")]
        if no_match:  # prompt lookup (also inside a combinator): rounds it had nothing to propose
            row.update(no_match_rounds=sum(no_match), no_match_share=sum(no_match) / max(stats["rounds"], 1))
    return row


def measure(workload: Workload, specs: list[RunSpec], repeats: int, warmup: int, tpot_target_ms: float, progress=None):
    """Rows of metrics for every spec (plus the plain baseline of each), timed round-robin:
    per spec, the pooled row, then one row per category when there are several."""
    specs = list(dict.fromkeys([*(s.plain for s in specs), *specs]))  # baselines first, no duplicates
    requests = {s: workload.requests(s.batch_size) for s in specs}
    prepared = {s: [workload.prepare(s, rows) for _, rows in requests[s]] for s in specs}
    # The outputs are collected from the warm-up launch, while its program is live: the timed
    # `launch` runs one program (prefill and every round; n = 1 runs the same program), and
    # collecting with `run` instead compiled two more per shape (prefill, chunks of rounds),
    # which doubled a sweep's compile time (int8 SmolLM2 compiles ~2x longer than float32 on
    # the EPYC machine: E3 spent 414 of 698 s compiling); collecting after the timing loop
    # recompiled every program a many-drafter workload had evicted (timed_warm). A launch is
    # deterministic (its seed is in the call), so every launch gives these outputs.
    collected: dict[RunSpec, list] = {s: [] for s in specs}
    for spec, calls in prepared.items():
        for call in calls:
            state = None
            for _ in range(warmup):
                state = jax.block_until_ready(call.launch())
            collected[spec].append(None if state is None else call.collect(state))
            del state
    latency = {s: [] for s in specs}
    first = {s: [] for s in specs}
    for _ in range(repeats):
        for spec, calls in prepared.items():
            latency[spec].append([timed_warm(call.launch) for call in calls])
            first[spec].append([timed_warm(lambda call=call: call.launch(1)) for call in calls])
            if progress is not None:
                progress.update(1)
    names = workload.category_names
    categories = [POOLED, *names] if len(names) > 1 else [POOLED]
    rows, tokens = {}, {}
    for spec, calls in prepared.items():
        outputs = [
            call.collect(call.launch()) if out is None else out
            for out, call in zip(collected[spec], calls, strict=True)
        ]
        seconds, first_seconds = np.asarray(latency[spec]), np.asarray(first[spec])
        for category in categories:
            picked = [i for i, (c, _) in enumerate(requests[spec]) if category in (c, POOLED)]
            row = _row(
                spec,
                seconds[:, picked],
                first_seconds[:, picked],
                [outputs[i] for i in picked],
                tpot_target_ms,
                workload.max_new_tokens,
            )
            rows[spec, category] = {**row, "category": category}
            tokens[spec, category] = [t for i in picked for t in outputs[i].tokens]
    for (spec, category), row in rows.items():
        base = (spec.plain, category)
        row["speedup_vs_plain"] = row["tokens_per_second"] / rows[base]["tokens_per_second"]
        # Per repetition, both timed within one round-robin pass: robust to the machine drifting.
        plain_seconds = np.sum(rows[base]["latency_seconds"], axis=1)
        row["speedup_vs_plain_paired"] = median(plain_seconds / np.sum(row["latency_seconds"], axis=1))
        if spec.temperature == 0.0:  # greedy speculation must reproduce plain greedy exactly
            row["output_matches_plain"] = tokens[spec, category] == tokens[base]
    return list(rows.values())


def adaptive_specs_for(specs: list[RunSpec]) -> list[RunSpec]:
    """`adaptive: true` in a bench config: one adaptive twin per (batch, temperature, drafter)
    of its speculative specs, with K_MAX the largest K among them."""
    groups: dict[tuple, int] = {}
    for s in specs:
        if s.method == "speculative" and not s.adaptive:
            key = (s.batch_size, s.temperature, s.drafter)
            groups[key] = max(groups.get(key, 0), s.num_speculative_tokens)
    return [dataclasses.replace(RunSpec("speculative", b, k, t, d), adaptive=True) for (b, t, d), k in groups.items()]
