"""`specjax bench` E11 (adaptive K against plain and every static K) on the tiny byte-level
pair of tests/test_bench.py, in a file of its own so that pytest-xdist runs it beside the rest
of the bench run."""

from __future__ import annotations

import pytest
from test_bench import K_MAX, TINY_BENCH, bench_pair

from specjax.bench import BenchConfig, run_bench
from specjax.configs import from_dict


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    target, draft = bench_pair()
    config = from_dict(BenchConfig, {**TINY_BENCH, "experiments": ["adaptive_sweep"]})
    out = tmp_path_factory.mktemp("bench_adaptive")
    return run_bench(config, out, target=target, draft=draft, progress=False), out


def _experiment(bench, name):
    return bench[0]["experiments"][name]


def test_e11_compares_adaptive_with_plain_and_every_static_k(bench):
    result = _experiment(bench, "adaptive_sweep")
    scenarios = [(c["scenario"], c["batch_size"]) for c in result["comparisons"]]
    assert scenarios == [("pair", 1), ("shift", 1)]
    for c in result["comparisons"]:
        assert set(c["static_speedups"]) == {1, K_MAX}
        assert isinstance(c["meets_aim"], bool) and c["adaptive_speedup_vs_plain"] > 0
        assert sum(c["adaptive_rounds_per_k"].values()) > 0
    adaptive_rows = [r for r in result["rows"] if r.get("adaptive")]
    assert adaptive_rows and all(r["output_matches_plain"] for r in adaptive_rows)
    assert all(r["num_speculative_tokens"] == K_MAX and r["adaptive_costs_seconds"] for r in adaptive_rows)
    assert len(result["trajectory"]["chosen_k"]) == len(result["trajectory"]["estimate_position_1"]) > 0
    (predicted,) = result["predictions"]
    assert predicted["batch_size"] == 2 and set(predicted["predicted_static_speedups"]) == {1, K_MAX}
    assert (
        predicted["predicted_adaptive_speedup"] > 0 and sum(predicted["predicted_adaptive_rounds_per_k"].values()) > 0
    )
    assert "predicted (batch 2)" in result["summary"]
