"""What every experiment's plot shares. Measured values are solid markers, predictions dashed lines.

Each experiment draws its own PNG (its module's `plot`, specjax/bench/experiments/); these are
the pieces they have in common. Rows of one prompt category are left out (the CSVs and
tables have them): each plot shows the rows pooled over every prompt, except E8's, which
groups its bars by category. Timed values are medians over the repeats; where the rows
carry the repeats (`<key>_repeats`), error bars span their min to max. A line under each
figure says what it was measured at: batch size, temperature and prompt count, or which of
them it sweeps (the experiment's `setting`).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from specjax.bench.measure import pooled


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
    """The pooled speculative rows."""
    return [r for r in pooled(rows) if r["method"] == "speculative"]
