"""Adaptive speculation: exact output whatever K the policy picks, the policy's choices on
synthetic inputs, the draft cache after plain steps, and one compiled program."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TARGET_CONFIG, scaled_model
from test_compile import _generation_compiles, compiles  # noqa: F401 (a fixture)
from test_drafters import PROMPTS, SAMPLE_PROMPT, VOCAB8, two_sample_p_value
from test_heads import random_eagle, random_heads

import specjax
from specjax.core.acceptance import always_accept_rule
from specjax.core.loop import prefill, token_buffer
from specjax.core.sampling import SamplingConfig
from specjax.drafters import DraftContext, DraftModel, Fallback, LayerSkip, PromptLookup
from specjax.drafters.draft_model import resync
from specjax.engine.adaptive import _learn
from specjax.engine.adaptive_policy import (
    AdaptiveState,
    choose,
    expected_tokens,
    init_adaptive,
    policy,
    token_moments,
)

NEW = 24
# Costs under which the policy keeps switching: the first round drafts K_MAX, then K = 0
# wins the argmax unless the draft always agrees, and probe_budget=1 probes with K = 1 after
# every plain step.
SWITCHING = specjax.AdaptiveConfig(
    ks=(0, 1, 2), costs={0: 1.0, 1: 2.0, 2: 100.0}, probe_budget=1.0, switch_cost=0.0, start_at_max=True
)
# Costs of a cheap draft: speculating pays as soon as the draft is accepted at all.
CHEAP = specjax.AdaptiveConfig(costs={0: 1.0, 1: 1.1, 2: 1.2, 4: 1.4})


def _drafters(noisy_draft, small_draft, target):
    return {
        "draft_model": DraftModel(noisy_draft),
        "prompt_lookup": PromptLookup(),
        "layer_skip": LayerSkip(layers=1),
        "lookup_then_model": Fallback(PromptLookup(), DraftModel(small_draft)),
        "medusa": random_heads(TARGET_CONFIG, num_heads=4, seed=0, scale=0.5),
        "eagle": random_eagle(target, seed=0, scale=8.0),
    }


@pytest.fixture(scope="module")
def plain(target):
    return specjax.generate(target, PROMPTS, specjax.GenerationConfig(max_new_tokens=NEW))


def _check_greedy_and_counters(out, plain):
    assert out.tokens == plain.tokens
    s, policy_stats = out.stats, out.stats.adaptive
    assert sum(policy_stats["rounds_per_k"].values()) == len(policy_stats["chosen_k"]) == s.target_forwards
    assert s.drafted_tokens <= 4 * s.rounds
    # Per-position rates divide by the rounds that drafted and reached the position (the CLI prints both counts).
    assert s.accepted_per_position == pytest.approx(
        [c / n if n else 0.0 for c, n in zip(s.accepted_counts, s.position_rounds, strict=True)]
    )
    assert (
        s.emitted_tokens == s.rounds + s.accepted_tokens and s.generated_tokens == s.emitted_tokens - s.truncated_tokens
    )


@pytest.mark.parametrize(
    ("name", "config"),
    [
        *[(name, "switching") for name in ("draft_model", "prompt_lookup", "layer_skip", "lookup_then_model")],
        *[(name, "switching") for name in ("medusa", "eagle")],
        # ("draft_model", "cheap") runs in test_second_adaptive_call_compiles_nothing, which
        # compiles that very program anyway and checks the same tokens and counters.
        ("eagle", "cheap"),
    ],
)
def test_adaptive_greedy_equals_plain_greedy(target, noisy_draft, small_draft, plain, name, config):
    drafter = _drafters(noisy_draft, small_draft, target)[name]
    adaptive = {"cheap": CHEAP, "switching": SWITCHING}[config]
    out = specjax.generate(
        target,
        PROMPTS,
        specjax.GenerationConfig(max_new_tokens=NEW),
        draft=drafter,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=4 if config == "cheap" else 2, adaptive=adaptive),
    )
    _check_greedy_and_counters(out, plain)
    policy_stats = out.stats.adaptive
    if config == "switching":
        assert set(policy_stats["chosen_k"]) == {0, 1, 2}  # the first round, plain steps and probes
        assert policy_stats["plain_steps"] > 0


def test_choose_prefers_plain_for_a_draft_that_never_agrees_and_k_max_for_one_that_always_does():
    # One compiled program per shape instead of op-by-op dispatch (ks, groups, objective are static).
    pick = jax.jit(choose, static_argnums=(3, 4, 5))
    ks = (0, 1, 2, 4, 8)
    groups = (0,) * len(ks)
    costs = jnp.asarray([1.0, 1.2, 1.5, 1.8, 2.6])
    live = jnp.full((3,), 100.0)  # tokens each row still needs
    assert int(pick(jnp.zeros((1, 3, 8)), live, costs, ks, groups)) == 0
    assert int(pick(jnp.ones((1, 3, 8)), live, costs, ks, groups)) == len(ks) - 1
    # In between: alpha = 0.5 everywhere gives 1, 1.5, 1.75, 1.94, 2.0 tokens a round, i.e.
    # 100, 80, 86, 93, 130 cost-weighted rounds for 100 tokens (plus the spread) -> K = 1.
    half = jnp.full((1, 1, 8), 0.5)
    np.testing.assert_allclose(expected_tokens(half, ks, groups)[0], [1, 1.5, 1.75, 1.9375, 1.99609375])
    assert int(pick(jnp.full((1, 3, 8), 0.5), live, costs, ks, groups)) == 1
    # Finished rows do not count: one live row that never agrees decides.
    alpha = jnp.concatenate([jnp.ones((1, 2, 8)), jnp.zeros((1, 1, 8))], axis=1)
    assert int(pick(alpha, jnp.asarray([0.0, 0.0, 100.0]), costs, ks, groups)) == 0
    # A static batch takes as long as its slowest row. At alpha = 0.9 a row needs 16.3
    # rounds of K = 8 or 24.4 of K = 4 for 100 tokens: K = 8 for one row (2.5 x 16.3 <
    # 1.8 x 24.4), but its rounds spread more (variance 9.1 against 2.0 tokens^2), and the
    # slowest of 64 rows needs about 22.1 against 29.3 rounds: K = 4. Throughput ignores it.
    costs = jnp.asarray([1.0, 1.2, 1.5, 1.8, 2.5])
    mean, var = token_moments(jnp.full((1, 1, 8), 0.9), ks, groups)
    for c, k in ((3, 4), (4, 8)):  # against the distribution of accepted drafts, written out
        pmf = np.asarray([0.9**n * 0.1 for n in range(k)] + [0.9**k])
        n = np.arange(k + 1)
        np.testing.assert_allclose(mean[0, c], 1 + pmf @ n, rtol=1e-5)
        np.testing.assert_allclose(var[0, c], pmf @ n**2 - (pmf @ n) ** 2, rtol=1e-4)
    assert int(pick(jnp.full((1, 1, 8), 0.9), jnp.full((1,), 100.0), costs, ks, groups)) == 4
    assert int(pick(jnp.full((1, 64, 8), 0.9), jnp.full((64,), 100.0), costs, ks, groups)) == 3
    assert int(pick(jnp.full((1, 64, 8), 0.9), jnp.full((64,), 100.0), costs, ks, groups, "throughput")) == 4
    # Trees read their own estimate (group) over their depth: a plain step, a deep narrow
    # tree (group 1, depth 4) whose estimate is poor, a shallow wide one (group 2, depth 2) that is good.
    alpha = jnp.stack([jnp.zeros((3, 4)), jnp.full((3, 4), 0.2), jnp.full((3, 4), 0.9)])
    assert int(pick(alpha, live, jnp.asarray([1.0, 1.5, 1.5]), (0, 4, 2), (0, 1, 2))) == 2


def test_policy_starts_from_an_optimistic_prior_and_probes_a_switched_off_draft_within_its_budget():
    pick = jax.jit(policy, static_argnums=1)  # one program per config, not op-by-op dispatch
    config = specjax.AdaptiveConfig(ks=(0, 1, 4), probe_budget=0.05).resolved(4)
    ad = init_adaptive(config.cost_vector({0: 1.0, 1: 1.4, 4: 2.0}), batch=2, width=4, max_rounds=8)
    live = jnp.full((2,), 100.0)  # tokens each row still needs
    # Round 0 reads the prior one sd up (0.5 + 0.35 at every position): K = 4.
    assert int(pick(ad, config, live)) == 2
    # From the prior's mean, 1, 1.5 and 1.94 tokens for 1, 1.4 and 2 -> K = 1.
    from_mean = dataclasses.replace(config, first_optimism=0.0)
    assert int(pick(ad, from_mean, live)) == 1
    # Where even the optimistic estimate says plain, the first round still probes: no plain
    # step came before it. Later, a plain step follows such an estimate.
    pricey = ad.replace(costs=config.cost_vector({0: 1.0, 1: 2.0, 4: 3.0}))
    cautious = dataclasses.replace(from_mean, optimism=0.0)
    assert int(pick(pricey, cautious, live)) == 1
    assert int(pick(pricey.replace(plain_run=jnp.int32(0)), cautious, live)) == 0
    # ... unless the switch-off's optimism (2 sd) says the draft may still pay.
    assert int(pick(pricey.replace(plain_run=jnp.int32(0)), from_mean, live)) == 1
    assert int(pick(pricey, dataclasses.replace(cautious, start_at_max=True), live)) == 2
    never = ad.replace(round=jnp.int32(5), tries=jnp.full((1, 2, 4), 50.0), plain_run=jnp.int32(0))  # no hits
    assert int(pick(never, config, live)) == 0
    # (1.4 - 1 + 1) / (0.05 * 1) = 28 plain steps between probes (a probe's switches cost
    # one plain step), and the probe is the cheapest K > 0.
    assert int(pick(never.replace(plain_run=jnp.int32(27)), config, live)) == 0
    assert int(pick(never.replace(plain_run=jnp.int32(28)), config, live)) == 1
    always = ad.replace(round=jnp.int32(5), tries=jnp.full((1, 2, 4), 50.0), hits=jnp.full((1, 2, 4), 50.0))
    assert int(pick(always, config, live)) == 2
    assert isinstance(ad, AdaptiveState)


def test_rounds_forget_positions_they_stopped_reaching():
    """After many rounds of K = 8 that reject position 5, a run of K = 2 rounds that always
    agree fades positions 3..8 towards position 2's estimate: the policy climbs back to
    K = 8 by itself. Plain steps forget nothing."""
    pick = jax.jit(policy, static_argnums=1)  # one program per config, not op-by-op dispatch
    config = specjax.AdaptiveConfig(ks=(0, 2, 8)).resolved(8)
    costs = config.cost_vector({0: 1.0, 2: 1.5, 8: 3.0})
    ad = init_adaptive(costs, batch=1, width=8, max_rounds=64)
    ad = ad.replace(
        hits=jnp.asarray([[[10.0, 10.0, 10.0, 10.0, 0.0, 0.0, 0.0, 0.0]]]),
        tries=jnp.asarray([[[10.0, 10.0, 10.0, 10.0, 10.0, 0.0, 0.0, 0.0]]]),
    )
    live = jnp.ones((1,), bool)
    assert int(pick(ad, config, live)) == 1  # position 5 never agrees: K = 2 beats K = 8

    class Step:  # what _learn reads of a loop state
        def __init__(self, ad, accepted):
            self.adaptive, self.accepted_at = ad, jnp.asarray([[accepted]])
            self.done, self.plan = jnp.zeros((1,), bool), type("Plan", (), {"adaptive": config})

        def replace(self, adaptive):
            return Step(adaptive, int(self.accepted_at[0, 0]))

    state = Step(ad, 0)
    for _ in range(3):  # plain steps: nothing changes
        state = _learn(0, state, Step(state.adaptive, int(state.accepted_at[0, 0])))
    np.testing.assert_array_equal(state.adaptive.tries, ad.tries)
    rounds = 0
    while int(pick(state.adaptive, config, live)) == 1:
        state = _learn(1, state, Step(state.adaptive, int(state.accepted_at[0, 0]) + 2))
        rounds += 1
        assert rounds < 40
    assert int(pick(state.adaptive, config, live)) == 2
    assert rounds >= 5  # ten rounds of evidence against position 5 take a while to fade


TREES = specjax.AdaptiveConfig(
    trees=(specjax.Tree.chain(2), specjax.Tree.full(2, 2)),
    costs={0: 1.0, "tree0": 1.2, "tree1": 1.3},
    start_at_max=True,
)


@pytest.mark.parametrize("name", ["draft_model", "eagle"])
def test_adaptive_trees_greedy_equals_plain_greedy(target, noisy_draft, small_draft, plain, name):
    drafter = _drafters(noisy_draft, small_draft, target)[name]
    out = specjax.generate(
        target,
        PROMPTS,
        specjax.GenerationConfig(max_new_tokens=NEW),
        draft=drafter,
        speculative=specjax.SpeculativeConfig(adaptive=TREES),
    )
    assert out.tokens == plain.tokens
    chosen = out.stats.adaptive["rounds_per_k"]
    assert set(chosen) == {0, "tree0", "tree1"} and chosen["tree1"] >= 1  # the first round: the last tree
    assert len(out.stats.accepted_per_position) == 2  # by depth, up to the deepest tree


def test_draft_cache_catches_up_after_any_number_of_plain_steps(small_draft):
    """resync: a draft cache that saw only the prompt equals, below the committed length
    minus the catch-up width, the cache of a prefill of everything committed since."""
    config, params = small_draft.config, small_draft.params
    rows = np.asarray(jax.random.randint(jax.random.key(0), (2, 40), 0, config.vocab_size), np.int32)
    prompt_lengths = jnp.asarray([5, 9], jnp.int32)
    lengths = jnp.asarray([37, 21], jnp.int32)
    cache_length = 48
    cache = prefill(config, params, jnp.asarray(rows[:, :9]), prompt_lengths, cache_length)
    ctx = DraftContext(
        tokens=token_buffer(jnp.asarray(rows), cache_length),
        lengths=lengths,
        prompt_lengths=prompt_lengths,
        done=jnp.zeros((2,), bool),
        target_params=None,
        target=config,
        num_speculative_tokens=2,
        sampling=SamplingConfig(),
    )
    width = 2
    synced = resync(config, params, cache, ctx, width)
    reference = prefill(config, params, jnp.asarray(rows[:, :37]), lengths, cache_length)
    assert np.all(np.asarray(synced.lengths) >= np.asarray(lengths) - width)
    for row in range(2):
        valid = int(lengths[row]) - width
        np.testing.assert_allclose(synced.k[:, row, :valid], reference.k[:, row, :valid], atol=1e-5)
        np.testing.assert_allclose(synced.v[:, row, :valid], reference.v[:, row, :valid], atol=1e-5)


@pytest.fixture(scope="module")
def pair8():
    target = scaled_model(VOCAB8.replace(num_hidden_layers=3), seed=0, scale=6.0)
    draft = scaled_model(VOCAB8.replace(num_hidden_layers=1), seed=5, scale=6.0)
    return target, draft


SAMPLES = 3000  # the wrong variants fail by p < 1e-40 at this size (1e-8 needed)
SAMPLE_CONFIG = specjax.GenerationConfig.at_temperature(1.0, max_new_tokens=3)


@pytest.fixture(scope="module")
def plain_samples(pair8):
    """Plain sampling's rows, drawn once for both rules."""
    return specjax.generate(pair8[0], [SAMPLE_PROMPT] * SAMPLES, SAMPLE_CONFIG.replace(seed=11))


@pytest.mark.parametrize("rule_name", ["exact", "always_accept"])
def test_sampling_with_k_switching_between_rounds_follows_the_target(pair8, plain_samples, rule_name):
    """T = 1, rounds of K = 2, 0, 1, ... (SWITCHING): the joint of the first three tokens
    matches plain sampling; the same policy with a rule that accepts every draft fails."""
    target, draft = pair8
    config, plain = SAMPLE_CONFIG, plain_samples
    rule = None if rule_name == "exact" else always_accept_rule
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=2, rule=rule, adaptive=SWITCHING)
    out = specjax.generate(
        target, [SAMPLE_PROMPT] * SAMPLES, config.replace(seed=1), draft=draft, speculative=speculative
    )

    def joint(tokens):
        tokens = np.asarray(tokens)
        return (tokens[:, 0] * 8 + tokens[:, 1]) * 8 + tokens[:, 2]

    p_value = two_sample_p_value(joint(out.tokens), joint(plain.tokens))
    if rule_name == "exact":
        assert out.stats.adaptive["chosen_k"][:3] == [2, 0, 1]
        assert p_value > 1e-3
    else:  # (every draft accepted: the first round yields all three tokens)
        assert p_value < 1e-8


def test_second_adaptive_call_compiles_nothing(target, noisy_draft, plain, compiles):  # noqa: F811
    """Also the draft model under CHEAP (K up to 4) in test_adaptive_greedy_equals_plain_greedy:
    the first call is that case, checked the same way."""
    out = specjax.generate(
        target,
        PROMPTS,
        specjax.GenerationConfig(max_new_tokens=NEW),
        draft=noisy_draft,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=4, adaptive=CHEAP),
    )
    _check_greedy_and_counters(out, plain)
    first = len(_generation_compiles(compiles))
    assert first >= 1
    other_costs = specjax.AdaptiveConfig(costs={0: 1.0, 1: 3.0, 2: 3.5, 4: 4.0})
    out = specjax.generate(
        target,
        PROMPTS,
        specjax.GenerationConfig(max_new_tokens=NEW),
        draft=noisy_draft,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=4, adaptive=other_costs),
    )
    assert len(_generation_compiles(compiles)) == first  # costs are arrays, not part of the program
    assert out.stats.adaptive["costs_seconds"] == [1.0, 3.0, 3.5, 4.0]
    # How costs are got is no part of the program either; given costs are never measured or cached.
    quiet = dataclasses.replace(other_costs, progress=False, remeasure=True)
    out = specjax.generate(
        target,
        PROMPTS,
        specjax.GenerationConfig(max_new_tokens=NEW),
        draft=noisy_draft,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=4, adaptive=quiet),
    )
    assert len(_generation_compiles(compiles)) == first
    assert out.stats.adaptive["costs"] == dict(
        source="given", seconds=0.0, path=None, measured_at=None, measurement_seconds=None,
        per_k_ms={0: 1000.0, 1: 3000.0, 2: 3500.0, 4: 4000.0},
    )  # fmt: skip
    assert not (Path(os.environ["SPECJAX_CACHE_DIR"]) / "round_costs").exists()


# After test_second_adaptive_call_compiles_nothing, which clears jax's caches first: the same
# batch, cache bucket (64 slots), K and ks, so both runs here reuse its program.
def test_policy_picks_plain_for_a_random_draft_and_k_max_for_a_perfect_one(target):
    # The relative round costs the embedded pair measured on this CPU.
    costs = specjax.AdaptiveConfig(costs={0: 1.0, 1: 1.72, 2: 1.99, 4: 2.07})
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=4, adaptive=costs)
    # A random draft: mostly plain steps (K = 0); the target itself: mostly K_MAX.
    for draft, k in ((scaled_model(TARGET_CONFIG, seed=9), 0), (target, 4)):
        out = specjax.generate(
            target, PROMPTS, specjax.GenerationConfig(max_new_tokens=40), draft=draft, speculative=speculative
        )
        ks = out.stats.adaptive["rounds_per_k"]
        assert ks[k] >= 0.8 * sum(ks.values()), ks
    assert out.stats.accepted_per_position == [1.0] * 4  # the perfect draft's run


def test_adaptive_errors(target, noisy_draft):
    with pytest.raises(ValueError, match="exceed num_speculative_tokens=2"):
        specjax.generate(
            target,
            PROMPTS,
            specjax.GenerationConfig(),
            draft=noisy_draft,
            speculative=specjax.SpeculativeConfig(num_speculative_tokens=2, adaptive=specjax.AdaptiveConfig(ks=(0, 4))),
        )
    with pytest.raises(ValueError, match=r"lack K=\[1, 2, 4\]"):
        specjax.generate(
            target,
            PROMPTS,
            specjax.GenerationConfig(),
            draft=noisy_draft,
            speculative=specjax.SpeculativeConfig(
                num_speculative_tokens=4, adaptive=specjax.AdaptiveConfig(costs={0: 1.0})
            ),
        )
    with pytest.raises(ValueError, match="decay must lie in"):
        specjax.AdaptiveConfig(decay=1.0)
    with pytest.raises(ValueError, match="objective must be 'makespan' or 'throughput'"):
        specjax.AdaptiveConfig(objective="goodput")
    with pytest.raises(ValueError, match="optimism, explore and first_optimism must be >= 0"):
        specjax.AdaptiveConfig(explore=-1.0)
    with pytest.raises(ValueError, match="pass no tree"):
        specjax.generate(
            target,
            PROMPTS,
            specjax.GenerationConfig(),
            draft=noisy_draft,
            speculative=specjax.SpeculativeConfig(tree=specjax.Tree.chain(2), adaptive=CHEAP),
        )


def test_every_bench_config_loads_and_adaptive_twins():
    """Every shipped bench config parses (E11's and SmolLM2's included), and `adaptive: true` adds one adaptive
    twin per (batch, temperature, drafter) with K_MAX = the largest K among its specs."""
    from pathlib import Path

    from specjax.bench.bench_config import BenchConfig
    from specjax.bench.measure import RunSpec, adaptive_specs_for
    from specjax.configs import load_config

    root = Path(__file__).parents[1] / "configs"
    configs = sorted([*root.glob("e[0-9]*_*.yaml"), *root.glob("smollm2_e[0-9]*.yaml")])
    assert any(p.name == "e11_adaptive.yaml" for p in configs)
    assert any(p.name == "smollm2_e8_final.yaml" for p in configs)
    for path in configs:
        load_config(BenchConfig, path)
    e11 = load_config(BenchConfig, Path(__file__).parents[1] / "configs" / "e11_adaptive.yaml")
    assert e11.adaptive_sweep.k_max == 8 and e11.max_k == 8
    specs = [
        RunSpec("speculative", 1, 2),
        RunSpec("speculative", 1, 4),
        RunSpec("plain", 1),
        RunSpec("speculative", 4, 3, 1.0, "x"),
    ]
    twins = adaptive_specs_for(specs)
    assert twins == [RunSpec("speculative", 1, 4, adaptive=True), RunSpec("speculative", 4, 3, 1.0, "x", adaptive=True)]
    with pytest.raises(ValueError, match="static_ks"):
        load_config(
            BenchConfig, Path(__file__).parents[1] / "configs" / "e11_adaptive.yaml", ["adaptive_sweep.static_ks=[9]"]
        )
