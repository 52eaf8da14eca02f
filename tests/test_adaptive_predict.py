"""E11's prediction: the real policy and static K simulated on given round costs."""

from __future__ import annotations

import math

import pytest

import specjax
from specjax.bench.adaptive_predict import predict, simulate

COSTS = {0: 1.0, 1: 1.2, 2: 1.4, 4: 1.8, 8: 2.6}
NEW = 128


def test_static_k_with_a_perfect_draft_takes_exactly_the_rounds_it_needs():
    config = specjax.AdaptiveConfig(ks=(0, 4)).resolved(4)
    out = simulate(config, COSTS, [1.0] * 4, batch=3, max_new_tokens=NEW, fixed=4, samples=2)
    rounds = math.ceil(NEW / 5)  # every round commits K + 1 = 5 tokens to every row
    assert out["rounds"] == rounds
    assert out["seconds"] == pytest.approx(rounds * COSTS[4])
    assert out["rounds_per_k"] == {0: 0.0, 4: rounds}


def test_predicted_policy_switches_a_useless_draft_off_and_a_perfect_one_to_k_max():
    config = specjax.AdaptiveConfig().resolved(8)
    useless = predict(config, COSTS, [0.0] * 8, batch=4, max_new_tokens=NEW, static_ks=[2, 8])
    assert useless["best_static_k"] == 2 and useless["predicted_static_speedups"][8] < 0.5
    # Probes and the first round cost a few plain steps' worth.
    assert 0.9 < useless["predicted_adaptive_speedup"] <= 1.0
    assert useless["predicted_adaptive_rounds_per_k"][0] > 0.9 * NEW
    perfect = predict(config, COSTS, [1.0] * 8, batch=4, max_new_tokens=NEW, static_ks=[2, 8])
    assert perfect["best_static_k"] == 8
    assert perfect["adaptive_vs_best"] > 0.95


def test_simulation_refuses_what_it_cannot_predict():
    with pytest.raises(ValueError, match="profile of 2 positions cannot predict K = 8"):
        simulate(specjax.AdaptiveConfig().resolved(8), COSTS, [0.5, 0.5], batch=1, max_new_tokens=NEW)
    trees = specjax.AdaptiveConfig(trees=(specjax.Tree.chain(2),)).resolved(2)
    with pytest.raises(ValueError, match="chains only"):
        simulate(trees, {0: 1.0, "tree0": 1.2}, [0.5, 0.5], batch=1, max_new_tokens=NEW)
