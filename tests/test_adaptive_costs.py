"""Adaptive speculation's round costs: measured once, cached on disk under the user cache,
read back by this process and by another one, measured again on request or when the file is
unreadable."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_adaptive import NEW
from test_drafters import PROMPTS

import specjax
from specjax.core.sampling import SamplingConfig
from specjax.engine.adaptive_policy import RoundCosts


@pytest.fixture(scope="module")
def plain(target):
    return specjax.generate(target, PROMPTS, specjax.GenerationConfig(max_new_tokens=NEW))


# A second process: the same models (the fixtures' seeds) and prompts, the costs from the
# cache file the first one wrote. It prints what it generated and where its costs came from.
_SECOND_PROCESS = """
import json, sys
sys.path.insert(0, sys.argv[1])
from conftest import TARGET_CONFIG, noisy_copy, scaled_model
import specjax
target = scaled_model(TARGET_CONFIG, seed=0)
draft = noisy_copy(target, noise=0.1, seed=3)
prompts, new = json.loads(sys.argv[2]), int(sys.argv[3])
config = specjax.GenerationConfig(max_new_tokens=new)
speculative = specjax.SpeculativeConfig(num_speculative_tokens=2, adaptive=True)
out = specjax.generate(target, prompts, config, draft=draft, speculative=speculative)
print(json.dumps({"tokens": out.tokens, "adaptive": out.stats.adaptive}))
"""


@pytest.fixture
def few_repeats(monkeypatch):
    """Measuring times each loop twice, not seven times: these tests check where costs come from."""
    from specjax.engine import round_costs

    monkeypatch.setattr(round_costs, "REPEATS", 2)
    return round_costs


def test_measured_costs_are_cached_on_disk_and_reused_by_another_process(target, noisy_draft, plain, few_repeats):
    out = specjax.generate(
        target,
        PROMPTS,
        specjax.GenerationConfig(max_new_tokens=NEW),
        draft=noisy_draft,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=2, adaptive=True),
    )
    assert out.tokens == plain.tokens
    costs, where = out.stats.adaptive["costs_seconds"], out.stats.adaptive["costs"]
    assert len(costs) == 3 and all(c > 0 for c in costs)
    assert where["source"] == "measured" and where["seconds"] >= where["measurement_seconds"] > 0
    path = Path(where["path"])
    assert path.parent == Path(os.environ["SPECJAX_CACHE_DIR"]) / "round_costs"
    record = json.loads(path.read_text())
    assert record["key"]["batch"] == 8 and record["key"]["candidates"] == ["0", "1", "2"]
    assert where["per_k_ms"] == {k: round(1e3 * c, 4) for k, c in zip((0, 1, 2), costs, strict=True)}
    # The same shape again in this process reads the file and measures nothing.
    measured = len(few_repeats._SECONDS)
    again = specjax.generate(
        target,
        PROMPTS,
        specjax.GenerationConfig(max_new_tokens=NEW),
        draft=noisy_draft,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=2, adaptive=True),
    )
    assert len(few_repeats._SECONDS) == measured
    assert again.stats.adaptive["costs"]["source"] == "cache"
    assert again.stats.adaptive["costs_seconds"] == costs
    # ... and so does a fresh process: same costs, same schedule, same tokens.
    argv = [str(Path(__file__).parent), json.dumps(PROMPTS), str(NEW)]
    done = subprocess.run(
        [sys.executable, "-c", _SECOND_PROCESS, *argv], capture_output=True, text=True, timeout=300, check=True
    )
    second = json.loads(done.stdout.splitlines()[-1])
    assert second["tokens"] == out.tokens
    assert second["adaptive"]["costs"]["source"] == "cache"
    assert second["adaptive"]["costs"]["measured_at"] == where["measured_at"]
    assert second["adaptive"]["costs_seconds"] == costs
    assert second["adaptive"]["chosen_k"] == out.stats.adaptive["chosen_k"]
    assert "measuring round costs" not in done.stderr


def test_remeasure_overwrites_and_a_corrupt_cache_is_measured_again(target, noisy_draft, few_repeats, capfd):
    def run(**options):
        adaptive = specjax.AdaptiveConfig(**options)
        # The shape of the test above: its measurement and compiled loops serve this one.
        return specjax.generate(
            target,
            PROMPTS,
            specjax.GenerationConfig(max_new_tokens=NEW),
            draft=noisy_draft,
            speculative=specjax.SpeculativeConfig(num_speculative_tokens=2, adaptive=adaptive),
        )

    first = run(progress=False).stats.adaptive["costs"]
    path = first["path"]
    # remeasure measures again (this process's memo included) and overwrites the file; the
    # bar shows what it is doing, on stderr only when asked.
    capfd.readouterr()
    quiet = run(remeasure=True, progress=False).stats.adaptive["costs"]
    assert capfd.readouterr().err == ""
    loud = run(remeasure=True, progress=True).stats.adaptive["costs"]
    assert "measuring round costs (K=0,1,2)" in capfd.readouterr().err
    for remeasured in (quiet, loud):
        assert remeasured["source"] == "measured" and remeasured["path"] == path
    assert json.loads(Path(path).read_text())["measurement_seconds"] == loud["measurement_seconds"]
    assert run().stats.adaptive["costs"]["per_k_ms"] == loud["per_k_ms"]
    # A file cut short (or edited by hand) is ignored, with a warning, and written again.
    Path(path).write_text('{"key": {"format": 1}, "costs_sec')
    with pytest.warns(UserWarning, match="unreadable round-cost cache"):
        assert run().stats.adaptive["costs"]["source"] == "measured"
    assert run().stats.adaptive["costs"]["source"] == "cache"
    assert not [p for p in Path(path).parent.iterdir() if p.suffix != ".json"]  # no temporary files left


def test_prepare_resolves_costs_with_the_whole_sampling_config_and_carries_them(target, noisy_draft, monkeypatch):
    """Costs are an input: `prepare` resolves them before anything runs (engine/costs.py),
    timing the loop with the call's whole SamplingConfig (top-k, top-p and min-p too), and
    the prepared call carries them with where they came from. The timing here is a stand-in:
    this checks what it is asked for and where its answer goes, not the clock."""
    from specjax.engine import costs as cost_module

    asked = []

    def fake_measure(target, drafter, batch, config, context, sampling, **options):
        asked.append(sampling)
        return {label: 1e-3 * (i + 1) for i, label in enumerate(config.labels)}

    monkeypatch.setattr(cost_module, "measure_round_costs", fake_measure)
    config = specjax.GenerationConfig(
        max_new_tokens=NEW, do_sample=True, temperature=0.8, top_k=7, top_p=0.9, min_p=0.05
    )
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=2, adaptive=True)

    def prepare(config):
        return specjax.prepare(target, PROMPTS, config, draft=noisy_draft, speculative=speculative)

    prepared = prepare(config)
    assert asked == [SamplingConfig(0.8, 7, 0.9, 0.05)]
    costs = prepared.costs
    assert (costs.source, costs.labels, costs.seconds) == ("measured", (0, 1, 2), tuple(np.float32([1e-3, 2e-3, 3e-3])))
    assert costs.vector.dtype == np.float32
    key = json.loads(Path(costs.path).read_text())["key"]
    assert key["sampling"] == dict(temperature=0.8, top_k=7, top_p=0.9, min_p=0.05)
    # The same call again reads the file; another top_p is another shape, measured anew.
    again = prepare(config).costs
    assert len(asked) == 1 and again.source == "cache" and again.seconds == costs.seconds
    assert prepare(config.replace(top_p=0.5)).costs.source == "measured" and len(asked) == 2
    # Plain decoding and fixed K have no costs to resolve.
    assert specjax.prepare(target, PROMPTS, config).costs is None
    fixed = specjax.SpeculativeConfig(num_speculative_tokens=2)
    assert specjax.prepare(target, PROMPTS, config, draft=noisy_draft, speculative=fixed).costs is None


def test_each_prepared_call_reports_its_own_costs(target, noisy_draft, plain):
    """Provenance lives on the call, not in a table keyed by what the loop carries back: two
    calls of one plan report their own costs, and a bare state (init_state) only the values."""
    given = specjax.AdaptiveConfig(costs={0: 1e-3, 1: 2e-3, 2: 2.5e-3})
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=2, adaptive=given)
    config = specjax.GenerationConfig(max_new_tokens=NEW)
    first = specjax.prepare(target, PROMPTS, config, draft=noisy_draft, speculative=speculative)
    other = dataclasses.replace(given, costs={0: 1e-3, 1: 4e-3, 2: 9e-3})
    second = specjax.prepare(
        target, PROMPTS, config, draft=noisy_draft, speculative=speculative.replace(adaptive=other)
    )
    out = first.run()
    assert out.tokens == plain.tokens
    assert out.stats.adaptive["costs"] == first.costs.report()
    assert out.stats.adaptive["costs"]["per_k_ms"] == {0: 1.0, 1: 2.0, 2: 2.5}
    assert out.stats.adaptive["costs"]["source"] == "given"
    assert second.run().stats.adaptive["costs"]["per_k_ms"] == {0: 1.0, 1: 4.0, 2: 9.0}
    state = specjax.init_state(target, PROMPTS, config, draft=noisy_draft, speculative=speculative)
    bare = specjax.state_output(state).stats.adaptive
    assert bare["costs"] is None and bare["costs_seconds"] == list(first.costs.seconds)


def test_round_costs_check_what_they_hold():
    config = specjax.AdaptiveConfig().resolved(2)
    with pytest.raises(ValueError, match=r"lack K=\[2\]"):
        RoundCosts.of(config, {0: 1.0, 1: 2.0}, "given")
    with pytest.raises(ValueError, match="positive seconds"):
        RoundCosts.of(config, {0: 1.0, 1: 2.0, 2: 0.0}, "given")
    with pytest.raises(ValueError, match="cost source must be one of"):
        RoundCosts.of(config, {0: 1.0, 1: 2.0, 2: 3.0}, "guessed")
    with pytest.raises(ValueError, match="2 costs for 3 candidates"):
        RoundCosts((0, 1, 2), (1.0, 2.0), "given")


def test_timed_loops_key_on_the_whole_sampling_config(target, noisy_draft):
    """The bench's loops pass a bare temperature; the generation's pass its SamplingConfig."""
    from specjax.engine.timed_loops import TimedLoop

    bare = TimedLoop("round", target, noisy_draft, 1, 2, 32, 0.7)
    assert bare.sampling == SamplingConfig(0.7)
    assert bare.key == TimedLoop("round", target, noisy_draft, 1, 2, 32, SamplingConfig(0.7)).key
    assert bare.key != TimedLoop("round", target, noisy_draft, 1, 2, 32, SamplingConfig(0.7, top_p=0.9)).key
