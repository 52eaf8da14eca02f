"""E9 (`trees`): chain vs preset and tuned trees at equal verify width, on tiny byte-level models."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from conftest import TARGET_CONFIG, noisy_copy, scaled_model

import specjax
from specjax.bench import BenchConfig, run_bench
from specjax.bench.experiments.e09_trees import _summary, candidates
from specjax.configs import from_dict
from specjax.io.tokenizer import ByteTokenizer
from specjax.trees import Tree

WIDTHS = [3]  # with the preset's 15, at T = 0 only: few compiled programs keep the test fast
TINY_TREES = {
    "experiments": ["trees"],
    "prompts": [
        {"domain": "code", "count": 2, "prompt_bytes": 12},
        {"domain": "prose", "count": 1, "prompt_bytes": 12},
    ],
    "max_new_tokens": 12,
    "timing": {"repeats": 1, "cost_inner": 2, "tpot_target_ms": 1000.0},
    "trees": {
        "widths": WIDTHS,
        "presets": ["binary-3"],
        "temperatures": [0.0],
        "tune_prompts": {"domain": "code", "count": 2, "prompt_bytes": 12, "split": "train"},
        "tune_max_new_tokens": 12,
        "tune_max_rank": 3,
    },
}


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    target = scaled_model(TARGET_CONFIG.replace(vocab_size=259, num_hidden_layers=1), seed=0)
    target = specjax.Model(target.config, target.params, tokenizer=ByteTokenizer())
    draft = noisy_copy(target, noise=0.15, seed=3)
    out = tmp_path_factory.mktemp("bench_trees")
    results = run_bench(from_dict(BenchConfig, TINY_TREES), out, target=target, draft=draft, progress=False)
    return results, out


def _spec_rows(bench, category="all"):
    rows = bench[0]["experiments"]["trees"]["rows"]
    return [r for r in rows if r["method"] == "speculative" and r["category"] == category]


def test_e9_writes_rows_summary_csv_and_plot(bench):
    results, out = bench
    experiment = results["experiments"]["trees"]
    assert experiment["id"] == "E9"
    assert (out / experiment["plot"]).stat().st_size > 10_000  # a real PNG, not an empty figure
    with (out / experiment["csv"]).open() as f:
        assert len(list(csv.DictReader(f))) == len(experiment["rows"])
    summary = (out / "summary.md").read_text()
    assert "## E9 trees" in summary and "![trees](e9_trees.png)" in summary
    assert "tree | verify_width | tree_depth | mean_acceptance_length" in summary
    saved = json.loads((out / "results.json").read_text())
    assert {r["experiment"] for r in saved["rows"]} == {"E9"}
    s = experiment["summary"]
    for t in (0.0,):
        assert s[f"best_chain_width (T={t})"] in WIDTHS
        assert s[f"best_tree_width (T={t})"] in [*WIDTHS, 15]  # binary-3: 14 nodes
        assert set(s[f"tuned_vs_chain_tokens_per_round (T={t})"]) == {str(w) for w in WIDTHS}
        assert isinstance(s[f"tuned_at_or_above_chain (T={t})"], bool)
    # Tuned on the train split, measured on the test split: no prompt in both.
    assert "train split" in s["tuned_on"] and "(0 prompts in both)" in s["tuned_on"]


def test_e9_has_every_method_width_and_temperature(bench):
    for category in ("all", "code", "prose"):
        rows = _spec_rows(bench, category)
        got = {(r["temperature"], r["tree"], r["verify_width"]) for r in rows}
        want = {(0.0, kind, w) for kind in ("chain", "tuned") for w in WIDTHS}
        assert got == want | {(0.0, "binary-3", 15)}
        assert len(rows) == len(got)
    plain = [r for r in bench[0]["experiments"]["trees"]["rows"] if r["method"] == "plain"]
    categories = ("all", "code", "prose")
    assert {(r["temperature"], r["category"]) for r in plain} == {(0.0, c) for c in categories}


def test_e9_greedy_trees_reproduce_plain_decoding(bench):
    greedy = [r for r in _spec_rows(bench) if r["temperature"] == 0.0]
    assert greedy and all(r["output_matches_plain"] for r in greedy)
    assert bench[0]["experiments"]["trees"]["summary"]["greedy_outputs_match_plain"] is True


def test_e9_rows_verify_the_tree_they_name(bench):
    tuned = bench[0]["experiments"]["trees"]["tuned_trees"]
    for row in _spec_rows(bench):
        n = row["verify_width"] - 1
        assert row["num_speculative_tokens"] == n
        # Acceptance is counted by depth: a tree of depth D reports D positions, a chain K.
        assert len(row["accepted_per_position"]) == row["tree_depth"]
        assert 1.0 <= row["mean_acceptance_length"] <= row["tree_depth"] + 1
        assert row["drafted_tokens"] == n * row["rounds"]
        assert row["target_forwards_per_token"] > 0 and row["tokens_per_second"] > 0
        assert row["speedup_vs_plain"] > 0
        assert np.median(row["speedup_vs_plain_repeats"]) == pytest.approx(row["speedup_vs_plain"])
        assert 1.0 <= row["predicted_tokens_per_round"] <= row["tree_depth"] + 1
        if row["tree"] == "binary-3":
            assert row["tree_depth"] == 3 and not row["tree_is_chain"]
        if row["tree"] == "chain":
            assert row["tree_depth"] == n and row["tree_is_chain"]
        if row["tree"] == "tuned":
            paths = tuned[f"temperature={row['temperature']}"][row["drafter"]]
            tree = Tree.from_paths([tuple(p) for p in paths])
            assert tree.num_nodes == n and tree.depth == row["tree_depth"]
            table = bench[0]["experiments"]["trees"]["acceptance_tables"][f"temperature={row['temperature']}"]
            assert row["predicted_tokens_per_round"] == pytest.approx(1 + tree.expected_accepted(table))


@pytest.mark.parametrize(
    "section, message",
    [
        ({"widths": [1, 4]}, "widths must be distinct verify widths >= 2"),
        ({"widths": [4, 4]}, "widths must be distinct"),
        ({"presets": ["binary-9"]}, "unknown tree preset 'binary-9'"),
        ({"tuned_depths": [0]}, "tuned_depths must be distinct depth caps >= 1"),
        ({"tuned_depths": [None, None]}, "tuned_depths must be distinct"),
        ({"tune_prompts": {"domain": "code", "splitt": "train"}}, "unknown config key"),
    ],
)
def test_bad_trees_sections_name_the_problem(section, message):
    with pytest.raises(ValueError, match=message):
        from_dict(BenchConfig, {"experiments": ["trees"], "trees": section})


def test_capped_tuned_trees_respect_the_cap_and_duplicates_are_left_out():
    table = np.array([[0.9, 0.3], [0.9, 0.3], [0.9, 0.3]])
    cfg = from_dict(BenchConfig, {"trees": {"widths": [2, 5], "presets": [], "tuned_depths": [None, 1, 2]}}).trees
    got, skipped = candidates(cfg, table, 0.0)
    shapes = {c.label: (c.kind, c.width, c.depth) for c in got}
    assert shapes == {
        "chain K=1": ("chain", 2, 1),
        "tuned N=1, T=0": ("tuned", 2, 1),
        "chain K=4": ("chain", 5, 4),
        "tuned N=4, T=0": ("tuned", 5, 3),  # 0.9, 0.81, 0.73 and the rank-1 root child 0.3
        "tuned depth<=1 N=2, T=0": ("tuned", 3, 1),  # two ranks at depth 1: only 2 nodes fit
        "tuned depth<=2 N=4, T=0": ("tuned", 5, 2),
    }
    # At width 2 every cap gives the same one-node tree: measured once.
    assert skipped == ["tuned depth<=1 N=1, T=0", "tuned depth<=2 N=1, T=0"]


def _row(temperature, tree, width, tokens_per_round, tokens_per_second, depth=None):
    kind = {"chain": "chain", "tuned": "tuned"}.get(tree, "preset")
    return {
        "method": "speculative",
        "category": "all",
        "temperature": temperature,
        "tree": tree,
        "tree_kind": kind,
        "verify_width": width,
        "tree_depth": depth or width - 1,
        "tree_is_chain": kind == "chain" or depth is None,
        "mean_acceptance_length": tokens_per_round,
        "tokens_per_second": tokens_per_second,
        "speedup_vs_plain": tokens_per_second / 100,
        "speedup_vs_plain_paired": tokens_per_second / 100,
        "output_matches_plain": True,
    }


def test_e9_summary_per_temperature():
    rows = [
        _row(1.0, "chain", 8, 4.0, 150),
        _row(1.0, "tuned", 8, 3.9, 140),  # the chain's own shape: below it by sampling noise only
        _row(1.0, "chain", 32, 4.5, 90),
        _row(1.0, "tuned", 32, 5.0, 95, depth=12),
        _row(1.0, "prior-32", 33, 4.4, 170, depth=7),
    ]
    s = _summary(rows, [1.0], "train split", ["tuned"])
    assert (s["best_chain_width (T=1.0)"], s["best_tree_width (T=1.0)"]) == (8, 33)
    assert s["best_tree (T=1.0)"].startswith("prior-32: 170 tokens/s, 1.70x plain")
    assert s["tuned_vs_chain_tokens_per_round (T=1.0)"] == {
        "8": "3.900 vs 4.000 (same shape)",
        "32": "5.000 vs 4.500 (depth 12)",
    }
    assert s["tuned_at_or_above_chain (T=1.0)"] is False
    assert s["tuned_at_or_above_chain_where_shapes_differ (T=1.0)"] is True
    assert "greedy_outputs_match_plain" not in s  # no greedy rows
