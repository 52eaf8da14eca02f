"""What the verify schedule learns from a round (engine/schedule_policy.fold): under sampling
with the token rule, the probability that each reached draft is accepted (its verdict's mean,
core/acceptance.acceptance_probability); under greedy, the verdict."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_sampling import P_VALUE_PASS, PROMPT, SAMPLES, _exact_joint, pair8  # noqa: F401

import specjax
from specjax.bench.distribution import chi_square_p_value
from specjax.core.acceptance import rejection_sampling_rule
from specjax.core.sampling import SamplingConfig
from specjax.drafters.convert import as_drafter
from specjax.engine.verify_schedule import VerifySchedule


@pytest.mark.parametrize("sampled", [True, False])
def test_the_evidence_is_the_verdicts_mean(sampled):
    """acceptance_probability, what the schedule counts per reached position under sampling,
    is the probability that rejection_sampling_rule accepts there: over 40,000 rounds of one
    (p, q) the rule's acceptance of draft 1 matches its mean (4 standard errors), and so does
    the rate of the rounds whose draft was d (the Bernoulli the verdict is) with q None."""
    from specjax.core.acceptance import acceptance_probability

    rng = np.random.default_rng(3)
    rows, vocab = 40_000, 6
    p = jnp.asarray(np.broadcast_to(rng.dirichlet(np.full(vocab, 0.7), size=2), (rows, 2, vocab)))  # [B, 2, V]
    q_row = rng.dirichlet(np.full(vocab, 0.7))
    drafts = jnp.asarray(rng.choice(vocab, size=(rows, 1), p=q_row), jnp.int32)  # d ~ q
    q = jnp.asarray(np.broadcast_to(q_row, (rows, 1, vocab)), jnp.float32) if sampled else None
    n, _ = rejection_sampling_rule(jax.random.key(0), drafts, p, q)
    accepted = np.asarray(n >= 1, np.float64)
    mean = np.asarray(acceptance_probability(drafts, p, q), np.float64)[:, 0]  # [B]
    if sampled:  # one value for every row: sum_x min(p, q)
        np.testing.assert_allclose(mean, np.minimum(np.asarray(p[0, 0]), q_row).sum(), rtol=1e-5)
        assert mean[0] < 1.0
    else:  # per drawn token: p(d)
        np.testing.assert_allclose(mean, np.asarray(p[0, 0])[np.asarray(drafts[:, 0])], rtol=1e-6)
    se = np.sqrt(mean.mean() * (1 - mean.mean()) / rows)
    assert abs(accepted.mean() - mean.mean()) < 4 * se
    # The verdict's own rate would be the wrong thing to compare if the mean ignored q:
    wrong = np.asarray(p[0, 0])[np.asarray(drafts[:, 0])].mean()  # p(d) averaged, q ignored
    assert not sampled or abs(accepted.mean() - wrong) > 4 * se


def test_the_schedule_counts_the_evidence_at_reached_positions():
    """fold with `expected`: a row's hits are the evidence at the positions its round
    reached (those before the first rejection and that one), not past it."""
    from specjax.engine.schedule_policy import fold, init_schedule

    config = VerifySchedule(widths=(1, 2, 3, 5), chain_costs={1: 1.0, 2: 1.2, 4: 1.6}).resolved(4)
    sched = init_schedule(2, 4, config)
    expected = jnp.asarray([[0.9, 0.5, 0.2, 0.1], [0.3, 0.8, 0.8, 0.8]])
    after = fold(sched, config, 3, jnp.asarray([1, 0]), jnp.ones((2,), bool), None, None, 4, 4, expected=expected)
    np.testing.assert_allclose(after.hits, [1.2, 0.5, 0.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(after.tries, [2.0, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(after.row_hits, [[0.9, 0.5, 0, 0], [0.3, 0, 0, 0]], rtol=1e-6)
    verdicts = fold(sched, config, 3, jnp.asarray([1, 0]), jnp.ones((2,), bool), None, None, 4, 4)
    np.testing.assert_allclose(verdicts.hits, [1.0, 0.0, 0.0, 0.0])


def test_a_sampled_round_teaches_the_acceptance_probability_a_greedy_one_the_verdict(pair8):  # noqa: F811
    """The wiring: a scheduled round at T = 1 folds, at every reached position, the
    probability that the rule accepts the draft there (strictly between 0 and 1 somewhere,
    not the verdicts); at T = 0 the verdicts themselves. One round from the start, so the
    pooled hits of position 1 are the batch's sum of what that round counted."""
    from specjax.engine import verify_schedule as vs

    target, draft = pair8
    weights = as_drafter(draft).weights()
    schedule = {"widths": [1, 2, 4], "costs": {1: 1.0, 2: 1.1, 4: 1.3}, "chains": False}
    speculative = specjax.SpeculativeConfig.from_mapping({"num_speculative_tokens": 3, "verify_schedule": schedule})
    prompts = [PROMPT, [4, 5], [6, 1, 2, 3], [7, 7]]

    @jax.jit
    def widest_round(state):
        drafted = vs._draft(target.params, weights, state)
        _, accepted, expected = vs._commit(2, target.params, weights, state, drafted)
        return accepted, expected, vs._verify(2, target.params, weights, state, drafted).schedule

    for temperature in (1.0, 0.0):
        config = specjax.GenerationConfig.at_temperature(temperature, max_new_tokens=4, seed=5)
        state = specjax.init_state(target, prompts, config, draft=draft, speculative=speculative)
        accepted, expected, sched = widest_round(state)
        accepted, expected = np.asarray(accepted), np.asarray(expected)  # [B], [B, 3]
        verdicts = (np.arange(3)[None, :] < accepted[:, None]).astype(np.float32)
        if temperature:
            assert np.all((expected >= 0) & (expected <= 1)) and np.any((expected > 0.01) & (expected < 0.99))
            assert not np.array_equal(expected, verdicts)
        else:
            np.testing.assert_array_equal(expected, verdicts)
        np.testing.assert_allclose(float(sched.hits[0]), expected[:, 0].sum(), rtol=1e-6)
        assert float(sched.tries[0]) == len(prompts)


def test_acceptance_measured_before_the_call_is_where_the_schedule_starts():
    """VerifySchedule.acceptance: `acceptance_rounds` rounds of pooled evidence before the
    first round, so the first choice follows it (without it: the widest chain, which
    measures every position), and it fades with `decay` as the call's own rounds come."""
    from specjax.engine.schedule_policy import choose_arm, fold, init_schedule

    base = VerifySchedule(widths=(1, 2, 3, 5), chain_costs={1: 1.0, 2: 1.2, 4: 1.6})
    live = jnp.ones((2,), bool)

    def first(config):
        config = config.resolved(4)
        return int(choose_arm(init_schedule(2, 4, config), config, live, confident=False))

    assert first(base) == 2  # no evidence: the widest chain first
    assert first(dataclasses.replace(base, acceptance=(0.2,))) == 0  # K = 1 (1.2 / 1.0) beats K = 4
    assert first(dataclasses.replace(base, acceptance=(0.95, 0.9))) == 2  # K = 4 (4.25 / 1.6 > 2.81 / 1.2)
    config = dataclasses.replace(base, acceptance=(0.9, 0.6, 0.3, 0.2, 0.1), acceptance_rounds=2.0).resolved(4)
    sched = init_schedule(2, 4, config)
    np.testing.assert_allclose(sched.chain_hits, [1.8, 1.2, 0.6, 0.4], rtol=1e-6)  # cut to K = 4
    np.testing.assert_allclose(sched.chain_tries, [2.0] * 4)
    assert not np.any(sched.row_tries)  # rows start from the pooled rates, with no evidence of their own
    after = fold(sched, config, 3, jnp.asarray([4, 4]), live, None, None, 4, 4)
    np.testing.assert_allclose(after.chain_tries, 2.0 * config.decay + 2.0, rtol=1e-6)
    assert VerifySchedule(acceptance=[0.5]).acceptance_vector(3).tolist() == [0.5, 0.5, 0.5]  # extended by the last


def test_configs_with_acceptance_parse_and_bad_ones_are_refused():
    spec = specjax.SpeculativeConfig.parse({"verify_schedule": {"acceptance": [0.9, 0.5], "acceptance_rounds": 2}})
    assert spec.verify_schedule.acceptance == (0.9, 0.5) and hash(spec.verify_schedule)
    for value, match in [
        ([1.2], r"probabilities in \[0, 1\]"),
        ([], r"probabilities in \[0, 1\]"),
        ("0.9", "a list of probabilities"),
        ([0.5, "high"], "a list of probabilities"),
    ]:
        with pytest.raises(ValueError, match=match):
            specjax.SpeculativeConfig(verify_schedule={"acceptance": value})
    with pytest.raises(ValueError, match="acceptance_rounds must be > 0"):
        VerifySchedule(acceptance=(0.5,), acceptance_rounds=0)


def test_a_schedule_started_from_measured_acceptance_stays_exact(pair8):  # noqa: F811
    """Evidence from before the call moves the first rounds' arms (low acceptance: a chain
    of 1 where the widest chain would run) and nothing else: greedy equals plain greedy
    whatever it says, and sampled output keeps the target's joint of the first two tokens."""
    target, draft = pair8
    greedy = specjax.GenerationConfig(max_new_tokens=8)
    plain = specjax.generate(target, [PROMPT, [4, 5], [6, 1, 2, 3]], greedy).tokens
    schedule = {"widths": [1, 2, 4], "costs": {1: 1.0, 2: 1.1, 4: 1.3}}
    arms = {}
    for acceptance in (None, [0.02], [0.98]):
        spec = {"num_speculative_tokens": 3, "verify_schedule": {**schedule, "acceptance": acceptance}}
        speculative = specjax.SpeculativeConfig.from_mapping(spec)
        out = specjax.generate(target, [PROMPT, [4, 5], [6, 1, 2, 3]], greedy, draft=draft, speculative=speculative)
        assert out.tokens == plain, acceptance
        arms[str(acceptance)] = out.stats.drafter["schedule_chain_1_rounds"]
    assert arms["[0.02]"] > arms["[0.98]"], arms

    config = specjax.GenerationConfig.at_temperature(1.0, max_new_tokens=2, seed=13)
    # (a margin that keeps the confidence arm out: the chain the evidence picks runs first)
    spec = {"num_speculative_tokens": 3, "verify_schedule": {**schedule, "acceptance": [0.02], "confidence_margin": 9}}
    speculative = specjax.SpeculativeConfig.from_mapping(spec)
    out = specjax.generate(target, [PROMPT] * (SAMPLES // 2), config, draft=draft, speculative=speculative)
    tokens = np.asarray(out.tokens)
    expected = _exact_joint(target, SamplingConfig(temperature=1.0))
    assert chi_square_p_value(tokens[:, 0] * 8 + tokens[:, 1], expected) > P_VALUE_PASS
    assert out.stats.drafter["schedule_chain_1_rounds"] > 0
