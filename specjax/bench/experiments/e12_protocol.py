"""E12: the benchmark protocol the field reports (SPEED-Bench, arXiv 2604.09557), on our own prompts.

Two splits, from configs/prompts/protocol/ (built by scripts/make_protocol_prompts.py; its
DATASHEET.md says what is in them and how they differ from SPEED-Bench's):
  qualitative  11 categories (coding ... multilingual): per category, the mean acceptance length
               and the speedup over plain decoding at batch 1, at each temperature (T = 0 and
               T = 1), for each drafter: the paper's per-category table. A multi-turn record is
               replayed: the target answers each earlier turn (plain, greedy, at most
               max_new_tokens), and every turn is one prompt, the conversation so far
               awaiting its reply.
  throughput   long-input requests in input-length buckets (1k ... 8k tokens for SmolLM2,
               bytes_256 / bytes_768 for the byte-level pair): per bucket x batch size, plain
               and speculative tokens/s at each K, the best K and its speedup: the paper's
               throughput table (concurrency here is the batch size of one request).
Every speedup is a ratio to plain decoding timed in the same round-robin (bench/measure.py; the
qualitative split times its drafters `drafters_per_group` at a time, each group with its plain).
Prompts whose tokens + max_new_tokens + K + 1 exceed the target's positions are skipped and
counted (the byte pair's 1,024 positions drop the longest RAG passages).

The report's tables in the paper's layout (drafters x categories; buckets x batch sizes) are in
results.json (`tables`) and in e12_protocol.md beside the plot.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import matplotlib.pyplot as plt

from specjax.api import generate
from specjax.bench import plots
from specjax.bench.context import BenchContext, describe_drafter
from specjax.bench.experiments.shared import (
    Experiment,
    Method,
    check_ks,
    check_sizes,
    one_or_swept,
    setting,
    timed_text,
)
from specjax.bench.measure import DRAFT, POOLED, RunSpec, Workload
from specjax.bench.prompt_sets import Chat, encode
from specjax.config import GenerationConfig


@dataclasses.dataclass(frozen=True)
class Protocol:
    """E12: SPEED-Bench's qualitative and throughput splits on configs/prompts/protocol/."""

    prompt_dir: str = "configs/prompts/protocol"  # qualitative.jsonl and throughput_<bucket>.jsonl
    chat_template: bool = False  # render turns with the target's chat template (SmolLM2: true)
    # Drafters by label, as E8's `methods.drafters`; empty: the bench's `draft` (label "draft").
    drafters: list[Method] = dataclasses.field(default_factory=list)
    # Qualitative split (batch 1). categories: empty = every one; per_category: the first N of each.
    qualitative: bool = True
    categories: list[str] = dataclasses.field(default_factory=list)
    per_category: int | None = None
    multi_turn: bool = True  # replay later turns after the target's own answers (False: first turns only)
    drafters_per_group: int = 2  # drafters per timed round-robin (each group beside its own plain)
    temperatures: list[float] = dataclasses.field(default_factory=lambda: [0.0, 1.0])
    num_speculative_tokens: int = 4
    # Throughput split: buckets (file stems after "throughput_"), batch sizes and the K swept.
    buckets: list[str] = dataclasses.field(default_factory=lambda: ["bytes_256"])
    per_bucket: int | None = None
    batch_sizes: list[int] = dataclasses.field(default_factory=lambda: [1, 4, 16])
    ks: list[int] = dataclasses.field(default_factory=lambda: [2, 4])
    throughput_temperature: float = 0.0
    throughput_new_tokens: int | None = None  # new tokens per row (None: the bench's max_new_tokens)
    throughput_drafters: list[str] = dataclasses.field(default_factory=list)  # labels; empty: every drafter
    # Skip a bucket's batch sizes whose rows x (input + new tokens) exceed this (the KV cache's
    # size: SmolLM2 holds 46 kB per token in float32); None: run every batch size.
    max_batch_tokens: int | None = None

    def __post_init__(self):
        check_ks([self.num_speculative_tokens, *self.ks])
        check_sizes(self.batch_sizes)
        if self.drafters_per_group < 1:
            raise ValueError(f"protocol.drafters_per_group must be at least 1, got {self.drafters_per_group}")
        names = [m.name for m in self.drafters]
        if len(set(names)) != len(names) or "none" in names:
            raise ValueError(f"protocol.drafters need unique names other than 'none': {names}")
        for count, what in ((self.per_category, "per_category"), (self.per_bucket, "per_bucket")):
            if count is not None and count < 1:
                raise ValueError(f"protocol.{what} must be >= 1, got {count}")
        if self.throughput_new_tokens is not None and self.throughput_new_tokens < 2:
            raise ValueError("protocol.throughput_new_tokens must be >= 2")
        if not self.qualitative and not self.buckets:
            raise ValueError("protocol: nothing to run (qualitative: false and no buckets)")


def _read(path: Path) -> list[dict]:
    if not path.is_file():
        raise ValueError(
            f"protocol: {path} does not exist (paths are relative to the working directory; "
            "python scripts/make_protocol_prompts.py builds them)"
        )
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _drafters(ctx: BenchContext) -> dict:
    cfg = ctx.config.protocol
    found = {DRAFT: ctx.draft} if not cfg.drafters else {}
    for m in cfg.drafters:
        found[m.name] = ctx.draft if m.draft is None else ctx.build_drafter(m.draft)
    # Each drafter drafts the qualitative K; the throughput drafters also every K swept (a
    # 4-head Medusa can be in the qualitative table while the throughput split sweeps K = 6).
    timed = set(cfg.throughput_drafters or found)
    for name, drafter in found.items():
        drafter.check(ctx.target.config, max([cfg.num_speculative_tokens, *(cfg.ks if name in timed else [])]))
    unknown = [name for name in cfg.throughput_drafters if name not in found]
    if unknown:
        raise ValueError(f"protocol.throughput_drafters: no drafter {unknown[0]!r}; drafters: {list(found)}")
    return found


def _fits(ctx: BenchContext, tokens: list[int], new_tokens: int, k: int) -> bool:
    return len(tokens) + new_tokens + k + 1 <= ctx.target.config.max_position_embeddings


def _conversation(turns: list[str], replies: list[str], chat: bool):
    """The prompt of turn len(replies): the earlier turns with the target's replies, awaiting its answer."""
    said = []  # (role, text) in order: turn 1, reply 1, turn 2, ...
    for i, turn in enumerate(turns[: len(replies) + 1]):
        said.append(("user", turn))
        if i < len(replies):
            said.append(("assistant", replies[i]))
    if chat:
        return Chat(tuple({"role": role, "content": text} for role, text in said))
    return "\n\n".join(text for _, text in said)  # a byte-level model reads the conversation as text


def qualitative_prompts(ctx: BenchContext) -> tuple[list[list[int]], list[str], dict]:
    """Token ids and category of every turn to measure, and the count of prompts skipped per category."""
    cfg, tokenizer = ctx.config.protocol, ctx.target.tokenizer
    records = _read(Path(cfg.prompt_dir) / "qualitative.jsonl")
    if cfg.categories:
        known = list(dict.fromkeys(r["category"] for r in records))
        missing = [c for c in cfg.categories if c not in known]
        if missing:
            raise ValueError(f"protocol.categories: no category {missing[0]!r}; the file has {known}")
        records = [r for r in records if r["category"] in cfg.categories]
    if cfg.per_category:  # the first N of each category, in file order
        taken: dict[str, int] = {}
        kept = []
        for r in records:
            taken[r["category"]] = taken.get(r["category"], 0) + 1
            if taken[r["category"]] <= cfg.per_category:
                kept.append(r)
        records = kept
    new, k = ctx.config.max_new_tokens, cfg.num_speculative_tokens
    turns = [r["turns"] if cfg.multi_turn else r["turns"][:1] for r in records]
    replies: list[list[str]] = [[] for _ in records]
    skipped: dict[str, int] = {}
    prompts: list[tuple[int, list[int]]] = []  # (record, tokens) of every turn, in record order
    alive = list(range(len(records)))
    for depth in range(max(len(t) for t in turns)):
        current = [(i, encode(tokenizer, _conversation(turns[i], replies[i], cfg.chat_template), cfg.chat_template))
                   for i in alive if depth < len(turns[i])]  # fmt: skip
        for i, tokens in current:
            if not _fits(ctx, tokens, new, k):
                skipped[records[i]["category"]] = skipped.get(records[i]["category"], 0) + 1
        current = [(i, t) for i, t in current if _fits(ctx, t, new, k)]
        prompts += current
        alive = [i for i, _ in current if depth + 1 < len(turns[i])]
        if alive:  # the target's own greedy answers to this turn, for the next one
            config = GenerationConfig.at_temperature(0.0, max_new_tokens=new, seed=ctx.config.seed)
            by_record = dict(current)
            out = generate(ctx.target, [by_record[i] for i in alive], config)
            for i, reply in zip(alive, out.tokens, strict=True):
                replies[i].append(tokenizer.decode(reply, skip_special_tokens=True).strip())
    prompts.sort(key=lambda p: p[0])
    return [t for _, t in prompts], [records[i]["category"] for i, _ in prompts], skipped


def _qualitative(ctx: BenchContext, drafters: dict) -> tuple[list[dict], dict]:
    cfg = ctx.config.protocol
    tokens, categories, skipped = qualitative_prompts(ctx)
    if not tokens:
        raise ValueError("protocol: every qualitative prompt is longer than the target's positions allow")
    workload = Workload(ctx.target, drafters, tokens, categories, ctx.config.max_new_tokens, ctx.config.seed)
    # Every prompt length is a program per drafter and temperature: a dozen drafters in one
    # round-robin outgrow the programs a process keeps alive (runtime.bound_live_programs), and
    # each pass would recompile them all. So drafters are timed a group at a time, each group
    # round-robin with its own plain baseline (its rows carry `timing_group`).
    names, rows = list(drafters), []
    for group, start in enumerate(range(0, len(names), cfg.drafters_per_group)):
        chosen = names[start : start + cfg.drafters_per_group]
        specs = [RunSpec("speculative", 1, cfg.num_speculative_tokens, t, n) for t in cfg.temperatures for n in chosen]
        label = f"E12 qualitative ({start + 1}-{start + len(chosen)} of {len(names)} drafters)"
        # Each group stands alone (its own plain), so a killed run resumes at the next group.
        measured = ctx.parts.get_or_run(f"protocol/qualitative/{','.join(chosen)}", ctx.measure, specs, label, workload)
        rows += [{**row, "timing_group": group} for row in measured]
        if ctx.config.clear_caches:
            # The next group starts with no programs alive: none is evicted under its timing.
            jax.clear_caches()
    for row in rows:
        row["split"] = "qualitative"
    counts = {c: categories.count(c) for c in dict.fromkeys(categories)}
    return rows, {"turns_per_category": counts, "skipped_per_category": skipped}


def _throughput(ctx: BenchContext, drafters: dict) -> tuple[list[dict], dict]:
    cfg, rows, counts = ctx.config.protocol, [], {}
    new = cfg.throughput_new_tokens or ctx.config.max_new_tokens
    names = cfg.throughput_drafters or list(drafters)
    for bucket in cfg.buckets:
        records = _read(Path(cfg.prompt_dir) / f"throughput_{bucket}.jsonl")[: cfg.per_bucket]
        tokens = [encode(ctx.target.tokenizer, r["turns"][0], cfg.chat_template) for r in records]
        longest = max(map(len, tokens))
        if not _fits(ctx, [0] * longest, new, max(cfg.ks)):
            raise ValueError(
                f"protocol: bucket {bucket!r} ({longest} tokens) + {new} new tokens + K + 1 exceeds the target's "
                f"{ctx.target.config.max_position_embeddings} positions: pick buckets that fit, or fewer new tokens"
            )
        batches = [
            b for b in cfg.batch_sizes if not cfg.max_batch_tokens or b * (longest + new) <= cfg.max_batch_tokens
        ]
        counts[bucket] = {"requests": len(tokens), "input_tokens": longest, "batch_sizes": batches}
        if not batches:
            continue
        workload = Workload(
            ctx.target, {n: drafters[n] for n in names}, tokens, [bucket] * len(tokens), new, ctx.config.seed
        )
        specs = [
            RunSpec("speculative", b, k, cfg.throughput_temperature, n) for b in batches for k in cfg.ks for n in names
        ]
        measured = ctx.parts.get_or_run(
            f"protocol/throughput/{bucket}", ctx.measure, specs, f"E12 throughput {bucket}", workload
        )
        for row in measured:
            rows.append({**row, "split": "throughput", "category": bucket, "input_tokens": longest})
    return rows, counts


def best_k_rows(rows: list[dict]) -> list[dict]:
    """Per bucket x batch size x drafter: plain tokens/s, the best K's tokens/s and speedup."""
    out = []
    plain = {(r["category"], r["batch_size"]): r for r in rows if r["split"] == "throughput" and r["method"] == "plain"}
    spec = [r for r in rows if r["split"] == "throughput" and r["method"] == "speculative"]
    for key in dict.fromkeys((r["category"], r["batch_size"], r["drafter"]) for r in spec):
        mine = [r for r in spec if (r["category"], r["batch_size"], r["drafter"]) == key]
        best = max(mine, key=lambda r: r["tokens_per_second"])
        out.append({
            "bucket": key[0], "batch_size": key[1], "drafter": key[2],
            "plain_tokens_per_second": plain[key[:2]]["tokens_per_second"],
            "best_k": best["num_speculative_tokens"], "tokens_per_second": best["tokens_per_second"],
            "speedup_vs_plain": best["speedup_vs_plain"],
            "speedup_by_k": {r["num_speculative_tokens"]: round(r["speedup_vs_plain"], 3) for r in mine},
        })  # fmt: skip
    return out


def tables(rows: list[dict], best: list[dict]) -> dict[str, str]:
    """Markdown tables in the paper's layout: acceptance length and speedup per category
    (drafter x temperature by category, and overall), and throughput per bucket x batch size."""
    out = {}
    qual = [r for r in rows if r["split"] == "qualitative" and r["method"] == "speculative"]
    if qual:
        categories = [c for c in dict.fromkeys(r["category"] for r in qual) if c != POOLED] + [POOLED]
        for key, label in (("mean_acceptance_length", "acceptance length"), ("speedup_vs_plain", "speedup")):
            lines = [f"| drafter | T | {' | '.join('overall' if c == POOLED else c for c in categories)} |"]
            lines.append("|---|---|" + "---|" * len(categories))
            for drafter, t in dict.fromkeys((r["drafter"], r["temperature"]) for r in qual):
                cells = {r["category"]: r[key] for r in qual if (r["drafter"], r["temperature"]) == (drafter, t)}
                values = [f"{cells[c]:.2f}" if c in cells else "" for c in categories]
                lines.append(f"| {drafter} | {t:g} | {' | '.join(values)} |")
            out[f"qualitative {label}"] = "\n".join(lines)
    if best:
        drafters = list(dict.fromkeys(b["drafter"] for b in best))
        head = "| bucket | batch | plain tok/s | " + " | ".join(f"{d}: best K, tok/s, speedup" for d in drafters) + " |"
        lines = [head, "|---|---|---|" + "---|" * len(drafters)]
        for bucket, batch in dict.fromkeys((b["bucket"], b["batch_size"]) for b in best):
            mine = {b["drafter"]: b for b in best if (b["bucket"], b["batch_size"]) == (bucket, batch)}
            plain = next(iter(mine.values()))["plain_tokens_per_second"]
            cells = [
                f"K={b['best_k']}, {b['tokens_per_second']:.1f}, {b['speedup_vs_plain']:.2f}x" for b in mine.values()
            ]
            lines.append(f"| {bucket} | {batch} | {plain:.1f} | {' | '.join(cells)} |")
        out["throughput"] = "\n".join(lines)
    return out


def run(ctx: BenchContext) -> dict:
    cfg = ctx.config.protocol
    drafters = _drafters(ctx)
    rows, qualitative, throughput = [], {}, {}
    if cfg.qualitative:
        found, qualitative = _qualitative(ctx, drafters)
        rows += found
    if cfg.buckets:
        found, throughput = _throughput(ctx, drafters)
        rows += found
    best = best_k_rows(rows)
    summary = {}
    for r in rows:
        if r["split"] == "qualitative" and r["method"] == "speculative" and r["category"] == POOLED:
            summary[f"acceptance length ({r['drafter']}, T={r['temperature']:g})"] = r["mean_acceptance_length"]
            summary[f"speedup ({r['drafter']}, T={r['temperature']:g})"] = r["speedup_vs_plain"]
    for b in best:
        summary[f"best K, speedup ({b['bucket']}, batch {b['batch_size']}, {b['drafter']})"] = (
            f"K={b['best_k']}, {b['speedup_vs_plain']:.3f}x"
        )
    greedy = [r for r in rows if r["method"] == "speculative" and r["temperature"] == 0.0]
    if greedy:
        summary["greedy_outputs_match_plain"] = all(r["output_matches_plain"] for r in greedy)
    specs = {m.name: m.draft for m in cfg.drafters}
    described = {
        name: describe_drafter(d, specs.get(name) or (None if ctx.given_draft else ctx.config.draft))
        for name, d in drafters.items()
    }
    return {
        "claim": "SPEED-Bench's protocol on our prompts: acceptance differs by category, and the best K by batch size",
        "rows": rows,
        "best_k": best,
        "tables": tables(rows, best),
        "qualitative": qualitative,
        "throughput": throughput,
        "drafters": described,
        "summary": summary,
        # Parts a killed run had finished, read back from finished_parts.json (bench/finished_parts.py).
        "resumed_parts": [k for k in ctx.parts.resumed if k.startswith("protocol/")],
    }


def describe(ctx: BenchContext) -> dict:
    cfg = ctx.config.protocol
    extra = []
    if cfg.qualitative:
        n = f"first {cfg.per_category} per category" if cfg.per_category else "every prompt"
        extra.append(
            f"qualitative: batch 1, K={cfg.num_speculative_tokens}, {n}, {ctx.config.max_new_tokens} new tokens"
        )
    if cfg.buckets:
        new = cfg.throughput_new_tokens or ctx.config.max_new_tokens
        extra.append(
            f"throughput: buckets {', '.join(cfg.buckets)}, batch sizes {', '.join(map(str, cfg.batch_sizes))}, "
            f"K {', '.join(map(str, cfg.ks))}, T={cfg.throughput_temperature:g}, {new} new tokens"
        )
    extra.append(timed_text(ctx))
    batches = one_or_swept("batch", [1, *cfg.batch_sizes] if cfg.buckets else [1])
    temperatures = one_or_swept("temperature", [*cfg.temperatures, cfg.throughput_temperature])
    return setting(ctx, batches, temperatures, extra, prompts=False)


def plot(result: dict, path: Path, title: str) -> Path:
    """Top: acceptance length and speedup per category (bars per drafter and temperature).
    Bottom: throughput (plain and the best K) and the best K's speedup against batch size, per
    bucket. Also writes the tables in the paper's layout to <path>.md."""
    rows = result["rows"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    qual = [r for r in rows if r["split"] == "qualitative" and r["method"] == "speculative"]
    categories = [c for c in dict.fromkeys(r["category"] for r in qual) if c != POOLED] + ([POOLED] if qual else [])
    series = list(dict.fromkeys((r["drafter"], r["temperature"]) for r in qual))
    width = 0.8 / max(len(series), 1)
    for ax, key, label in (
        (axes[0, 0], "mean_acceptance_length", "mean acceptance length"),
        (axes[0, 1], "speedup_vs_plain", "speedup vs plain (batch 1)"),
    ):
        for i, (drafter, t) in enumerate(series):
            cells = {r["category"]: r for r in qual if (r["drafter"], r["temperature"]) == (drafter, t)}
            present = [c for c in categories if c in cells]
            x = [categories.index(c) + (i - (len(series) - 1) / 2) * width for c in present]
            picked = [cells[c] for c in present]
            ax.bar(x, [r[key] for r in picked], width, yerr=plots.spread(picked, key), capsize=2,
                   label=f"{drafter}, T={t:g}", hatch="//" if t else None, color=f"C{i % 10}")  # fmt: skip
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks(range(len(categories)), ["overall" if c == POOLED else c for c in categories],
                      rotation=35, ha="right", fontsize=8)  # fmt: skip
        ax.set(ylabel=label, title=f"{title}: qualitative, {label}" if key != "speedup_vs_plain" else label)
        ax.grid(alpha=0.3, axis="y")
        if series:
            ax.legend(fontsize=7)
    best = result.get("best_k", [])
    ax, ax2 = axes[1, 0], axes[1, 1]
    for i, (bucket, drafter) in enumerate(dict.fromkeys((b["bucket"], b["drafter"]) for b in best)):
        mine = [b for b in best if (b["bucket"], b["drafter"]) == (bucket, drafter)]
        batches = [b["batch_size"] for b in mine]
        ax.plot(
            batches, [b["plain_tokens_per_second"] for b in mine], "--", color=f"C{i % 10}", label=f"{bucket}: plain"
        )
        ax.plot(
            batches,
            [b["tokens_per_second"] for b in mine],
            "o-",
            color=f"C{i % 10}",
            label=f"{bucket}, {drafter}: best K",
        )
        ax2.plot(batches, [b["speedup_vs_plain"] for b in mine], "o-", color=f"C{i % 10}", label=f"{bucket}, {drafter}")
        for b in mine:
            ax2.annotate(f"K={b['best_k']}", (b["batch_size"], b["speedup_vs_plain"]), fontsize=7,
                         textcoords="offset points", xytext=(3, 4))  # fmt: skip
    ax.set(
        xlabel="batch size", ylabel="total tokens/s", title="throughput split: tokens/s (best K solid, plain dashed)"
    )
    ax2.set(xlabel="batch size", ylabel="speedup vs plain (best K)", title="throughput split: speedup at the best K")
    ax2.axhline(1.0, color="gray", lw=0.8)
    for a in (ax, ax2):
        if best:
            a.set_xscale("log", base=2)
            a.legend(fontsize=7)
        a.grid(alpha=0.3)
    text = "\n\n".join(f"## {name}\n\n{table}" for name, table in result.get("tables", {}).items())
    Path(path).with_suffix(".md").write_text(f"# {title}\n\n{text}\n")
    return plots._save(fig, path, result)


EXPERIMENT = Experiment(
    id="E12",
    name="protocol",
    section=Protocol,
    run=run,
    plot=plot,
    setting=describe,
    ks=lambda cfg: [cfg.num_speculative_tokens, *cfg.ks],
    columns=[
        "split",
        "category",
        "drafter",
        "temperature",
        "batch_size",
        "num_speculative_tokens",
        "tokens_per_second",
        "speedup_vs_plain",
        "mean_acceptance_length",
        "output_matches_plain",
    ],
)
