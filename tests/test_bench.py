"""`specjax bench`: the cost model's arithmetic, the metrics' accounting identities, and a
whole bench run on tiny byte-level models (every file, every required field)."""

from __future__ import annotations

import csv
import json
import shlex

import jax
import numpy as np
import pytest
from conftest import TARGET_CONFIG, noisy_copy, scaled_model
from specjax.models import init_cache
from specjax.models.cache import DEFAULT_BLOCK_SIZE

import specjax
from specjax.bench import EXPERIMENTS, BenchConfig, plots, run_bench
from specjax.bench.compiles import compile_seconds, compiled_programs
from specjax.bench.cost_model import (
    batch_tokens_per_round,
    expected_tokens_per_round,
    forward_estimate,
    geometric_tokens_per_round,
    kv_cache_bytes,
    matmul_parameters,
)
from specjax.bench.experiments import e03_k_sweep, e06_waste
from specjax.bench.report import PREDICTION_TOLERANCE, ROW_FIELDS, prediction_flag, prediction_flags, spread_flags
from specjax.cli import main
from specjax.configs import from_dict
from specjax.io.tokenizer import ByteTokenizer

BYTE_CONFIG = TARGET_CONFIG.replace(vocab_size=259)
# The bench runs' pair: one layer (layers are unrolled, so each compiles in about half the
# time; compiling dominates these runs) and K <= 2 (an adaptive run compiles rounds of every K).
BENCH_CONFIG = BYTE_CONFIG.replace(num_hidden_layers=1)
K_MAX = 2

# E8 (methods) runs in test_bench_prompts.py, with file prompts and several drafters; E9
# (trees) in test_bench_trees.py; E10 (scaling, 8 devices) in test_sharding.py; E11 (adaptive,
# the longest of these: 84 of 301 s on a 2-core EPYC) in test_bench_adaptive.py, so that
# pytest-xdist can run it on the other worker; E12 (protocol, its own prompt files) in
# test_e12_protocol.py.
ELSEWHERE = ("methods", "trees", "scaling", "adaptive_sweep", "protocol")
TINY_EXPERIMENTS = [name for name in EXPERIMENTS if name not in ELSEWHERE]
TINY_BENCH = {
    "experiments": TINY_EXPERIMENTS,
    "prompts": {"count": 2, "prompt_bytes": 12},
    "max_new_tokens": 12,
    "timing": {"repeats": 2, "cost_inner": 2, "tpot_target_ms": 1000.0},
    "bandwidth_megabytes": 8,
    # Keep compiled programs between experiments (the default clears them, to bound a big
    # model's live programs): E4's batch-1 generations are E3's K_MAX ones and their plain baseline.
    "clear_caches": False,
    # Every experiment counts acceptance at K = 1 and K_MAX only: E1 measures each (K, T) once
    # and E6 and E7 reuse its counts (BenchContext.acceptance) instead of running their own.
    "tokens_per_round": {"ks": [1, K_MAX], "temperatures": [0.0, 1.0]},
    "verify_cost": {"widths": [1, 4], "batch_sizes": [1, 2], "context": 64},
    "k_sweep": {"ks": [1, K_MAX]},
    "batch_sweep": {"batch_sizes": [1, 4], "num_speculative_tokens": K_MAX},
    "context_sweep": {
        "contexts": [64, 128, 4096],
        "num_speculative_tokens": K_MAX,
        "fill_capacity": {"capacities": [128, 640], "fills": [16, 300], "cache_dtypes": [None, "bfloat16"]},
    },
    "waste": {"ks": [1, K_MAX]},
    "sampling": {"ks": [K_MAX], "temperatures": [0.0, 1.0], "test_samples": 1500, "test_num_speculative_tokens": 2},
    "adaptive_sweep": {  # two of E11's four scenarios (each adaptive run compiles a few programs)
        "k_max": K_MAX,
        "static_ks": [1, K_MAX],
        "batch_sizes": [1],  # two requests per configuration, like E3's rows: one gives noisy medians
        "random_draft": False,
        "shift_prompts": {"count": 2, "prompt_bytes": 12},
        "predict_batch_sizes": [2],
    },
}


# --- The cost model's formulas -------------------------------------------------------------


def test_geometric_tokens_per_round_matches_the_article():
    # SEED.md: K = 5 gives 1.43, 2.38, 3.69, 5.30 tokens per round at a = 0.3, 0.6, 0.8, 0.95.
    for alpha, expected in [(0.3, 1.43), (0.6, 2.38), (0.8, 3.69), (0.95, 5.30)]:
        assert geometric_tokens_per_round(alpha, 5) == pytest.approx(expected, abs=0.005)
    assert expected_tokens_per_round([0.8] * 5, 5) == pytest.approx(geometric_tokens_per_round(0.8, 5))
    assert expected_tokens_per_round([1.0, 0.5, 0.0], 3) == pytest.approx(1 + 1 + 0.5)
    with pytest.raises(ValueError, match="measured for K <= 2"):
        expected_tokens_per_round([0.5, 0.5], 3)


def test_batched_rounds_wait_for_the_slowest_row():
    assert batch_tokens_per_round([1.0] * 4, 4, 100, batch=8) == pytest.approx(100 / 20)  # 5 tokens, 20 rounds
    assert batch_tokens_per_round([0.0] * 4, 4, 100, batch=8) == 1.0
    per_row = [batch_tokens_per_round([0.8] * 4, 4, 128, batch=b) for b in (1, 4, 64)]
    assert per_row == sorted(per_row, reverse=True)  # more rows, slower straggler
    # One row with a long budget approaches the unbatched expectation 1 + a + ... + a^K.
    long_budget = batch_tokens_per_round([0.8] * 4, 4, 4000, batch=1)
    assert long_budget == pytest.approx(geometric_tokens_per_round(0.8, 4), rel=0.02)


def test_kv_cache_bytes_is_the_size_of_the_real_cache():
    for config in (BYTE_CONFIG, BYTE_CONFIG.replace(dtype="bfloat16", num_key_value_heads=4)):
        cache = init_cache(config, 3, 80)
        assert kv_cache_bytes(config, 3, 80) == cache.k.nbytes + cache.v.nbytes


def test_weight_bytes_count_every_matrix_but_the_lookup_table():
    untied = specjax.init_model(BYTE_CONFIG)
    sizes = {name: sum(x.size for x in jax.tree.leaves(p)) for name, p in untied.params.items()}
    assert matmul_parameters(untied) == untied.num_parameters - sizes["embed"]
    tied = specjax.init_model(BYTE_CONFIG.replace(tie_word_embeddings=True))
    assert matmul_parameters(tied) == tied.num_parameters  # the table is the LM head too
    narrow, wide = forward_estimate(untied, 1, 1, 64), forward_estimate(untied, 1, 8, 64)
    assert wide["bytes_moved"] == narrow["bytes_moved"]  # same weights and cache, more work
    assert wide["arithmetic_intensity"] == pytest.approx(8 * narrow["arithmetic_intensity"])


def test_bad_bench_configs_name_the_problem():
    with pytest.raises(ValueError, match="unknown experiment 'e9'"):
        from_dict(BenchConfig, {"experiments": ["e9"]})
    with pytest.raises(ValueError, match=r"K\) must be >= 1"):
        from_dict(BenchConfig, {"k_sweep": {"ks": [0, 2]}})
    with pytest.raises(ValueError, match=r"unknown config key k_sweep\.k;"):
        from_dict(BenchConfig, {"k_sweep": {"k": [2]}})


# --- A whole bench run on tiny byte-level models --------------------------------------------


def bench_pair() -> tuple[specjax.Model, specjax.Model]:
    """The bench runs' byte-level target and its noisy draft (also E11's and E12's)."""
    target = scaled_model(BENCH_CONFIG, seed=0)
    target = specjax.Model(target.config, target.params, tokenizer=ByteTokenizer())
    return target, noisy_copy(target, noise=0.4, seed=3)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    target, draft = bench_pair()
    out = tmp_path_factory.mktemp("bench")
    results = run_bench(from_dict(BenchConfig, TINY_BENCH), out, target=target, draft=draft, progress=False)
    return results, out


def _experiment(bench, name):
    return bench[0]["experiments"][name]


def test_bench_writes_results_plots_and_tables(bench):
    results, out = bench
    assert set(results["experiments"]) == set(TINY_EXPERIMENTS)
    for experiment in results["experiments"].values():
        assert (out / experiment["plot"]).stat().st_size > 10_000  # a real PNG, not an empty figure
        assert (out / experiment["csv"]).is_file()
    saved = json.loads((out / "results.json").read_text())
    assert saved["schema_version"] == 2 and saved["environment"]["backend"] == "cpu"
    assert saved["command"] is None and "- command:" not in (out / "summary.md").read_text()  # the Python API
    assert {"tpot_ms", "mean_acceptance_length"} <= set(saved["definitions"])
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows and list(rows[0])[: len(ROW_FIELDS)] == ROW_FIELDS
    assert all(row[field] != "" for row in rows for field in ROW_FIELDS)
    summary = (out / "summary.md").read_text()
    assert all(f"![{name}]" in summary for name in TINY_EXPERIMENTS)
    # Programs compiled are logged per experiment. These three compile programs no earlier
    # experiment did, even with caches kept (E2 times forwards, E3 launches whole generations,
    # E5 steps on caches of new capacities).
    counts = {name: e["compiled_programs"] for name, e in results["experiments"].items()}
    assert all(counts[name] > 0 for name in ("verify_cost", "k_sweep", "context_sweep"))
    assert results["compiled_programs"] == sum(counts.values())
    # ... and the seconds they took, within the experiment's own.
    for e in results["experiments"].values():
        assert (e["compile_seconds"] > 0) == (e["compiled_programs"] > 0) and e["compile_seconds"] < e["seconds"]


def test_bench_records_the_machine_load_and_each_figures_setting(bench):
    out = bench[1]
    saved = json.loads((out / "results.json").read_text())
    load = saved["load_average"]
    assert len(load["start"]) == len(load["end"]) == 3 and load["cpu_count"] >= load["cpus_available"] >= 1
    assert all(len(e["load_average"]["end"]) == 3 for e in saved["experiments"].values())
    assert load["end"] == saved["experiments"][TINY_EXPERIMENTS[-1]]["load_average"]["end"]
    summary = (out / "summary.md").read_text()
    assert "- load average (1/5/15 min): " in summary
    settings = {name: e["setting"] for name, e in saved["experiments"].items()}
    assert settings["k_sweep"]["text"].startswith("batch 1; temperature 0; 2 prompts, 12 new tokens each;")
    assert (settings["k_sweep"]["batch_size"], settings["k_sweep"]["prompts"], settings["k_sweep"]["repeats"]) == (
        1,
        2,
        2,
    )
    assert settings["batch_sweep"]["batch_size"] == [1, 4] and "batch swept: 1, 4" in settings["batch_sweep"]["text"]
    assert "temperature swept: 0, 1" in settings["tokens_per_round"]["text"]
    assert all(f"- setting: {s['text']}" in summary for s in settings.values())


def test_timed_rows_keep_every_repeat(bench):
    for row in bench[0]["rows"]:
        repeats = row["tokens_per_second_repeats"]
        assert len(repeats) == TINY_BENCH["timing"]["repeats"]
        assert np.median(repeats) == pytest.approx(row["tokens_per_second"])
        assert np.median(row["speedup_vs_plain_repeats"]) == pytest.approx(row["speedup_vs_plain"])


def test_summary_flags_exactly_the_speedups_far_from_their_prediction(bench):
    assert prediction_flag(1.10, 1.62) == "⚠ measured 1.10x vs predicted 1.62x (-32%)"
    assert prediction_flag(2.0, 1.5) == "⚠ measured 2.00x vs predicted 1.50x (+33%)"
    assert prediction_flag(1.24, 1.0) is None and prediction_flag(0.76, 1.0) is None
    assert prediction_flag(1.26, 1.0) is not None and prediction_flag(0.74, 1.0) is not None
    rows = [
        {"method": "plain", "num_speculative_tokens": 0, "batch_size": 1, "speedup_vs_plain": 1.0},
        {"num_speculative_tokens": 2, "batch_size": 1, "speedup_vs_plain": 1.5, "predicted_speedup": 1.6},
        {"num_speculative_tokens": 4, "batch_size": 1, "speedup_vs_plain": 1.1, "predicted_speedup": 1.62},
    ]
    assert prediction_flags(rows) == ["- ⚠ measured 1.10x vs predicted 1.62x (-32%): K=4, batch 1"]
    # The tiny run's summary.md: a flag for every E3/E4 row beyond the tolerance, and no other.
    summary = (bench[1] / "summary.md").read_text()
    for name in ("k_sweep", "batch_sweep"):
        for row in _experiment(bench, name)["rows"]:
            if "predicted_speedup" in row:
                gap = row["speedup_vs_plain"] / row["predicted_speedup"] - 1
                line = f"- ⚠ measured {row['speedup_vs_plain']:.2f}x vs predicted {row['predicted_speedup']:.2f}x"
                assert (line in summary) == (abs(gap) > PREDICTION_TOLERANCE)


def test_summary_flags_rows_whose_repeats_disagree():
    """A stall in one timed repeat (E8 on SmolLM2: 106.8 and 17.9 tokens/s) moves a median of two:
    the summary names every row whose repeats spread more than 15% of their median, no other."""
    rows = [
        {"method": "plain", "batch_size": 1, "tokens_per_second": 100.0, "tokens_per_second_repeats": [98.0, 104.0]},
        {"method": "speculative", "drafter": "block head", "num_speculative_tokens": 4, "batch_size": 1,
         "temperature": 0.0, "tokens_per_second": 62.4, "tokens_per_second_repeats": [106.8, 17.9]},
        {"method": "speculative", "num_speculative_tokens": 2, "batch_size": 1, "tokens_per_second": 50.0},
    ]  # fmt: skip
    assert spread_flags(rows) == [
        "- ⚠ repeats 142% apart (tokens/s 106.8, 17.9): speculative, block head, K=4, batch 1, T=0, all"
    ]


def _figure(monkeypatch, plot, result):
    """The figure a plot function draws, kept instead of saved."""
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path, result=None: figures.append(fig) or path)
    plot(result, "unused.png", "test")
    return figures[0]


def test_e6_histogram_is_bars(monkeypatch):
    rows = [
        {"num_speculative_tokens": k, "rounds": 10, "rounds_accepting": histogram, "accepted_per_round": 1.0}
        | {"correction_per_round": 0.5, "bonus_per_round": 0.5, "wasted_per_round": 1.0}
        for k, histogram in ((1, [4, 6]), (3, [2, 3, 1, 4]))
    ]
    assert e06_waste.acceptance_histogram(rows) == {"K=1": [0.4, 0.6], "K=3": [0.2, 0.3, 0.1, 0.4]}
    histogram = _figure(monkeypatch, e06_waste.plot, {"rows": rows}).axes[1]
    assert not histogram.lines
    heights = sorted(round(p.get_height(), 6) for p in histogram.patches)
    assert heights == sorted([0.4, 0.6, 0.2, 0.3, 0.1, 0.4])


def test_optimum_markers_sit_on_the_measured_and_predicted_best(monkeypatch):
    def row(k, measured, predicted, **extra):
        return {"method": "speculative", "category": "all", "num_speculative_tokens": k}, {
            "speedup_vs_plain": measured,
            "speedup_vs_plain_repeats": [measured - 0.1, measured, measured + 0.05],
            "predicted_speedup": predicted,
            **extra,
        }

    rows = [a | b for a, b in (row(1, 1.3, 1.2), row(2, 1.7, 1.5), row(4, 1.5, 1.9), row(4, 1.8, 1.9, adaptive=True))]
    rows.append(rows[1] | {"category": "code", "speedup_vs_plain": 2.5})  # one category: not the pooled sweep
    plain = {"method": "plain", "category": "all", "num_speculative_tokens": 0, "speedup_vs_plain": 1.0}
    static = [r for r in plots.pooled(rows) if not r.get("adaptive")]
    assert plots.optimum(static, "num_speculative_tokens") == (2, 1.7)
    assert plots.optimum(static, "num_speculative_tokens", "predicted_speedup") == (4, 1.9)
    assert plots.spread(static[:1], "speedup_vs_plain") == [[pytest.approx(0.1)], [pytest.approx(0.05)]]
    ax = _figure(monkeypatch, e03_k_sweep.plot, {"rows": [plain, *rows]}).axes[0]
    marks = {line.get_label().split(":")[0]: (line.get_xdata()[0], line.get_ydata()[0]) for line in ax.lines}
    assert marks["measured optimum"] == (2, 1.7)  # not the adaptive twin's 1.8 at K=4
    assert marks["predicted optimum"] == (4, 1.9)
    assert list(next(line for line in ax.lines if line.get_label() == "measured").get_xdata()) == [1, 2, 4]


def test_compiled_programs_counts_compiles_not_cache_hits():
    before, seconds = compiled_programs(), compile_seconds()
    double = jax.jit(lambda x: 2 * x + 1)
    double(np.ones(3, np.float32))
    assert compiled_programs() == before + 1
    compiled = compile_seconds()
    assert compiled > seconds
    double(np.zeros(3, np.float32))  # same shape: a cache hit
    assert compiled_programs() == before + 1 and compile_seconds() == compiled


def test_forward_timings_compile_nothing_while_timed(monkeypatch):
    """CostTable.seconds warms up until no compile is left: its first call's cache comes back
    donated and committed, another jit key, so with one warm-up call the first timed call
    compiled (a median of 2 repeats was then ~1000x a forward)."""
    from specjax.bench import cost_model

    compiles = []

    def timed(call):
        before = compiled_programs()
        jax.block_until_ready(call())
        compiles.append(compiled_programs() - before)
        return 1.0

    monkeypatch.setattr(cost_model, "timed", timed)
    # Its own programs, none the bench fixture's kept (one layer like them, a narrower MLP): no cache hit.
    model = scaled_model(BENCH_CONFIG.replace(intermediate_size=48), seed=5)
    table = cost_model.CostTable(inner=2, repeats=3)
    assert table.seconds(model, 1, 2, 32) == table.seconds(model, 1, 2, 32, fill=16) == 0.5  # per inner forward
    assert compiles == [0] * 6


def test_measured_rows_are_consistent(bench):
    rows = bench[0]["rows"]
    for row in rows:
        # TTFT and latency are timed in separate calls, so on a tiny row (one or two rounds)
        # noise can order them either way: the test checks what was timed, not how fast.
        assert row["ttft_ms"] > 0 and row["latency_ms"] > 0
        latency, first = np.asarray(row["latency_seconds"]), np.asarray(row["first_token_seconds"])
        assert latency.shape == first.shape and latency.shape[1] == row["requests"]
        assert row["tokens_per_second"] > 0
        if row["method"] == "plain":
            assert row["speedup_vs_plain"] == 1.0 and row["target_forwards_per_token"] == pytest.approx(1.0, abs=0.1)
        else:
            assert row["output_matches_plain"], "greedy speculation must reproduce plain greedy decoding"
            assert row["drafted_tokens"] == row["accepted_tokens"] + row["wasted_positions"]
            if "draft_time_share" in row:  # E3 rows carry the cost model's breakdown
                assert 0 < row["draft_time_share"] < 1
    assert {r["batch_size"] for r in rows if r["experiment"] == "E4"} == {1, 4}


def test_non_forward_time_is_an_iteration_less_its_forwards_never_negative(bench):
    """non_forward_ms_per_iteration: a loop iteration timed in isolation less its forwards timed in
    isolation on the same cache (it was the end-to-end iteration less forwards on a full cache,
    negative for plain decoding); a difference below zero is noise: 0, the difference recorded."""
    iteration = {}  # (experiment, batch, K; 0 = a plain step) -> seconds, as the cost model timed it
    for row in _experiment(bench, "k_sweep")["rows"]:
        if "cost_round_seconds" in row:
            iteration["E3", row["batch_size"], row["num_speculative_tokens"]] = row["cost_round_seconds"]
            iteration["E3", row["batch_size"], 0] = row["cost_plain_step_seconds"]
    for p in _experiment(bench, "batch_sweep")["predictions"]:
        iteration["E4", p["batch_size"], p["num_speculative_tokens"]] = p["cost_round_seconds"]
        iteration["E4", p["batch_size"], 0] = p["cost_plain_step_seconds"]
    rows = [r for r in bench[0]["rows"] if "non_forward_ms_per_iteration" in r]
    assert {r["experiment"] for r in rows} == {"E3", "E4"} and any(r["method"] == "plain" for r in rows)
    for row in rows:
        key = (row["experiment"], row["batch_size"], row["num_speculative_tokens"])
        outside = 1e3 * iteration[key] - row["forward_ms_per_iteration"]
        assert row["non_forward_ms_per_iteration"] == pytest.approx(max(outside, 0.0))
        assert row.get("non_forward_noise_ms", 0.0) == pytest.approx(min(outside, 0.0))


def test_every_experiments_summary_line_says_something(bench):
    """E4's summary holds only per-batch mappings: `specjax bench` printed an empty line for it."""
    from specjax.bench.report import summary_line

    line = summary_line(_experiment(bench, "batch_sweep"))
    assert line.startswith("predicted_speedup_by_batch={1: ") and "measured_speedup_by_batch={1: " in line
    assert all(summary_line(e) for e in bench[0]["experiments"].values())


def test_e1_per_position_product_reproduces_the_measured_round(bench):
    for row in _experiment(bench, "tokens_per_round")["rows"]:
        k = row["num_speculative_tokens"]
        assert 1.0 <= row["measured_tokens_per_round"] <= k + 1
        if k == 1:  # with one position the pooled alpha is the acceptance itself
            assert row["predicted_geometric"] == pytest.approx(row["measured_tokens_per_round"])
        if k == K_MAX:  # the profile was measured at K_max, so here it is an identity
            assert row["predicted_per_position"] == pytest.approx(row["measured_tokens_per_round"])


def test_e2_verify_cost_is_relative_to_width_one(bench):
    rows = _experiment(bench, "verify_cost")["rows"]
    assert [r["relative_cost"] for r in rows if r["width"] == 1] == [1.0, 1.0]
    for batch in (1, 2):
        intensity = [r["arithmetic_intensity"] for r in rows if r["batch_size"] == batch]
        assert intensity == sorted(intensity)


def test_e5_kv_bytes_grow_linearly_and_oversized_contexts_are_skipped(bench):
    result = _experiment(bench, "context_sweep")
    kv = {r["context"]: r["kv_cache_bytes"] for r in result["rows"] if r["kind"] == "context"}
    assert kv[128] == 2 * kv[64]
    assert result["skipped_contexts"] == [4096]  # beyond max_position_embeddings


def test_e5_fill_and_capacity_vary_separately(bench):
    rows = [r for r in _experiment(bench, "context_sweep")["rows"] if r["kind"] == "fill_capacity"]
    shapes = {(r["capacity"], r["fill"], r["attention"], r["cache_dtype"]) for r in rows}
    # Fill 300 does not fit a 128-slot cache; everything else is measured both ways, both dtypes.
    assert len(shapes) == len(rows) == 3 * 2 * 2
    read = {(r["capacity"], r["fill"], r["attention"], r["cache_dtype"]): r["kv_bytes_read"] for r in rows}
    # Blockwise reads whole blocks up to the fill (the block holding position p is block
    # p // size); full reads the whole capacity.
    size = DEFAULT_BLOCK_SIZE
    for fill in (16, 300):
        slots = (fill // size + 1) * size
        assert read[(640, fill, "blockwise", "float32")] * 640 == read[(640, fill, "full", "float32")] * slots
    assert read[(640, 16, "blockwise", "bfloat16")] * 2 == read[(640, 16, "blockwise", "float32")]
    assert all(r["decode_seconds"] > 0 for r in rows)
    dtypes = {
        r["cache_dtype"]: r
        for r in _experiment(bench, "context_sweep")["rows"]
        if r["kind"] == "cache_dtype_acceptance"
    }
    assert set(dtypes) == {"float32", "bfloat16"}
    assert all(1.0 <= r["mean_acceptance_length"] <= 3.0 for r in dtypes.values())


def test_e6_every_verified_position_is_accounted_for(bench):
    for row in _experiment(bench, "waste")["rows"]:
        k = row["num_speculative_tokens"]
        assert row["accepted_per_round"] + row["wasted_per_round"] == pytest.approx(k)
        assert row["correction_per_round"] + row["bonus_per_round"] == pytest.approx(1.0)
        assert sum(row["rounds_accepting"]) == row["rounds"]
        # Kept = accepted + the one correction/bonus token, out of K + 1 verified positions.
        assert row["kept_fraction_of_verified"] == pytest.approx((row["accepted_per_round"] + 1) / (k + 1))


def test_e7_exact_sampling_passes_and_the_negative_control_fails(bench):
    result = _experiment(bench, "sampling")
    assert result["summary"]["exact_rule_passes"]
    assert result["summary"]["negative_control_fails"]
    exact, control = result["distribution_test"]
    assert control["tv_token_1"] > exact["tv_token_1"]


def test_bench_cli_with_a_random_weight_model_config(tmp_path, capsys):
    model = {"vocab_size": 259, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    config = tmp_path / "bench.yaml"
    config.write_text(json.dumps({"target": model, "draft": model, "experiments": ["waste", "verify_cost"]}))
    overrides = ["--set", "waste.ks=[2]", "--set", "verify_cost.widths=[1,3]", "--set", "bandwidth_megabytes=8"]
    assert main(["bench", "--config", str(config), "--out", str(tmp_path / "out"), "--no-progress", *overrides]) == 0
    assert "E6 waste" in capsys.readouterr().out
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    # The command that reruns it, in results.json and summary.md (the Python API records none).
    command = shlex.join(["specjax", "bench", "--config", str(config), "--out", str(tmp_path / "out"), *overrides])
    assert saved["command"] == command
    assert f"- command: `{command}`" in (tmp_path / "out" / "summary.md").read_text()
    assert saved["models"]["target"]["name"] == "random weights"
    assert [r["width"] for r in saved["experiments"]["verify_cost"]["rows"]] == [1, 3]
    assert np.isfinite(saved["machine"]["memory_bandwidth_bytes_per_second"])


def test_bench_cli_rejects_a_misspelt_key(tmp_path, capsys):
    config = tmp_path / "bench.yaml"
    config.write_text("k_sweep: {kss: [1]}\n")
    assert main(["bench", "--config", str(config), "--out", str(tmp_path / "out")]) == 2
    assert "unknown config key k_sweep.kss" in capsys.readouterr().err


def test_measured_calls_compile_nothing_while_timed(monkeypatch, target, noisy_draft):
    """The warm-up ran `run()` (prefill + chunked rounds) while the clock timed `launch()`
    (one program): the first timed launch of every shape compiled, and a median of two
    repeats was half a compile (int8 SmolLM2: 231 ms per step instead of 22)."""
    from specjax.bench import measure
    from specjax.bench.measure import RunSpec, Workload
    from specjax.engine import clock

    compiles = []

    def timed(fn):
        before = compiled_programs()
        jax.block_until_ready(fn())
        compiles.append(compiled_programs() - before)
        return 1.0

    monkeypatch.setattr(clock, "timed", timed)  # under the bench's timed_warm
    jax.clear_caches()  # so that programs compiled by earlier tests do not hide a compile
    work = Workload(target, {"d": noisy_draft}, [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12]], ["a", "b"], 3)
    specs = [RunSpec("speculative", 1, 2, 0.0, "d")]
    measure.measure(work, specs, repeats=1, warmup=1, tpot_target_ms=100.0)
    assert compiles and compiles == [0] * len(compiles), compiles


def test_a_timed_sample_never_holds_a_compile():
    # A launch whose program was evicted (runtime.bound_live_programs clears JAX's caches) compiles
    # inside its timed call: the bench and every round-robin (`interleaved`) drop it and time again.
    from specjax.engine.clock import interleaved, timed_warm

    program = jax.jit(lambda x: jax.numpy.tanh(x) * 3)
    calls = []

    def launch():
        calls.append(1)
        return program(np.ones(7, np.float32))

    timed_warm(launch)
    assert len(calls) == 2  # compiled: timed again
    timed_warm(launch)
    assert len(calls) == 3  # warm: one call
    times = interleaved({"launch": launch, "evict": lambda: jax.clear_caches()}, repeats=2, warmup=1)
    assert len(calls) == 3 + 1 + 2 * 2  # its warm-up, then each repeat after an eviction twice
    assert len(times["launch"]) == 2
