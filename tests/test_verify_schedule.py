"""Confidence-scheduled verification (engine/verify_schedule.py): draft K, verify the drafts
that pay, and stay exact.

Greedy output equals plain greedy whatever is verified. Under sampling the round's output
follows the target only when whether draft i is verified depends on drafts < i alone: the
rule is tested on hand-made prefix-dependent distributions where the target's joint law of
a round is known exactly (test_block_verification.py's tables), with two deliberately wrong
variants that must fail (the width read from every draft's own probability at once, and the
token after a cut drawn from the residual), and end to end on tiny models.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import RAGGED_PROMPTS
from test_block_head import _head
from test_block_verification import ROUNDS, VOCAB, K, _draw, _tables, _target_joint
from test_sampling import P_VALUE_FAIL, P_VALUE_PASS, PROMPT, SAMPLES, _exact_joint, pair8  # noqa: F401

import specjax
from specjax.bench.distribution import chi_square_p_value
from specjax.core.acceptance import rejection_sampling_rule
from specjax.core.sampling import SamplingConfig
from specjax.drafters import DraftModel
from specjax.drafters.convert import as_drafter
from specjax.engine.verify_schedule import VerifySchedule, choose_width

WIDTHS = (1, 2, 3, 5)
COSTS = {1: 1.0, 2: 1.1, 3: 1.2, 5: 1.4}


# --- The choice responds to confidence and to measured rates ----------------------------------


def _choose(confidence, lookahead, alpha=0.5, live=None, found=None):
    confidence = None if confidence is None else jnp.asarray(confidence, jnp.float32)
    rows = 2 if confidence is None else confidence.shape[0]
    live = jnp.ones((rows,), bool) if live is None else jnp.asarray(live)
    costs = jnp.asarray([COSTS[w] for w in WIDTHS], jnp.float32)
    alpha = jnp.full((WIDTHS[-1] - 1,), alpha, jnp.float32)
    found = None if found is None else jnp.asarray(found)
    return int(choose_width(alpha, live, costs, WIDTHS, confidence, found, lookahead=lookahead))


def test_the_width_follows_confidence():
    sure, hopeless = np.full((2, 4), 0.99), np.full((2, 4), 0.01)
    assert WIDTHS[_choose(sure, lookahead=True)] == 5
    assert WIDTHS[_choose(hopeless, lookahead=True)] == 1
    # Bucket by bucket (sampling): the first draft's own confidence is read only once it is
    # verified, so a hopeless proposal stops at width 2, a sure one goes all the way.
    assert WIDTHS[_choose(sure, lookahead=False)] == 5
    assert WIDTHS[_choose(hopeless, lookahead=False)] == 2
    assert WIDTHS[_choose([[0.99, 0.01, 0.5, 0.5]], lookahead=True)] == 2  # only the first draft pays
    mixed = np.concatenate([sure[:1], hopeless[:1]])
    assert WIDTHS[_choose(mixed, lookahead=True)] == 5
    assert WIDTHS[_choose(mixed, lookahead=True, live=[False, True])] == 1  # done rows do not count
    # Rows without a proposal (prompt lookup found no match) count for one token whatever the width.
    assert WIDTHS[_choose(mixed, lookahead=True, found=[False, True])] == 1
    # Without confidence: the measured rates, the same for every row.
    assert WIDTHS[_choose(None, lookahead=True, alpha=0.97)] == 5
    assert WIDTHS[_choose(None, lookahead=True, alpha=0.02)] == 1


# --- Exactness of one round, on hand-made distributions ---------------------------------------

SCHEDULE_WIDTHS = (1, 2, 3, 4)  # K = 3
# A width-1 round is never worth it at the prior 0.5; past it, each row's own q_i(d_i) decide.
SCHEDULE_COSTS = jnp.asarray([1.0, 1.2, 1.3, 1.4], jnp.float32)


def _scheduled_run(p, q, rounds: int, seed: int, variant: str):
    """Draft K per row from q, choose each row's width as a batch of one would, verify that
    many drafts with rejection sampling, and complete the output with target draws up to K + 1
    tokens -> (codes [N], width index per row [N])."""
    rng = np.random.default_rng(seed)
    code = np.zeros(rounds, np.int64)
    drafts, p_rows, q_rows = [], [], []
    for length in range(K):
        p_rows.append(p[length][code])
        q_rows.append(q[length][code])
        drafts.append(_draw(rng, q_rows[-1]))
        code = code * VOCAB + drafts[-1]
    p_rows.append(p[K][code])
    d, pp, qq = np.stack(drafts, 1), np.stack(p_rows, 1), np.stack(q_rows, 1)  # [N, K], [N, K+1, V], [N, K, V]
    confidence = np.take_along_axis(qq, d[..., None], axis=-1)[..., 0]  # q_i(d_i): reads the draft itself

    alpha = jnp.full((K,), 0.5, jnp.float32)
    lookahead = variant == "lookahead"

    def one_row(c):
        return choose_width(alpha, jnp.ones((1,), bool), SCHEDULE_COSTS, SCHEDULE_WIDTHS, c[None], None, lookahead)

    index = np.asarray(jax.jit(jax.vmap(one_row))(jnp.asarray(confidence, jnp.float32)))
    n = np.zeros(rounds, np.int64)
    next_token = np.zeros(rounds, np.int64)
    for j, w in enumerate(SCHEDULE_WIDTHS):
        rows = np.flatnonzero(index == j)
        if not len(rows):
            continue
        if w == 1:
            next_token[rows] = _draw(rng, pp[rows, 0])
            continue
        key = jax.random.key(seed * 10 + j)
        args = (jnp.asarray(d[rows, : w - 1], jnp.int32), jnp.asarray(pp[rows, :w]), jnp.asarray(qq[rows, : w - 1]))
        rows_n, rows_next = jax.jit(rejection_sampling_rule)(key, *args)
        n[rows], next_token[rows] = np.asarray(rows_n), np.asarray(rows_next)
        if variant == "residual_bonus" and w - 1 < K:
            # Wrong: after a cut every verified draft was accepted; the next token is p's, not the
            # residual of p against the unverified draft's q.
            cut = rows[n[rows] == w - 1]
            residual = np.maximum(pp[cut, w - 1] - qq[cut, w - 1], 0.0)
            next_token[cut] = _draw(rng, residual / residual.sum(-1, keepdims=True))
    out = np.zeros(rounds, np.int64)
    for position in range(K + 1):
        token = np.where(position < n, d[:, min(position, K - 1)], next_token)
        beyond = position > n
        token[beyond] = _draw(rng, p[position][out[beyond]])
        out = out * VOCAB + token
    return out, index


@pytest.mark.parametrize("variant", ["scheduled", "lookahead", "residual_bonus"])
def test_a_scheduled_round_follows_the_target_and_the_wrong_variants_do_not(variant):
    p, q = _tables(seed=4)
    codes, index = _scheduled_run(p, q, ROUNDS, seed=5, variant=variant)
    p_value = chi_square_p_value(codes, _target_joint(p))
    if variant == "scheduled":
        assert p_value > P_VALUE_PASS
        assert len(np.unique(index)) >= 3  # the rows' widths differ: the choice is exercised
    else:
        assert p_value < P_VALUE_FAIL


# --- End to end -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ConfidentDraft(DraftModel):
    """A draft model that also reports a confidence (as a head would), sure or hopeless by
    the parity of row 0's length, so that under greedy (q one-hot) the width must move."""

    def propose(self, weights, state, ctx, key):
        proposal, state = super().propose(weights, state, ctx, key)
        sure = ctx.lengths[0] % 2 == 0
        confidence = jnp.where(sure, 0.98, 0.02) * jnp.ones(proposal.tokens.shape, jnp.float32)
        return proposal.replace(confidence=confidence), state


GREEDY_WIDTHS = (1, 3, 5)  # few branches: each compiles a verify forward


@pytest.fixture(scope="module")
def plain_greedy(target):
    config = specjax.GenerationConfig(max_new_tokens=12)
    return config, specjax.generate(target, RAGGED_PROMPTS, config).tokens


def test_greedy_equals_plain_with_a_chain_draft_and_a_block_head(target, noisy_draft, plain_greedy):
    config, expected = plain_greedy
    base = as_drafter(noisy_draft)
    confident = ConfidentDraft(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
    costs = {w: COSTS[w] for w in GREEDY_WIDTHS}
    schedule = specjax.VerifySchedule(widths=GREEDY_WIDTHS, costs=costs, chains=False)  # every round reads confidence
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=4, verify_schedule=schedule)
    for draft in (confident, _head(target)):
        out = specjax.generate(target, RAGGED_PROMPTS, config, draft=draft, speculative=speculative)
        assert out.tokens == expected, type(draft).__name__
        s = out.stats
        used = {w: s.drafter[f"verify_width_{w}_rounds"] for w in GREEDY_WIDTHS}
        assert sum(used.values()) == s.target_forwards  # one width per batched round
        assert s.drafter["proposed_tokens"] == 4 * s.rounds  # K per row-round, verified or not
        assert s.accepted_tokens <= s.drafted_tokens <= s.drafter["proposed_tokens"]  # drafted: the verified ones
        if draft is confident:
            assert used[1] > 0 and used[5] > 0, used  # the confidence moved the width

    # Segments of static chains beside the confidence arm: a chain goes first (the widest,
    # as the other is dear), then the confidence arm (on that chain's rounds it would have
    # committed more per second), so both arms run.
    schedule = dataclasses.replace(schedule, chains=True, chain_costs={2: 100.0, 4: 3.0})
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=4, verify_schedule=schedule)
    out = specjax.generate(target, RAGGED_PROMPTS, config, draft=confident, speculative=speculative)
    assert out.tokens == expected
    s = out.stats.drafter
    arms = {a: s[f"schedule_{a}_rounds"] for a in ("chain_2", "chain_4", "confidence")}
    assert arms["confidence"] > 0 and arms["chain_2"] + arms["chain_4"] > 0, arms
    assert sum(arms.values()) == sum(s[f"verify_width_{w}_rounds"] for w in GREEDY_WIDTHS) == out.stats.target_forwards

    # Chains this dear lose every choice after the first round (a chain's): the next call
    # of the loop (specjax.step) runs the confidence arm's rounds as one segment.
    schedule = dataclasses.replace(schedule, chain_costs={2: 100.0, 4: 100.0})
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=4, verify_schedule=schedule)
    state = specjax.init_state(target, RAGGED_PROMPTS, config, draft=confident, speculative=speculative)
    for _ in range(2):
        state = specjax.step(target, state, draft=confident)
    assert np.asarray(state.schedule.rounds_per_arm).tolist()[-1] > 2, state.schedule.rounds_per_arm


def test_sampling_follows_the_target_end_to_end(pair8):  # noqa: F811
    target, draft = pair8
    expected = _exact_joint(target, SamplingConfig(temperature=1.0))
    config = specjax.GenerationConfig.at_temperature(1.0, max_new_tokens=2, seed=3)
    schedule = {"widths": [1, 2, 4], "costs": {1: 1.0, 2: 1.05, 4: 1.9}}  # mostly width 2: a cut after d_1
    speculative = specjax.SpeculativeConfig.from_mapping({"num_speculative_tokens": 3, "verify_schedule": schedule})
    out = specjax.generate(target, [PROMPT] * (SAMPLES // 2), config, draft=draft, speculative=speculative)
    tokens = np.asarray(out.tokens)
    assert chi_square_p_value(tokens[:, 0] * 8 + tokens[:, 1], expected) > P_VALUE_PASS
    assert 0.0 < out.stats.acceptance_rate < 1.0
    assert out.stats.drafter["verify_width_2_rounds"] > 0  # drafts cut: the token after the cut is p's


def test_segments_of_chains_and_confidence_follow_the_target(pair8):  # noqa: F811
    """Under sampling each segment's arm is chosen from past rounds only, so a token is the
    target's whichever arm drew it: here the first round is the widest chain's (the other is
    dear) and the second the confidence arm's (on the first round it would have committed
    more per second than the chains)."""
    target, draft = pair8
    expected = _exact_joint(target, SamplingConfig(temperature=1.0))
    config = specjax.GenerationConfig.at_temperature(1.0, max_new_tokens=2, seed=11)
    schedule = {"widths": [1, 2, 4], "costs": {1: 0.5, 2: 0.55, 4: 0.95}, "chain_costs": {1: 100.0, 3: 1.2}}
    speculative = specjax.SpeculativeConfig.from_mapping({"num_speculative_tokens": 3, "verify_schedule": schedule})
    out = specjax.generate(target, [PROMPT] * (SAMPLES // 2), config, draft=draft, speculative=speculative)
    tokens = np.asarray(out.tokens)
    assert chi_square_p_value(tokens[:, 0] * 8 + tokens[:, 1], expected) > P_VALUE_PASS
    s = out.stats.drafter
    assert s["schedule_confidence_rounds"] > 0 and s["schedule_chain_1_rounds"] + s["schedule_chain_3_rounds"] > 0, s


def test_the_arm_is_the_best_chain_unless_the_confidence_measured_better():
    """choose_arm from history: the chain that finishes the batch soonest (the slowest row
    decides, not the mean); the confidence arm only when, on the widest chain's rounds, it
    would have committed more per second than every chain by the margin, with the widest
    chain run first where the confidence could at best win, and again to renew the
    comparison."""
    from specjax.engine.schedule_policy import REFRESH_ROUNDS, choose_arm, init_schedule

    config = VerifySchedule(widths=(1, 2, 3, 5), chain_costs={1: 1.0, 2: 1.2, 4: 1.6}).resolved(4)  # widths 1.0-1.4
    live = jnp.ones((2,), bool)
    sched = init_schedule(2, 4, config)
    assert int(choose_arm(sched, config, live, confident=True)) == 2  # no chain round yet: the widest measures all
    # Rates 0.9: K = 4 expects 4.10 tokens / 1.6 = 2.56 per row, beating K = 2 (2.71 / 1.2 = 2.26)
    sure = sched.replace(chain_hits=jnp.full((4,), 90.0), chain_tries=jnp.full((4,), 100.0))
    assert int(choose_arm(sure, config, live, confident=False)) == 2
    # Rates 0.2: K = 1 (1.2 / 1.0) beats K = 2 (1.24 / 1.2) and K = 4
    unsure = sched.replace(chain_hits=jnp.full((4,), 20.0), chain_tries=jnp.full((4,), 100.0))
    assert int(choose_arm(unsure, config, live, confident=False)) == 0
    # Unjudged: the widest chain runs where the confidence could at best beat every chain
    # (4.10 / 1.0 = 4.1 against 2.56 by more than the margin), not where it could not (1.25 / 1.0)
    assert int(choose_arm(sure, config, live, confident=True)) == 2
    assert int(choose_arm(unsure, config, live, confident=True)) == 0

    def judged(*rates, since=0):  # tokens per second of [K = 1, 2, 4, confidence] on the same rounds
        return unsure.replace(
            same_tokens=jnp.asarray(rates, jnp.float32), same_seconds=jnp.ones((4,)), since_full=jnp.asarray(since)
        )

    assert int(choose_arm(judged(1.2, 1.1, 1.0, 1.5), config, live, confident=True)) == 3  # 1.5 > 1.2 * 1.1
    assert int(choose_arm(judged(1.2, 1.1, 1.0, 1.3), config, live, confident=True)) == 0  # not by the margin
    assert int(choose_arm(judged(1.2, 1.4, 1.0, 1.5), config, live, confident=True)) == 0  # K = 2 was better there
    m1 = dataclasses.replace(config, confidence_margin=1.0)
    assert int(choose_arm(judged(1.2, 1.1, 1.0, 1.3), m1, live, confident=True)) == 3
    renew = judged(1.2, 1.1, 1.0, 1.5, since=REFRESH_ROUNDS)
    assert int(choose_arm(renew, config, live, confident=True)) == 2  # the widest chain renews the comparison
    assert int(choose_arm(renew, config, live, confident=False)) == 0

    # The rates a chain expects come from chain rounds, not from the confidence arm's
    pooled = unsure.replace(hits=jnp.full((4,), 100.0), tries=jnp.full((4,), 100.0))
    assert int(choose_arm(pooled, config, live, confident=False)) == 0
    # Rows that differ: row 0 keeps 0.95 per position, row 1 0.3. The pooled mean (0.625)
    # would pick K = 2 (2.015 / 1.2 = 1.68 against K = 1's 1.625), but the batch finishes
    # with row 1, for which K = 1 is best (1.3 against 1.16); with row 1 done, or far
    # ahead, row 0 decides, and K = 4 is its best (4.52 / 1.6 = 2.83).
    rows = sched.replace(
        chain_hits=jnp.full((4,), 125.0),
        chain_tries=jnp.full((4,), 200.0),
        row_hits=jnp.asarray([[95.0] * 4, [30.0] * 4]),
        row_tries=jnp.full((2, 4), 100.0),
    )
    assert int(choose_arm(rows, config, live, confident=False, remaining=None)) == 0
    assert int(choose_arm(rows, config, jnp.asarray([True, False]), confident=False)) == 2
    assert int(choose_arm(rows, config, live, confident=False, remaining=jnp.asarray([60, 10]))) == 2
    assert int(choose_arm(rows, config, live, confident=False, remaining=jnp.asarray([10, 60]))) == 0


def test_the_widest_chain_says_what_every_arm_would_have_committed():
    """fold's counterfactual: a round of the widest chain (K = 4) that accepted 3 and 0
    drafts in its two rows, where the confidence would have verified 1 draft (width 2)."""
    from specjax.engine.schedule_policy import fold, init_schedule

    config = VerifySchedule(widths=(1, 2, 3, 5), chain_costs={1: 1.0, 2: 1.2, 4: 1.6}).resolved(4)
    sched = init_schedule(2, 4, config).replace(since_full=jnp.asarray(5))
    after = fold(sched, config, 3, jnp.asarray([3, 0]), jnp.ones((2,), bool), None, None, 4, 4, jnp.asarray(1))
    # kept: K = 1 -> 1 + 0, K = 2 -> 2 + 0, K = 4 -> 3 + 0, confidence (1 draft) -> 1 + 0; plus a token per row
    np.testing.assert_allclose(after.same_tokens, [3.0, 4.0, 5.0, 3.0])
    costs = [*config.chain_cost_vector(), config.cost_vector()[1]]
    np.testing.assert_allclose(after.same_seconds, 2 * np.asarray(costs), rtol=1e-6)
    assert int(after.since_full) == 0 and int(after.rounds_per_arm[2]) == 1
    other = fold(
        after, config, 1, jnp.asarray([1, 0]), jnp.ones((2,), bool), None, None, 4, 1
    )  # K = 1: no counterfactual
    np.testing.assert_allclose(other.same_tokens, after.same_tokens)
    assert int(other.since_full) == 1


def test_runs_of_rounds_are_the_rounds_one_switch_each_would_be(pair8, monkeypatch):  # noqa: F811
    """schedule_round runs rounds that choose the same width in one while loop, carrying the
    next round's proposal across runs and drafting it again after a call's last round: every
    round must still be the one a round of its own (draft, choose, one switch) makes, keys
    included. Sampled (T = 1), widths changing, calls cut every 2 rounds."""
    from specjax.engine import verify_schedule as vs

    target, draft = pair8
    monkeypatch.setattr(vs, "ROUNDS_PER_CALL", 2)  # read when traced: this plan's costs are unique
    config = specjax.GenerationConfig.at_temperature(1.0, max_new_tokens=10, seed=7)
    schedule = {"widths": [1, 2, 4], "costs": {1: 1.0, 2: 1.13, 4: 1.31}, "chains": False}
    speculative = specjax.SpeculativeConfig.from_mapping({"num_speculative_tokens": 3, "verify_schedule": schedule})
    prompts = [PROMPT, [4, 5], [6, 1, 2, 3]]
    weights = as_drafter(draft).weights()

    @jax.jit
    def one_round(state):
        drafted = vs._draft(target.params, weights, state)
        branches = [lambda s, d, j=j: vs._verify(j, target.params, weights, s, d) for j in range(3)]
        return jax.lax.switch(drafted.index, branches, state, drafted)

    def drive(step):
        state = specjax.init_state(target, prompts, config, draft=draft, speculative=speculative)
        while not bool(jnp.all(state.done)):
            state = step(state)
        return specjax.state_output(state)

    runs = drive(lambda s: specjax.step(target, s, draft=draft))
    rounds = drive(one_round)
    assert runs.tokens == rounds.tokens
    used = [runs.stats.drafter[f"verify_width_{w}_rounds"] for w in (1, 2, 4)]
    assert used == [rounds.stats.drafter[f"verify_width_{w}_rounds"] for w in (1, 2, 4)]
    assert sum(u > 0 for u in used) >= 2, used  # the width changed: runs ended and began


def test_the_schedule_program_has_no_conditional(pair8):  # noqa: F811
    """The arms and the runs of one width are while loops gated by the choice, not branches
    of a conditional: on XLA:CPU a conditional copies every buffer it may write (both target
    caches, a head's feature buffer) each time it runs, which cost the schedule 2-5 ms per
    segment at batch 16 (results/verify_schedule section 6). Lowered only, not compiled."""
    from specjax.engine.generation import run_rounds

    target, draft = pair8
    weights = as_drafter(draft).weights()
    costs = {"costs": {1: 1.0, 2: 1.1, 4: 1.3}, "chain_costs": {1: 1.0, 3: 1.2}}
    for chains in (True, False):
        schedule = {"widths": [1, 2, 4], "chains": chains, **costs}
        speculative = specjax.SpeculativeConfig.from_mapping({"num_speculative_tokens": 3, "verify_schedule": schedule})
        config = specjax.GenerationConfig.at_temperature(1.0, max_new_tokens=8)  # q: the confidence arm runs too
        state = specjax.init_state(target, [PROMPT, [4, 5]], config, draft=draft, speculative=speculative)
        text = jax.jit(run_rounds).lower(target.params, weights, state, jnp.int32(4)).as_text()
        assert "stablehlo.while" in text
        assert "stablehlo.case" not in text and "stablehlo.if" not in text, f"chains={chains}: a conditional"


# --- Configuration --------------------------------------------------------------------------


def test_configs_parse_and_bad_ones_are_refused():
    spec = specjax.SpeculativeConfig.parse(
        {"method": "ngram", "verify_schedule": {"widths": [5, 1, 3], "costs": {"1": 1.0, "3": 1.2, "5": 1.5}}}
    )
    assert spec.verify_schedule == VerifySchedule(widths=(1, 3, 5), costs=((1, 1.0), (3, 1.2), (5, 1.5)))
    assert hash(spec.verify_schedule) == hash(VerifySchedule(widths=[1, 3, 5], costs={1: 1.0, 3: 1.2, 5: 1.5}))
    assert specjax.SpeculativeConfig(verify_schedule=True).verify_schedule == VerifySchedule()
    assert specjax.SpeculativeConfig(verify_schedule=False).verify_schedule is None
    assert VerifySchedule().resolved(4).widths == (1, 2, 3, 5)
    assert VerifySchedule().resolved(8).widths == (1, 2, 3, 5, 9)

    def refused(match, **fields):
        with pytest.raises(ValueError, match=match):
            specjax.SpeculativeConfig(**fields)

    refused("not a token tree", verify_schedule=True, tree="chain:3")
    refused("pass one of them", verify_schedule=True, adaptive=True)
    refused("distinct integers", verify_schedule={"widths": [0, 2]})
    refused("distinct integers", verify_schedule={"widths": [2, 2]})
    refused("positive seconds", verify_schedule={"costs": {1: 0.0}})
    refused("unknown keys", verify_schedule={"width": [1, 2]})
    refused("must be True, False", verify_schedule="yes")
    refused("chains is true or false", verify_schedule={"chains": "yes"})
    refused("chain_costs must map Ks to seconds", verify_schedule={"chain_costs": {"two": 1.0}})
    with pytest.raises(ValueError, match=r"chain_costs lack K = \[4\]"):
        VerifySchedule(widths=(1, 2, 5), chain_costs={1: 1.0}).resolved(4)
    assert VerifySchedule(widths=(1, 2, 5)).resolved(4).chain_ks == (1, 4)
    assert VerifySchedule(widths=(1, 2, 5), chains=False).resolved(4).chain_ks == ()
    with pytest.raises(ValueError, match="exceed num_speculative_tokens"):
        VerifySchedule(widths=(1, 6)).resolved(4)
    with pytest.raises(ValueError, match="lack widths"):
        VerifySchedule(widths=(1, 2, 5), costs={1: 1.0, 5: 2.0}).resolved(4)
    with pytest.raises(ValueError, match="at least two widths"):
        VerifySchedule(widths=(5,)).resolved(4)


def test_measured_costs_are_timed_once_then_read_from_the_disk_cache(target, noisy_draft, plain_greedy, monkeypatch):
    """costs="measure": prepare times a round at each width (engine/verify_costs.py) for the
    call's shape, once; a later prepare of the same shape reads the round-cost disk cache
    (conftest gives every test its own) instead of timing again; greedy output stays plain's."""
    from specjax.engine import costs as engine_costs

    config, expected = plain_greedy
    calls, measured = [], []
    real = engine_costs.measure_schedule_costs
    monkeypatch.setattr(
        engine_costs,
        "measure_schedule_costs",
        lambda *a, **kw: calls.append(a) or measured.append(real(*a, **kw)) or measured[-1],
    )
    schedule = {"widths": [1, 5], "costs": "measure"}
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=4, verify_schedule=schedule)
    for _ in range(2):
        out = specjax.generate(target, RAGGED_PROMPTS, config, draft=noisy_draft, speculative=speculative)
        assert out.tokens == expected
    assert len(calls) == 1  # the second call read the file the first one wrote
    assert calls[0][6] == (4,)  # the static chain the schedule may run instead (K = 5 - 1), timed with the widths
    ((widths, chains),) = measured
    assert sorted(widths) == [1, 5] and chains[4] == widths[5]  # one program (draft 4, verify 4), timed once
    with pytest.raises(ValueError, match="mapping of widths to seconds or 'measure'"):
        VerifySchedule(costs="measured")
    with pytest.raises(ValueError, match="must be measured before the loop"):
        VerifySchedule(costs="measure").resolved(4).cost_vector()
