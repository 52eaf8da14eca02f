"""E9: static token trees against the chain, at equal verify width, on the bench's pair.

A round that verifies w positions can spend them on a chain of K = w - 1 draft tokens or
on a tree of N = w - 1 nodes (several candidates per position; the longest root path the
target agrees with is committed). At each width of the config this runs the chain and the
tree tuned to the pair (`Tree.from_acceptance` of an acceptance table measured by depth and
rank), and every preset of the config at its own width, at each temperature. Plain decoding
at that temperature is timed in the same round-robin (bench/measure.py), so every speedup
is a ratio measured side by side; greedy rows also check that the output equals plain
greedy decoding token for token.

Tuning never sees the measured prompts: the table is measured on `trees.tune_prompts`
(default: the train split of the bench's corpus domains; the bench's own prompts come from
the test split). One table per temperature serves every width, and it also gives each
row's `predicted_tokens_per_round` = 1 + tree.expected_accepted(table) (the positional
model the tuned trees maximise; for chains too, so the model's bias is visible).

Rows (per temperature, pooled over every prompt and per prompt category): tree (chain,
tuned or the preset's name), verify width N + 1, depth, tokens per round (mean acceptance
length), target forwards per generated token, tokens/s, speedup vs plain, acceptance by
depth and, for T = 0, whether the output matched plain decoding.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from specjax.api import prepare
from specjax.bench import plots
from specjax.bench.context import BenchContext
from specjax.bench.drafter_spec import Raw
from specjax.bench.experiments.shared import Experiment, one_or_swept, setting, timed_text
from specjax.bench.measure import RunSpec, Workload, pooled
from specjax.bench.prompt_sets import Prompts, describe_sources, load_prompts, parse_prompts
from specjax.config import SpeculativeConfig
from specjax.engine.tune import measure_acceptance
from specjax.trees import Tree
from specjax.trees.tree import PRESETS


@dataclasses.dataclass(frozen=True)
class Trees:
    """E9: chain vs preset and tuned token trees at equal verify width (N + 1 positions).

    At each width w: the chain of K = w - 1 and the trees tuned to the pair with w - 1
    nodes; each preset at its own width. The tuned trees come from one acceptance table
    per temperature (specjax.engine.tune.measure_acceptance), measured on `tune_prompts`,
    which should not overlap the measured prompts (default: the train split of the
    bench's corpus domains, while the bench measures the test split).
    """

    widths: list[int] = dataclasses.field(default_factory=lambda: [8, 16, 32, 64])
    presets: list[str] = dataclasses.field(default_factory=lambda: ["binary-3", "prior-16", "prior-32"])
    # One tuned tree per width for each entry: null lets it be as deep as its node count (the
    # best tree under the measured acceptance); d caps its depth at d, i.e. at d draft forwards
    # per round (Sequoia caps depth for hardware cost the same way). []: no tuned trees.
    tuned_depths: list[int | None] = dataclasses.field(default_factory=lambda: [None])
    temperatures: list[float] = dataclasses.field(default_factory=lambda: [0.0, 1.0])
    batch_size: int = 1
    tune_prompts: Prompts | list[Prompts] | Raw | None = None  # None: the bench's corpus domains, train split
    tune_max_new_tokens: int = 128  # target tokens generated per tuning prompt
    tune_max_rank: int = 8

    def __post_init__(self):
        if self.tune_prompts is not None:
            object.__setattr__(self, "tune_prompts", parse_prompts(self.tune_prompts))
        if not self.widths or any(w < 2 for w in self.widths) or len(set(self.widths)) != len(self.widths):
            raise ValueError(f"trees.widths must be distinct verify widths >= 2 (N >= 1 nodes), got {self.widths}")
        unknown = [p for p in self.presets if p not in PRESETS]
        if unknown:
            raise ValueError(f"unknown tree preset {unknown[0]!r} in trees.presets; choose from {', '.join(PRESETS)}")
        if self.batch_size < 1 or self.tune_max_new_tokens < 2 or self.tune_max_rank < 1:
            raise ValueError("trees.batch_size and tune_max_rank must be >= 1, tune_max_new_tokens >= 2")
        depths = self.tuned_depths
        if any(d is not None and d < 1 for d in depths) or len(set(depths)) != len(depths):
            raise ValueError(f"trees.tuned_depths must be distinct depth caps >= 1 (or null: no cap), got {depths}")


PLAIN = "plain"


@dataclasses.dataclass(frozen=True)
class TreeWorkload(Workload):
    """A workload whose drafter labels may name a tree: those specs verify the tree (with the
    label's drafter) instead of a chain of num_speculative_tokens."""

    trees: dict = dataclasses.field(default_factory=dict)  # drafter label -> Tree

    def prepare(self, spec: RunSpec, prompts):
        tree = self.trees.get(spec.drafter)
        if spec.method == "plain" or tree is None:
            return super().prepare(spec, prompts)
        speculative = SpeculativeConfig(tree=tree)
        return prepare(
            self.target, prompts, self.config(spec), draft=self.drafters[spec.drafter], speculative=speculative
        )


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One verify shape of E9: a chain (tree None: the ordinary chain round) or a tree."""

    label: str  # the drafter label in the round-robin, unique per temperature
    kind: str  # "chain", "tuned" or "preset"
    name: str  # "chain", "tuned" or the preset's name
    nodes: int  # K for a chain, N for a tree: drafted tokens per round
    depth: int
    tree: Tree | None  # None: a chain of `nodes`, run as num_speculative_tokens
    shape: Tree  # the tree form (a chain as Tree.chain(K)), for the prediction

    @property
    def width(self) -> int:
        return self.nodes + 1


def tune_sources(ctx: BenchContext) -> list[Prompts]:
    """The tuning prompts: the config's, else the bench's corpus domains from the train split."""
    cfg = ctx.config.trees
    if cfg.tune_prompts is not None:
        return [cfg.tune_prompts] if isinstance(cfg.tune_prompts, Prompts) else list(cfg.tune_prompts)
    corpus = [s for s in ctx.config.prompt_sources if s.file is None]
    if not corpus:
        raise ValueError("trees.tune_prompts is needed when every bench prompt comes from a file")
    return [dataclasses.replace(s, split="train", category=None) for s in corpus]


def _overlap(ctx: BenchContext, tune_prompts: list[list[int]]) -> int:
    measured = {tuple(p) for p in ctx.workload.prompts}
    return sum(tuple(p) in measured for p in tune_prompts)


def tuned_name(cap: int | None) -> str:
    return "tuned" if cap is None else f"tuned depth<={cap}"


def candidates(cfg, table: np.ndarray | None, temperature: float) -> tuple[list[Candidate], list[str]]:
    """The verify shapes at one temperature, and the tuned trees left out as duplicates (a
    capped tree equal to a tree already in, e.g. where the cap does not bind)."""
    out, skipped = [], []
    for width in sorted(cfg.widths):
        k = width - 1
        out.append(Candidate(f"chain K={k}", "chain", "chain", k, k, None, Tree.chain(k)))
        seen = set()
        for cap in cfg.tuned_depths:
            # A table with few ranks may hold fewer than k nodes within the cap: then the tree
            # is smaller, and its row sits at its own width.
            tree = Tree.from_acceptance(table if cap is None else table[:cap], k)
            name, n = tuned_name(cap), tree.num_nodes
            label = f"{name} N={n}, T={temperature:g}"  # tuned per temperature: the label names it
            if tree.paths in seen or label in (c.label for c in out):
                skipped.append(f"{name} N={k}, T={temperature:g}")
                continue
            seen.add(tree.paths)
            out.append(Candidate(label, "tuned", name, n, tree.depth, tree, tree))
    for name in cfg.presets:
        tree = Tree.preset(name)
        out.append(Candidate(name, "preset", name, tree.num_nodes, tree.depth, tree, tree))
    return out, skipped


def _by_depth(values: list[float], shown: int = 8) -> str:
    text = " ".join(f"{v:.2f}" for v in values[:shown])
    return text + (f" .. ({len(values)})" if len(values) > shown else "")


def _best(rows: list[dict]) -> dict:
    return max(rows, key=lambda r: r["tokens_per_second"])


def _summary(rows: list[dict], temperatures: list[float], tune: str, families: list[str]) -> dict:
    summary: dict = {"tuned_on": tune}
    spec = [r for r in pooled(rows) if r["method"] == "speculative"]
    for t in temperatures:
        mine = [r for r in spec if r["temperature"] == t]
        chains = [r for r in mine if r["tree_kind"] == "chain"]
        trees = [r for r in mine if r["tree_kind"] != "chain"]
        for what, group in (("chain", chains), ("tree", trees)):
            if group:
                best = _best(group)
                summary[f"best_{what}_width (T={t})"] = best["verify_width"]
                summary[f"best_{what} (T={t})"] = (
                    f"{best['tree']}: {best['tokens_per_second']:.0f} tokens/s, "
                    f"{best['speedup_vs_plain']:.2f}x plain ({best['speedup_vs_plain_paired']:.2f}x paired), "
                    f"{best['mean_acceptance_length']:.2f} tokens/round"
                )
        for family in families:
            tuned = {r["verify_width"]: r for r in mine if r["tree"] == family}
            pairs = [(r["verify_width"], tuned[r["verify_width"]], r) for r in chains if r["verify_width"] in tuned]
            if not pairs:
                continue
            summary[f"{family}_vs_chain_tokens_per_round (T={t})"] = {
                str(w): f"{a['mean_acceptance_length']:.3f} vs {c['mean_acceptance_length']:.3f}"
                + (" (same shape)" if a["tree_is_chain"] else f" (depth {a['tree_depth']})")
                for w, a, c in pairs
            }
            summary[f"{family}_at_or_above_chain (T={t})"] = all(
                a["mean_acceptance_length"] >= c["mean_acceptance_length"] for _, a, c in pairs
            )
            # Where the tuned tree is the chain itself, the two rows differ only by sampling noise
            # (T > 0; at T = 0 they are equal): the comparison that tests tuning is where they differ.
            differ = [(a, c) for _, a, c in pairs if not a["tree_is_chain"]]
            if differ and len(differ) < len(pairs):
                summary[f"{family}_at_or_above_chain_where_shapes_differ (T={t})"] = all(
                    a["mean_acceptance_length"] >= c["mean_acceptance_length"] for a, c in differ
                )
    greedy = [r for r in spec if r["temperature"] == 0.0]
    if greedy:
        summary["greedy_outputs_match_plain"] = all(r["output_matches_plain"] for r in greedy)
    return summary


def run(ctx: BenchContext) -> dict:
    cfg = ctx.config.trees
    drafter = ctx.draft
    widest = max(w - 1 for w in cfg.widths)
    caps = cfg.tuned_depths
    depth = widest if None in caps else min(widest, max(caps, default=1))
    sources = tune_sources(ctx) if caps else []
    tune_prompts = load_prompts(sources, ctx.target.tokenizer).tokens if caps else []
    tables = {}
    if caps:
        for t in cfg.temperatures:
            tables[t] = measure_acceptance(
                ctx.target,
                drafter,
                tune_prompts,
                temperature=t,
                max_new_tokens=cfg.tune_max_new_tokens,
                max_depth=depth,
                max_rank=cfg.tune_max_rank,
                seed=ctx.config.seed,
            )
    by_temperature, skipped = {}, []
    for t in cfg.temperatures:
        by_temperature[t], left_out = candidates(cfg, tables.get(t), t)
        skipped += left_out
    labels = {c.label: c for group in by_temperature.values() for c in group}
    for c in labels.values():  # fail now, not after minutes of timing
        if c.tree is not None:
            drafter.check_tree(ctx.target.config, c.tree)
        else:
            drafter.check(ctx.target.config, c.nodes)
    workload = TreeWorkload(
        **{f.name: getattr(ctx.workload, f.name) for f in dataclasses.fields(Workload)},
        trees={label: c.tree for label, c in labels.items() if c.tree is not None},
    ).with_drafters({label: drafter for label in labels})
    specs = []
    for t, group in by_temperature.items():
        specs += [RunSpec("speculative", cfg.batch_size, c.nodes, t, c.label) for c in group]
    rows = ctx.measure(specs, "E9 trees", workload)

    for row in rows:
        if row["method"] == "plain":
            row.update(tree=PLAIN, tree_kind=PLAIN, verify_width=1, tree_depth=0, tree_is_chain=False)
            continue
        c = labels[row["drafter"]]
        row.update(
            tree=c.name,
            tree_kind=c.kind,
            verify_width=c.width,
            tree_depth=c.depth,
            tree_is_chain=c.shape.is_chain,
            acceptance_by_depth=_by_depth(row["accepted_per_position"]),
        )
        if row["temperature"] in tables:
            row["predicted_tokens_per_round"] = 1.0 + c.shape.expected_accepted(tables[row["temperature"]])
    kinds = {PLAIN: 0, "chain": 1, "tuned": 2, "preset": 3}
    families = [tuned_name(cap) for cap in caps]
    rows.sort(
        key=lambda r: (
            r["temperature"],
            ctx.categories.index(r["category"]),
            r["verify_width"],
            kinds[r["tree_kind"]],
            families.index(r["tree"]) if r["tree_kind"] == "tuned" else 0,
            r["tree"],
        )
    )
    tune = "no tuned trees (trees.tuned_depths is empty)"
    if caps:
        measured = describe_sources(ctx.config.prompt_sources)
        tune = (
            f"{describe_sources(sources)}: {len(tune_prompts)} prompts, {cfg.tune_max_new_tokens} target tokens each, "
            f"depth <= {depth}, rank < {cfg.tune_max_rank}; measured prompts: {measured}"
            f" ({_overlap(ctx, tune_prompts)} prompts in both)"
        )
    return {
        "claim": "at equal verify width, a tree tuned to the pair yields at least the chain's tokens per round; "
        "whether that buys wall time depends on what a wider verify costs",
        "rows": rows,
        "acceptance_tables": {f"temperature={t}": table.tolist() for t, table in tables.items()},
        "tuned_trees": {
            f"temperature={t}": {c.label: [list(p) for p in c.tree.paths] for c in group if c.kind == "tuned"}
            for t, group in by_temperature.items()
        },
        "tuned_left_out_as_duplicates": skipped,
        "summary": _summary(rows, cfg.temperatures, tune, families),
    }


def describe(ctx: BenchContext) -> dict:
    cfg = ctx.config.trees
    batch, temperature = one_or_swept("batch", [cfg.batch_size]), one_or_swept("temperature", cfg.temperatures)
    return setting(ctx, batch, temperature, [timed_text(ctx)])


def plot(result: dict, path: Path, title: str) -> Path:
    """Tokens per round (top) and speedup vs plain (bottom) against verify width, one column per
    temperature: the chain and each family of tuned trees as lines (dotted: the tuning table's
    prediction), each preset as a point; a star marks the width with the best wall time (most
    tokens/s), grey rings the best chain and the best tree."""
    rows = [r for r in pooled(result["rows"]) if r["method"] == "speculative"]
    temperatures = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(2, len(temperatures), figsize=(6.5 * len(temperatures), 8), squeeze=False)
    for column, t in enumerate(temperatures):
        mine = [r for r in rows if r["temperature"] == t]
        best = max(mine, key=lambda r: r["tokens_per_second"])
        for line, (key, label) in enumerate(
            (("mean_acceptance_length", "tokens per round"), ("speedup_vs_plain", "speedup vs plain (tokens/s)"))
        ):
            ax = axes[line, column]
            families = ["chain", *dict.fromkeys(r["tree"] for r in mine if r["tree_kind"] == "tuned")]
            for i, family in enumerate(families):
                group = sorted((r for r in mine if r["tree"] == family), key=lambda r: r["verify_width"])
                widths = [r["verify_width"] for r in group]
                plots._measured(ax, widths, group, key, "o-" if i == 0 else "s-", color=f"C{i}", label=family)
                if line == 0 and "predicted_tokens_per_round" in group[0]:
                    predicted = [r["predicted_tokens_per_round"] for r in group]
                    ax.plot(widths, predicted, ":", color=f"C{i}", lw=0.9, label=f"{family}, predicted")
            presets = [r for r in mine if r["tree_kind"] == "preset"]
            for i, r in enumerate(presets):
                name = f"preset {r['tree']} (width {r['verify_width']})"
                plots._measured(ax, [r["verify_width"]], [r], key, "D", color=f"C{i + len(families)}", label=name)
            for kind in ("chain", "tree"):
                group = [r for r in mine if (r["tree_kind"] == "chain") == (kind == "chain")]
                if group:
                    b = max(group, key=lambda r: r["tokens_per_second"])
                    ax.plot([b["verify_width"]], [b[key]], "o", ms=14, mfc="none", mec="gray", zorder=3)
            ax.plot(
                [best["verify_width"]],
                [best[key]],
                "r*",
                ms=16,
                zorder=4,
                label=f"best wall time: {best['tree']}, width {best['verify_width']}",
            )
            if line == 1:
                ax.axhline(1.0, color="gray", lw=0.8)
            ax.set_xscale("log", base=2)
            widths = sorted({r["verify_width"] for r in mine if r["tree_kind"] != "preset"})  # presets: legend
            ax.set_xticks(widths, [str(w) for w in widths], fontsize=8)
            ax.minorticks_off()
            ax.set(xlabel="verify width (positions per target forward = N + 1)", ylabel=label)
            ax.set_title(f"{title}, T={t}" if line == 0 else f"{label}, T={t} (ring: best chain / best tree)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    return plots._save(fig, path, result)


EXPERIMENT = Experiment(
    id="E9",
    name="trees",
    section=Trees,
    run=run,
    plot=plot,
    setting=describe,
    columns=[
        "temperature",
        "tree",
        "verify_width",
        "tree_depth",
        "mean_acceptance_length",
        "predicted_tokens_per_round",
        "target_forwards_per_token",
        "tokens_per_second",
        "speedup_vs_plain",
        "speedup_vs_plain_paired",
        "acceptance_by_depth",
        "output_matches_plain",
    ],
)
