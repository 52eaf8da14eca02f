"""Writing a bench run down: results.json, CSV tables and summary.md (schema: docs/bench.md)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from specjax.bench import experiments

# 2: rows carry `category` (and `drafter`); `models.draft` may describe a drafter that is
# not a model (kind, parameters, drafter); experiment E8 "methods".
SCHEMA_VERSION = 2

# summary.md flags a measured speedup further than this from the cost model's prediction.
PREDICTION_TOLERANCE = 0.25
# Repeats of one row whose tokens/s spread (max - min) more than this share of their median:
# a stall (a compile, another process) in one repeat, which a median of two or three lets in.
SPREAD_TOLERANCE = 0.15

# Written into every results.json, so a number never travels without its meaning.
DEFINITIONS = {
    "tokens_per_second": "output tokens of all requests / wall time of all requests (median over repetitions)",
    "latency_ms": "wall time of one request (a batch of batch_size rows), median",
    "ttft_ms": "time to first token: the same compiled program run for one new token (prefill + first step/round)",
    "tpot_ms": "time per output token = (latency - TTFT) / (max_new_tokens - 1)",
    "goodput_tokens_per_second": "output tokens of requests whose TPOT <= tpot_target_ms / wall time of all requests",
    "speedup_vs_plain": "tokens_per_second / tokens_per_second of plain decoding, same target, batch and temperature",
    "speedup_vs_plain_paired": "median over repetitions of (plain decoding's wall time / this spec's wall time "
    "for the same requests) within one round-robin pass: a ratio of times measured seconds apart",
    "acceptance_rate": "accepted draft tokens / drafted tokens",
    "mean_acceptance_length": "1 + accepted / rounds: tokens per round including the correction/bonus token "
    "(vLLM/EAGLE convention; gpt-fast reports it without the +1)",
    "accepted_per_position": "for i = 1..K: P(draft token i accepted | tokens 1..i-1 accepted)",
    "rounds_accepting": "for n = 0..K: row-rounds that accepted exactly n draft tokens",
    "target_forwards_per_token": "batched target forward passes x batch_size / output tokens (1 for plain decoding)",
    "wasted_positions": "verified draft positions after the first rejection = drafted - accepted",
    "draft_time_share": "the draft's share of a round; `draft_time_share_definition` says which: 'forwards' = "
    "draft forwards / (draft forwards + verify forward), from forward costs timed in isolation (a draft model in "
    "E3-E5); 'propose' = drafter.propose timed alone / the whole round, timed side by side round-robin (any other "
    "drafter, and every method of E8)",
    "category": "the prompts a row pools: 'all' = every prompt; otherwise one prompt category (from the prompt "
    "source), with rows per category only when there are several",
    "drafter": "which drafter proposed ('draft' = the config's draft; E8: the method's name; 'none' = plain decoding)",
    "no_match_rounds": "prompt lookup (also inside a combinator): row-rounds in which no n-gram matched, so it "
    "proposed a filler token; no_match_share = no_match_rounds / rounds",
    "ms_per_iteration": "(latency - TTFT) / (target forwards per request - 1): one plain step or one speculative round",
    "cost_round_seconds": "cost model: one speculative round timed in isolation (a loop of rounds at the "
    "generation's cache length; static shapes make it independent of acceptance)",
    "non_forward_ms_per_iteration": "one loop iteration (plain step or round) minus the model forwards in it, both "
    "timed in isolation at the same cache length: draft sampling, acceptance, commit and per-op dispatch; a "
    "difference below zero is timing noise, recorded as 0 with the difference as non_forward_noise_ms",
    "predicted_speedup": "cost model: expected tokens per round (from the per-position acceptance measured at the "
    "largest K) x plain step time / round time, both loop iterations timed in isolation in this run",
    "output_matches_plain": "greedy only: speculative tokens equal plain greedy tokens for every prompt",
    "verify_width": "E9: positions per row in each target forward: K + 1 for a chain, N + 1 for a tree of N nodes",
    "predicted_tokens_per_round": "E3: the cost model's tokens per round; E9: 1 + the tree's expected accepted "
    "nodes under the acceptance table (by depth and rank) measured on the tuning prompts",
    "adaptive": "E11 (and `adaptive: true`): the row's K is chosen each round, up to num_speculative_tokens = K_MAX "
    "(engine/adaptive_policy.py); adaptive_rounds_per_k counts rounds per K (summed over requests), "
    "adaptive_plain_steps "
    "the rounds with K = 0, adaptive_mean_k the mean K per round",
    "scenario": "E11: random (a random-weight draft), pair (the pair at batch 1), batch (other batch sizes), "
    "shift (prompts whose acceptance shifts mid-generation)",
    "acceptance_by_depth": "E9: accepted_per_position of the first 8 depths (a tree's depth i), 2 decimals",
    "tokens_per_second_repeats": "tokens_per_second of each timed repetition (their median is tokens_per_second); "
    "plots draw their min-max as error bars",
    "speedup_vs_plain_repeats": "each repetition's tokens/s / the median tokens/s of plain decoding at the same "
    "batch, temperature and category (their median is speedup_vs_plain; the plain row's spread is its own noise)",
    "load_average": "os.getloadavg() (1, 5, 15 minutes) at the start of the run and after the last experiment "
    "(per experiment: before and after it), beside the machine's CPU count: a load above it means other work "
    "shared the cores the timings ran on",
    "setting": "per experiment: the batch size, temperature and prompt count its figure was measured at (a list "
    "where it sweeps one), as the line under its plot",
    "measured_vs_predicted": "summary.md: speedup_vs_plain / predicted_speedup - 1; flagged when more than "
    f"{PREDICTION_TOLERANCE:.0%} either way",
}

# Columns that lead every measured row (the required fields of the schema).
ROW_FIELDS = [
    "experiment",
    "category",
    "method",
    "num_speculative_tokens",
    "batch_size",
    "temperature",
    "tokens_per_second",
    "tpot_ms",
    "mean_acceptance_length",
    "speedup_vs_plain",
]


def _columns(name: str, rows: list[dict]) -> list[str]:
    """An experiment's summary columns, led by `category` when its rows have several."""
    columns = list(experiments.by_name(name).columns)  # each experiment's module names them
    several = len({row.get("category", "all") for row in rows}) > 1
    return ["category", *columns] if several and "category" not in columns else columns


def _cell(value):
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list) and all(isinstance(v, float) for v in value):
        return json.dumps([float(f"{v:.3g}") for v in value])  # a profile, e.g. acceptance per position
    if isinstance(value, list | dict):
        return json.dumps(value)
    return value


def write_csv(rows: list[dict], path: Path, leading: list[str] = ()) -> None:
    columns = list(leading)
    for row in rows:
        columns += [key for key in row if key not in columns]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({key: _cell(value) for key, value in row.items()})


def _table(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(_cell(row.get(c, ""))) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def prediction_gap(measured: float, predicted: float) -> float:
    """How far a measured speedup is from its prediction, relative to the prediction."""
    return measured / predicted - 1.0


def prediction_flag(measured: float, predicted: float, tolerance: float = PREDICTION_TOLERANCE) -> str | None:
    """A warning when a measured speedup is more than `tolerance` away from the prediction, else None."""
    gap = prediction_gap(measured, predicted)
    if abs(gap) <= tolerance:
        return None
    return f"⚠ measured {measured:.2f}x vs predicted {predicted:.2f}x ({gap:+.0%})"


def _predicted(row: dict) -> bool:
    """The row has a measured and a predicted speedup."""
    return row.get("predicted_speedup") is not None and row.get("speedup_vs_plain") is not None


def _with_gaps(rows: list[dict]) -> list[dict]:
    """Rows with a `measured_vs_predicted` cell where they carry a measured and a predicted speedup."""
    out = []
    for row in rows:
        if _predicted(row):
            gap = prediction_gap(row["speedup_vs_plain"], row["predicted_speedup"])
            flagged = prediction_flag(row["speedup_vs_plain"], row["predicted_speedup"]) is not None
            row = {**row, "measured_vs_predicted": ("⚠ " if flagged else "") + f"{gap:+.0%}"}
        out.append(row)
    return out


def _where(row: dict) -> str:
    """Which row a flag is about, in the terms of its experiment."""
    parts = [f"K={row['num_speculative_tokens']}"]
    if row.get("adaptive"):
        parts[0] = f"adaptive K<={row['num_speculative_tokens']}"
    parts.append(f"batch {row['batch_size']}")
    if row.get("category", "all") != "all":
        parts.append(row["category"])
    return ", ".join(parts)


def prediction_flags(rows: list[dict]) -> list[str]:
    """One line per row whose measured speedup is more than the tolerance from its prediction."""
    lines = []
    for row in filter(_predicted, rows):
        flag = prediction_flag(row["speedup_vs_plain"], row["predicted_speedup"])
        if flag:
            lines.append(f"- {flag}: {_where(row)}")
    return lines


def spread_flags(rows: list[dict]) -> list[str]:
    """One line per row whose timed repeats disagree by more than SPREAD_TOLERANCE of their
    median tokens/s (`tokens_per_second_repeats`, specjax/bench/context.py)."""
    lines = []
    for row in rows:
        values = row.get("tokens_per_second_repeats") or []
        if len(values) < 2 or not row.get("tokens_per_second"):
            continue
        spread = (max(values) - min(values)) / row["tokens_per_second"]
        if spread > SPREAD_TOLERANCE:
            who = [str(row[k]) for k in ("method", "drafter", "tree") if row.get(k) not in (None, "")]
            who += [f"K={row['num_speculative_tokens']}"] if row.get("num_speculative_tokens") else []
            who += [f"batch {row['batch_size']}", f"T={row.get('temperature', 0):g}", row.get("category", "all")]
            tps = ", ".join(f"{v:.1f}" for v in values)
            lines.append(f"- ⚠ repeats {spread:.0%} apart (tokens/s {tps}): {', '.join(who)}")
    return lines


def _load_line(load: dict) -> list[str]:
    """The machine's load average at the start and end of the run, and a warning when it was busy."""

    def text(values):
        return "/".join(f"{v:.2f}" for v in values) if values else "n/a"

    cpus = load.get("cpu_count")
    lines = [f"- load average (1/5/15 min): {text(load['start'])} at start, {text(load['end'])} at end, {cpus} CPUs"]
    busiest = max((values[0] for values in (load["start"], load["end"]) if values), default=None)
    if busiest is not None and cpus and busiest > cpus:
        lines.append(
            f"- ⚠ load average {busiest:.2f} above the {cpus} CPUs: other work shared the cores, timings are noisy"
        )
    return lines


def _describe(model: dict) -> str:
    """One line for a model or drafter of results.json `models`."""
    dtype = f", {model['dtype']}" if "dtype" in model else ""
    kind = f"{model['kind']}, " if model.get("kind") not in (None, "draft_model") else ""
    return f"{model['name']} ({kind}{model['parameters']:,} parameters{dtype})"


def summary_markdown(results: dict) -> str:
    env = results["environment"]
    models = results["models"]
    lines = [
        "# specjax bench",
        "",
        f"- device: {env['device']} ({env['backend']}), CPU: {env['cpu']} x{env['cpu_count']}",
        f"- jax {env['jax']}, flax {env['flax']}, Python {env['python']}",
        f"- specjax {env['specjax']} (commit {env['git_commit']})",
    ]
    if results.get("command"):
        lines.append(f"- command: `{results['command']}`")
    for role, model in models.items():
        lines.append(f"- {role}: {_describe(model)}")
    if results.get("machine"):
        m = results["machine"]
        lines.append(
            f"- measured memory bandwidth {m['memory_bandwidth_bytes_per_second'] / 1e9:.1f} GB/s, "
            f"matmul {m['matmul_flops_per_second'] / 1e9:.1f} GFLOP/s ({m['matmul_dtype']})"
        )
    if results.get("load_average"):
        lines += _load_line(results["load_average"])
    for name, experiment in results["experiments"].items():
        lines += ["", f"## {experiment['id']} {name}: {experiment['claim']}", ""]
        if experiment.get("setting"):
            lines.append(f"- setting: {experiment['setting']['text']}")
        lines += [f"- {key}: {_cell(value)}" for key, value in experiment["summary"].items()]
        if experiment.get("drafters"):
            lines += ["", *(f"- `{label}`: {_describe(d)}" for label, d in experiment["drafters"].items())]
        rows, columns = experiment["rows"], _columns(name, experiment["rows"])
        if any(map(_predicted, rows)):
            rows, columns = _with_gaps(rows), [*columns, "measured_vs_predicted"]
        lines += ["", _table(rows, columns)]
        flags = prediction_flags(experiment["rows"])
        if flags:
            lines += [
                "",
                f"Measured speedup more than {PREDICTION_TOLERANCE:.0%} away from the cost model's prediction:",
                "",
                *flags,
            ]
        spread = spread_flags(experiment["rows"])
        if spread:
            lines += ["", f"Timed repeats more than {SPREAD_TOLERANCE:.0%} apart (read the faster ones):", "", *spread]
        if experiment.get("distribution_test"):
            columns = ["rule", "p_value_token_1", "p_value_token_2", "tv_token_1", "tv_token_2", "passes"]
            lines += ["", _table(experiment["distribution_test"], columns)]
        if experiment.get("predictions"):
            columns = ["batch_size", "predicted_speedup", "draft_time_share", "predicted_speculative_tokens_per_second"]
            lines += [
                "",
                f"Predicted from {experiment['prediction_models']}:",
                "",
                _table(experiment["predictions"], columns),
            ]
        for title, table in experiment.get("tables", {}).items():  # an experiment's own layout (E12: the paper's)
            lines += ["", f"### {title}", "", table]
        lines += ["", f"![{name}]({experiment['plot']})"]
    return "\n".join(lines) + "\n"


def summary_line(experiment: dict) -> str:
    """An experiment's summary in one line (what `specjax bench` prints): scalars as `key=value`,
    per-value mappings (E4's speedup by batch) as `key={a: v, ...}`, so no experiment's line is empty."""

    def value(v) -> str:
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}: {value(x)}" for k, x in v.items()) + "}"
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    return ", ".join(f"{k}={value(v)}" for k, v in experiment["summary"].items())


def write_results(results: dict, out_dir: Path) -> None:
    """results.json, results.csv (every measured generation row), one CSV per experiment, summary.md."""
    (out_dir / "results.json").write_text(json.dumps(results, indent=2))
    write_csv(results["rows"], out_dir / "results.csv", ROW_FIELDS)
    for experiment in results["experiments"].values():
        write_csv(experiment["rows"] or experiment.get("predictions", []), out_dir / experiment["csv"])
    (out_dir / "summary.md").write_text(summary_markdown(results))
