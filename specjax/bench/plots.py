"""One PNG per experiment. Measured values are solid markers, predictions dashed lines.

Rows of one prompt category are left out (the CSVs and tables have them): each plot
shows the rows pooled over every prompt, except E8's, which groups its bars by category.
Timed values are medians over the repeats; where the rows carry the repeats
(`<key>_repeats`), error bars span their min to max. A line under each figure says what it
was measured at: batch size, temperature and prompt count, or which of them it sweeps
(the experiment's `setting`).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from specjax.bench.measure import POOLED, pooled

_P_FLOOR = 1e-20


def _integer_x(*axes) -> None:
    """K and forward widths are integers: no 1.5 ticks."""
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


_SETTING_FONT = 8


def _save(fig, path: Path, result: dict | None = None) -> Path:
    """Write the figure, with the experiment's setting line (batch, temperature, prompts) under it."""
    text = ((result or {}).get("setting") or {}).get("text")
    if text:
        chars = int(fig.get_figwidth() * 72 / (0.55 * _SETTING_FONT))  # characters that fit a line
        lines = textwrap.wrap(text, chars, break_on_hyphens=False)
        fig.text(0.5, 0.012, "\n".join(lines), ha="center", va="bottom", fontsize=_SETTING_FONT, color="0.25")
        bottom = (0.06 + 0.14 * len(lines)) / fig.get_figheight()
        fig.tight_layout(rect=(0, bottom, 1, 1))
    else:
        fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


save = _save  # for the plots kept beside their experiments (scaling.py, adaptive.py)


def spread(rows: list[dict], key: str, scale: float = 1.0) -> list[list[float]] | None:
    """Error bars [below, above] around each row's `key` spanning the min and max of its
    `<key>_repeats`; None unless every row carries them."""
    if not rows or any(f"{key}_repeats" not in r for r in rows):
        return None
    below = [max(scale * (r[key] - min(r[f"{key}_repeats"])), 0.0) for r in rows]
    above = [max(scale * (max(r[f"{key}_repeats"]) - r[key]), 0.0) for r in rows]
    return [below, above]


def _measured(ax, x, rows: list[dict], key: str, fmt: str, scale: float = 1.0, **kwargs):
    """Measured medians as a line or markers, with min-max error bars where the rows have repeats
    (drawn apart, unlabelled, so the legend keeps the order the lines were drawn in)."""
    y = [scale * r[key] for r in rows]
    (line,) = ax.plot(x, y, fmt, **kwargs)
    yerr = spread(rows, key, scale)
    if yerr is not None:
        ax.errorbar(x, y, yerr=yerr, fmt="none", ecolor=line.get_color(), capsize=3, elinewidth=0.9, zorder=line.zorder)
    return line


def _plain_band(ax, rows: list[dict]) -> None:
    """Plain decoding's own repeat spread around 1 (speedup vs plain is relative to its median)."""
    plain = [r for r in pooled(rows) if r["method"] == "plain" and "speedup_vs_plain_repeats" in r]
    if len(plain) == 1:
        values = plain[0]["speedup_vs_plain_repeats"]
        ax.axhspan(min(values), max(values), color="0.5", alpha=0.18, lw=0, label="plain decoding: min-max of repeats")


def optimum(rows: list[dict], x_key: str, y_key: str = "speedup_vs_plain") -> tuple:
    """(x, y) of the row with the largest `y_key`: where an optimum marker goes."""
    best = max(rows, key=lambda r: r[y_key])
    return best[x_key], best[y_key]


def _spec(rows):
    return [r for r in pooled(rows) if r["method"] == "speculative"]


def tokens_per_round(result: dict, path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, temperature in enumerate(sorted({r["temperature"] for r in result["rows"]})):
        rows = [r for r in pooled(result["rows"]) if r["temperature"] == temperature]
        ks = [r["num_speculative_tokens"] for r in rows]
        color = f"C{i}"
        ax.plot(
            ks, [r["measured_tokens_per_round"] for r in rows], "o-", color=color, label=f"measured, T={temperature}"
        )
        ax.plot(ks, [r["predicted_geometric"] for r in rows], "--", color=color, label="1+a+...+a^K (pooled a)")
        ax.plot(ks, [r["predicted_per_position"] for r in rows], ":", color=color, label="product of measured a_i")
    ax.set(xlabel="K (draft tokens per round)", ylabel="tokens per round", title=title)
    _integer_x(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path, result)


def verify_cost(result: dict, path: Path, title: str) -> Path:
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, batch in enumerate(sorted({r["batch_size"] for r in result["rows"]})):
        rows = [r for r in result["rows"] if r["batch_size"] == batch]
        widths = [r["width"] for r in rows]
        ax.plot(widths, [r["relative_cost"] for r in rows], "o-", color=f"C{i}", label=f"measured, batch {batch}")
        ax.plot(widths, [r["roofline_relative_cost"] for r in rows], "--", color=f"C{i}", label="roofline estimate")
        ax2.plot(widths, [r["arithmetic_intensity"] for r in rows], "o-", color=f"C{i}", label=f"batch {batch}")
    widths = sorted({r["width"] for r in result["rows"]})
    ax.plot(widths, widths, color="gray", lw=0.8, label="w separate forwards")
    ax.axhline(1.0, color="gray", lw=0.8, ls=":")
    ax.set(xlabel="forward width w (tokens per row)", ylabel="cost relative to w = 1", title=title)
    balance = result["summary"]["machine_balance_flops_per_byte"]
    ax2.axhline(balance, color="red", lw=0.8, ls="--", label=f"machine balance {balance:.0f} FLOP/B")
    ax2.set(xlabel="forward width w", ylabel="FLOPs per byte moved", title="arithmetic intensity (estimate)")
    ax2.set_yscale("log")
    _integer_x(ax, ax2)
    for a in (ax, ax2):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    return _save(fig, path, result)


def k_sweep(result: dict, path: Path, title: str) -> Path:
    """Measured (with the repeats' spread) and predicted speedup against K; a filled star on the
    measured optimum, a hollow one on the predicted; an adaptive twin (`adaptive: true`) as its
    own marker, outside the sweep."""
    spec = _spec(result["rows"])
    rows = [r for r in spec if not r.get("adaptive")]
    ks = [r["num_speculative_tokens"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 4.4))
    _plain_band(ax, result["rows"])
    _measured(ax, ks, rows, "speedup_vs_plain", "o-", color="C0", label="measured")
    ax.plot(ks, [r["predicted_speedup"] for r in rows], "s--", color="C1", label="predicted (cost model)")
    k, value = optimum(rows, "num_speculative_tokens")
    ax.plot([k], [value], "r*", ms=15, zorder=4, label=f"measured optimum: K={k}, {value:.2f}x")
    k, value = optimum(rows, "num_speculative_tokens", "predicted_speedup")
    label = f"predicted optimum: K={k}, {value:.2f}x"
    ax.plot([k], [value], "*", ms=15, mfc="none", mec="C1", mew=1.5, zorder=4, label=label)
    for r in (r for r in spec if r.get("adaptive")):
        label = f"adaptive (K <= {r['num_speculative_tokens']})"
        _measured(ax, [r["num_speculative_tokens"]], [r], "speedup_vs_plain", "D", color="C2", label=label)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(xlabel="K (draft tokens per round)", ylabel="speedup vs plain decoding", title=title)
    _integer_x(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path, result)


def batch_sweep(result: dict, path: Path, title: str) -> Path:
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    predictions = result["predictions"]
    batches = [p["batch_size"] for p in predictions]
    label = f"predicted ({result['prediction_models']})"
    ax.plot(batches, [p["predicted_speedup"] for p in predictions], "s--", color="C0", label=label)
    ax2.plot(
        batches,
        [p["predicted_plain_tokens_per_second"] for p in predictions],
        "--",
        color="C0",
        label="plain, predicted",
    )
    ax2.plot(
        batches,
        [p["predicted_speculative_tokens_per_second"] for p in predictions],
        "--",
        color="C1",
        label="spec, predicted",
    )
    spec = [r for r in _spec(result["rows"]) if not r.get("adaptive")]
    if spec:
        plain = [r for r in pooled(result["rows"]) if r["method"] == "plain"]
        if all("speedup_vs_plain_repeats" in r for r in plain):  # plain's own noise around 1
            lows = [min(r["speedup_vs_plain_repeats"]) for r in plain]
            highs = [max(r["speedup_vs_plain_repeats"]) for r in plain]
            batches = [r["batch_size"] for r in plain]
            ax.fill_between(batches, lows, highs, color="0.5", alpha=0.18, lw=0, label="plain: min-max of repeats")
        _measured(ax, [r["batch_size"] for r in spec], spec, "speedup_vs_plain", "o-", color="C1", label="measured")
        _measured(
            ax2, [r["batch_size"] for r in plain], plain, "tokens_per_second", "o-", color="C0", label="plain, measured"
        )
        _measured(
            ax2, [r["batch_size"] for r in spec], spec, "tokens_per_second", "o-", color="C1", label="spec, measured"
        )
        adaptive = [r for r in _spec(result["rows"]) if r.get("adaptive")]
        if adaptive:
            x = [r["batch_size"] for r in adaptive]
            _measured(ax, x, adaptive, "speedup_vs_plain", "D", color="C2", label="adaptive, measured")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(xlabel="batch size", ylabel="speedup vs plain decoding", title=title)
    ax2.set(xlabel="batch size", ylabel="total tokens/s", title="throughput")
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    ax2.set_yscale("log")
    return _save(fig, path, result)


def context_sweep(result: dict, path: Path, title: str) -> Path:
    rows = [r for r in result["rows"] if r.get("kind", "context") == "context"]
    fill_rows = [r for r in result["rows"] if r.get("kind") == "fill_capacity"]
    contexts = [r["context"] for r in rows]
    fig, axes = plt.subplots(1, 3 if fill_rows else 2, figsize=(16 if fill_rows else 11, 4.2))
    ax, ax2 = axes[0], axes[1]
    ax.plot(contexts, [1e3 * r["decode_seconds"] for r in rows], "o-", label="plain decode step")
    ax.plot(contexts, [1e3 * r["verify_seconds"] for r in rows], "s-", label="verify forward (width K+1)")
    ax.plot(contexts, [1e3 * r["round_seconds"] for r in rows], "^-", label="speculative round (draft, verify, accept)")
    ax.set(xlabel="context (cache slots, half filled)", ylabel="ms per forward", title=title)
    ax2.plot(contexts, [r["kv_cache_bytes"] / 2**20 for r in rows], "o-", label="KV cache (all slots)")
    ax2.plot(contexts, [r["weight_bytes"] / 2**20 for r in rows], "--", label="weights read per step")
    ax2.set(xlabel="context (cache slots)", ylabel="MiB", title="bytes per decode step")
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    if fill_rows:
        ax3 = axes[2]
        dtype = fill_rows[0]["cache_dtype"]
        for i, capacity in enumerate(sorted({r["capacity"] for r in fill_rows})):
            for attention, style in (("blockwise", "o-"), ("full", "x--")):
                mine = [
                    r
                    for r in fill_rows
                    if r["capacity"] == capacity and r["attention"] == attention and r["cache_dtype"] == dtype
                ]
                mine.sort(key=lambda r: r["fill"])
                if mine:
                    fills = [r["fill"] for r in mine]
                    times = [1e3 * r["decode_seconds"] for r in mine]
                    ax3.plot(fills, times, style, color=f"C{i}", label=f"capacity {capacity}, {attention}")
        ax3.set(
            xlabel="fill (committed tokens)", ylabel="ms per decode step", title=f"fill vs capacity ({dtype} cache)"
        )
        ax3.set_xscale("log", base=2)
        ax3.set_yscale("log")
        ax3.grid(alpha=0.3)
        ax3.legend(fontsize=7)
    return _save(fig, path, result)


def waste(result: dict, path: Path, title: str) -> Path:
    rows = pooled(result["rows"])
    labels = [f"K={r['num_speculative_tokens']}" for r in rows]
    parts = [
        ("accepted_per_round", "accepted drafts"),
        ("correction_per_round", "correction"),
        ("bonus_per_round", "bonus"),
        ("wasted_per_round", "wasted (after first rejection)"),
    ]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    bottom = [0.0] * len(rows)
    for key, name in parts:
        values = [r[key] for r in rows]
        ax.bar(labels, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set(ylabel="verified positions per round", title=title)
    ax.legend(fontsize=7)
    shares = acceptance_histogram(rows)
    width = 0.8 / max(len(shares), 1)
    colors = plt.cm.viridis([i / max(len(shares) - 1, 1) for i in range(len(shares))])
    for i, (label, share) in enumerate(shares.items()):
        x = [n + (i - (len(shares) - 1) / 2) * width for n in range(len(share))]
        ax2.bar(x, share, width, color=colors[i], label=label)
    ax2.set(xlabel="draft tokens accepted in the round", ylabel="share of rounds", title="acceptance per round")
    _integer_x(ax2)
    ax2.grid(alpha=0.3, axis="y")
    ax2.legend(fontsize=7)
    return _save(fig, path, result)


def acceptance_histogram(rows: list[dict]) -> dict[str, list[float]]:
    """E6's bars: per K, the share of row-rounds that accepted exactly n = 0..K draft tokens."""
    return {
        f"K={r['num_speculative_tokens']}": [h / r["rounds"] if r["rounds"] else 0.0 for h in r["rounds_accepting"]]
        for r in rows
    }


def sampling(result: dict, path: Path, title: str) -> Path:
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, temperature in enumerate(sorted({r["temperature"] for r in result["rows"]})):
        rows = [r for r in pooled(result["rows"]) if r["temperature"] == temperature]
        ks = [r["num_speculative_tokens"] for r in rows]
        ax.plot(ks, [r["mean_acceptance_length"] for r in rows], "o-", color=f"C{i}", label=f"T={temperature}")
    ax.set(xlabel="K", ylabel="mean acceptance length (tokens/round)", title=title)
    ax.set_xticks(sorted({r["num_speculative_tokens"] for r in result["rows"]}))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    tests = result["distribution_test"]
    names = [t["rule"].replace(" (negative control)", "\n(negative control)") for t in tests]
    x = range(len(tests))
    for offset, key, label in ((-0.2, "p_value_token_1", "token 1"), (0.2, "p_value_token_2", "token 2")):
        # p-values below the floor are drawn at it (and labelled), or one bar would span 300 decades.
        values = [max(t[key], _P_FLOOR) for t in tests]
        ax2.bar([i + offset for i in x], values, 0.4, label=label)
        for i, t in zip(x, tests, strict=True):
            ax2.annotate(f"{t[key]:.1e}", (i + offset, values[i]), ha="center", va="bottom", fontsize=7)
    ax2.axhline(result["summary"]["p_value_threshold"], color="red", ls="--", lw=0.8, label="threshold")
    ax2.set_xticks(list(x), names, fontsize=8)
    ax2.set(yscale="log", ylim=(_P_FLOOR / 10, 10), ylabel="chi-square p-value")
    ax2.set_title("distribution test vs exact target")
    ax2.legend(fontsize=7)
    return _save(fig, path, result)


def methods(result: dict, path: Path, title: str) -> Path:
    """Bars per method, grouped by category: speedup (top) and mean acceptance length (bottom),
    one column per temperature."""
    rows = [r for r in result["rows"] if r["method"] == "speculative"]
    temperatures = sorted({r["temperature"] for r in rows})
    names = list(dict.fromkeys(r["drafter"] for r in rows))
    categories = [c for c in dict.fromkeys(r["category"] for r in rows) if c != POOLED] + [POOLED]
    width = 0.8 / len(categories)
    fig, axes = plt.subplots(2, len(temperatures), figsize=(6 * len(temperatures), 8), squeeze=False)
    for column, t in enumerate(temperatures):
        for line, (key, label) in enumerate(
            (("speedup_vs_plain", "speedup vs plain"), ("mean_acceptance_length", "mean acceptance length"))
        ):
            ax = axes[line, column]
            for i, category in enumerate(categories):
                mine = {r["drafter"]: r for r in rows if r["temperature"] == t and r["category"] == category}
                present = [n for n in names if n in mine]
                x = [j + (i - (len(categories) - 1) / 2) * width for j, n in enumerate(names) if n in mine]
                hatch = "//" if category == POOLED and len(categories) > 1 else None
                picked = [mine[n] for n in present]
                yerr = spread(picked, key)  # timed: the repeats' min-max; counted: none
                values = [r[key] for r in picked]
                ax.bar(x, values, width, yerr=yerr, capsize=2, label=category, hatch=hatch, color=f"C{i}")
            ax.axhline(1.0, color="gray", lw=0.8)
            ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
            ax.set(ylabel=label, title=f"{title}, T={t}" if line == 0 else f"{label}, T={t}")
            ax.grid(alpha=0.3, axis="y")
            ax.legend(fontsize=7)
    return _save(fig, path, result)


def trees(result: dict, path: Path, title: str) -> Path:
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
                _measured(ax, widths, group, key, "o-" if i == 0 else "s-", color=f"C{i}", label=family)
                if line == 0 and "predicted_tokens_per_round" in group[0]:
                    predicted = [r["predicted_tokens_per_round"] for r in group]
                    ax.plot(widths, predicted, ":", color=f"C{i}", lw=0.9, label=f"{family}, predicted")
            presets = [r for r in mine if r["tree_kind"] == "preset"]
            for i, r in enumerate(presets):
                name = f"preset {r['tree']} (width {r['verify_width']})"
                _measured(ax, [r["verify_width"]], [r], key, "D", color=f"C{i + len(families)}", label=name)
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
    return _save(fig, path, result)


PLOTS = {
    "tokens_per_round": tokens_per_round,
    "verify_cost": verify_cost,
    "k_sweep": k_sweep,
    "batch_sweep": batch_sweep,
    "context_sweep": context_sweep,
    "waste": waste,
    "sampling": sampling,
    "methods": methods,
    "trees": trees,
    "scaling": lambda result, path, title: _scaling_plot(result, path, title),
    "adaptive_sweep": lambda result, path, title: _adaptive_plot(result, path, title),
}


def _scaling_plot(result: dict, path: Path, title: str) -> Path:
    from specjax.bench.scaling import plot  # E10 keeps its plot beside its experiment

    return plot(result, path, title)


def _adaptive_plot(result: dict, path: Path, title: str) -> Path:
    from specjax.bench.adaptive import plot  # E11 keeps its figure beside the experiment

    return plot(result, path, title)
