"""The peer comparison's rows, CSV and bar chart (scripts/peers/compare.py)."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from outputs import agreement, paired_ratios

COLUMNS = (
    "name",
    "peer",
    "kind",
    "weights",
    "computes_in",
    "tokens_per_second",
    "ratio_vs_baseline",
    "ratio_vs_own_plain",
    "twin",
    "identical_prompts",
    "prompts",
    "earliest_divergence",
    "bytes_per_step",
    "target_forwards",
    "weight_gbps",
    "fraction_of_copy_bandwidth",
    "mean_acceptance_length",
    "notes",
)


def _own_plain(method, names: set[str]) -> str | None:
    """The plain method of the same peer and weights, e.g. llama.cpp Q8_0 plain."""
    plain = method.name.removesuffix(method.kind) + "plain"
    return plain if plain in names else None


def summarise(methods, outputs, extras, forwards, seconds, memory, tokens_per_round, baseline) -> dict:
    """{"rows": one dict per method (COLUMNS and more), "outputs": tokens per method}."""
    names = {m.name for m in methods}
    per_round = {name: [sum(r) for r in rounds] for name, rounds in seconds.items()}
    ratios = paired_ratios(per_round, baseline) if baseline in per_round else {}
    copy_gbps = memory["copy_gbps"]["median"]
    rows = []
    for m in methods:
        median_s = statistics.median(per_round[m.name])
        reference = f"specjax {m.twin} plain"
        if reference in outputs:
            agree = agreement(outputs[reference], outputs[m.name])
        else:  # that format's plain decoding did not run: nothing to compare with
            agree = dict.fromkeys(("first_divergence", "identical_prompts", "prompts", "earliest_divergence"))
        # A plain decoder runs one target forward per token (the prefill makes the first).
        known = forwards[m.name]
        fwd = sum(known) if all(f is not None for f in known) else None
        if fwd is None and m.kind == "plain":
            fwd = tokens_per_round
        gbps = None if fwd is None or m.bytes_per_step is None else m.bytes_per_step * fwd / median_s / 1e9
        accept = [e["mean_acceptance_length"] for e in extras[m.name] if "mean_acceptance_length" in e]
        own = _own_plain(m, names)
        predictions = [e["predictions"] for e in extras[m.name] if "predictions" in e]
        row = m.describe() | {
            "tokens_per_second": tokens_per_round / median_s,
            "ratio_vs_baseline": ratios.get(m.name),
            "ratio_vs_own_plain": None if own is None else ratios[m.name] / ratios[own],
            "seconds_per_round": per_round[m.name],
            "seconds_per_call": seconds[m.name],
            **agree,
            "target_forwards": fwd,
            "weight_gbps": gbps,
            "fraction_of_copy_bandwidth": None if gbps is None else gbps / copy_gbps,
            "mean_acceptance_length": statistics.mean(accept) if accept else None,
        }
        if predictions:  # llama.cpp's token-predictor counters, summed over prompts
            row["llama_cpp_predictions"] = {k: sum(p[k] for p in predictions) for k in predictions[0]}
        rows.append(row)
    return {"rows": rows, "outputs": outputs}


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def write_plot(path: Path, rows: list[dict], settings: dict, quick: bool) -> None:
    """Horizontal bars: each method's tokens/s over specjax float32 plain's, by peer."""
    from _timing import pyplot

    plt = pyplot()
    if plt is None:
        return
    colours = {"specjax": "tab:blue", "transformers": "tab:orange", "llama.cpp": "tab:green"}
    shown = [r for r in rows if r["ratio_vs_baseline"] is not None]
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(shown) + 1.5))
    ax.barh(
        range(len(shown)),
        [r["ratio_vs_baseline"] for r in shown],
        color=[colours.get(r["peer"], "grey") for r in shown],
    )
    ax.set_yticks(range(len(shown)), [r["name"] for r in shown], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xlabel("tokens/s / specjax float32 plain (median of per-round ratios)")
    title = (
        f"SmolLM2-135M, greedy, batch 1, {settings['prompts']} prompts x {settings['max_new_tokens']} tokens, "
        f"{settings['threads']} threads"
    )
    ax.set_title(("QUICK CHECK, NOT A MEASUREMENT: " if quick else "") + title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
