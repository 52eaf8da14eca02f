"""Confidence-scheduled verification: draft K_MAX every round, verify only the drafts that pay.

Each round the drafter proposes K = K_MAX drafts (the plan's K); then one of a few static
verify widths w (`VerifySchedule.widths`, each compiled as its own while loop)
verifies the first w - 1 of them with the plan's acceptance rule and commits through the
chain round's own code (rounds.py `verify_proposal`). Adaptive speculation (adaptive.py)
chooses K *before* drafting from past rounds; this schedule drafts once and then chooses how
much of the proposal to verify, from what the drafter says about it.

The width maximises expected committed tokens per second over live rows,

    value(w) = sum_b (1 + sum_{i < w-1} s[b, i]) / cost(w),   s[b, i] = prod_{j <= i} c[b, j]

with c[b, i] the chance that draft i survives given drafts < i did: the drafter's own
`Proposal.confidence` when it gives one, else (sampling) its probability q_i(d_i) of the
drafted token, else the acceptance per position measured in this generation's past rounds
(pooled over rows, `prior` before any evidence). A confidence is calibrated per position
by what past rounds saw (accepted / the confidence they were given), so only its variation
across drafts and rows is read. A row without a proposal
(`Proposal.found` False: prompt lookup found no match) scores 0. cost(w) is the seconds of
one round at width w (`costs`), or without them `1 + width_cost * (w - 1)` units.

Exactness. Greedy output is the target's argmax whatever is verified, so under greedy the
width reads every c at once. Under sampling it must not: a draft verified *because of its
own value* is biased (verifying d_i only when q_i(d_i) is high lets the tokens the draft
favours through more often). The output stays distributed as the target's when whether
draft i is verified depends only on drafts < i (a stopping time; each verified position is
then an ordinary rejection-sampling step, each unverified one a draw from p). So under
sampling the width is chosen bucket by bucket: at width w_k (verifying drafts 1..w_k - 1)
it extends to the next bucket only if the best value still ahead, computed from c of the
drafts already inside the bucket and the measured rates beyond them, beats stopping here.
`lookahead=True` reads every c at once under sampling too: exact only for a drafter whose
confidence depends on no drafted token (tests/test_verify_schedule.py shows the bias with q).
The measured rates and `found` depend on committed tokens only, so they may be read anywhere.

Segments and static chains (`VerifySchedule.chains`, on by default). The confidence pays
only when it tells rounds apart; where it does not, drafting K and verifying fewer loses
to the static chain that drafts only what it verifies. So every round runs one arm,
chosen from past rounds only (choose_arm): a static chain of K = w - 1 for a width w > 1
(rounds.py's chain round, the static program itself) or the confidence arm above. The
chain is the one that would finish the batch soonest (each row's rates measured in chain
rounds, `chain_costs`: the slowest row decides); the confidence arm runs only where, on
the widest chain's rounds, it would have committed more per second than every chain
(that chain drafts what it drafts and verifies everything, so its rounds say what each
arm would have kept: fold's counterfactual). The rounds of one call of the loop (at most
ROUNDS_PER_CALL) run as segments, one per run of equal choices. Each arm is a while loop
gated by the choice, the loops one after another (no conditional: schedule_round says
why), so a segment of chain rounds costs what the static chain's rounds cost plus the
choice, one small computation per round.

The schedule's settings are a `VerifySchedule` (core/verify_widths.py: the config layer may
read it). Drafters see an ordinary chain round that accepted num_accepted <= w - 1 of its K drafts
(rollback is a length change), so every chain drafter works unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.core.state import LoopState
from specjax.core.verify_widths import VerifySchedule, as_verify_schedule, default_widths
from specjax.drafters import Proposal
from specjax.engine.rounds import draft_context, propose, verify_proposal
from specjax.engine.schedule_policy import (
    calibrated,
    choose_arm,
    choose_width,
    draft_confidence,
    fold,
    gives_confidence,
    measured_rates,
)

__all__ = ["VerifySchedule", "as_verify_schedule", "choose_arm", "choose_width", "default_widths", "schedule_round"]


# The most rounds one call of schedule_round runs (one iteration of the generation loop, or
# one `specjax.step`): a call ends with the next round drafted and dropped (the next call
# drafts it again from the same state, the same round), so longer calls waste less drafting,
# shorter ones return to the host sooner.
ROUNDS_PER_CALL = 16


@struct.dataclass
class _Drafted:
    """A round drafted from the committed state and its width chosen, not yet verified:
    carried into the next round's run (the choice is made after drafting, so a run of
    equal choices can only test the next round's choice by drafting it)."""

    proposal: Proposal  # K drafts per row
    confidence: jax.Array | None  # [B, K] float32 raw (uncalibrated), or None
    changed: Any  # the drafter's state after proposing: its leaves, None where the state's own (_changed)
    rng: jax.Array  # the round's rng after its splits
    accept_key: jax.Array
    index: jax.Array  # [] int32: into VerifySchedule.widths


def _draft(target_params, draft_weights, state: LoopState) -> _Drafted:
    """Draft K and choose the verify width: past rounds and the proposal only, never this
    round's verdict. A pure function of `state`: drafting again from it gives the same round."""
    plan = state.plan
    config = plan.verify_schedule
    _, proposal, draft_state, rng, accept_key = propose(target_params, draft_weights, state)
    sched = state.schedule
    greedy = plan.sampling.greedy
    confidence = draft_confidence(proposal, greedy)  # [B, K] or None
    index = choose_width(
        measured_rates(sched, config),
        ~state.done,
        jnp.asarray(config.cost_vector()),
        config.widths,
        None if confidence is None else calibrated(confidence, sched, config),
        proposal.found,
        lookahead=greedy or config.lookahead,
    )
    if config.probe_every and config.widths[0] == 1:
        index = jnp.where((index == 0) & (sched.narrow_run >= config.probe_every), 1, index).astype(jnp.int32)
    return _Drafted(proposal, confidence, _changed(state.draft_state, draft_state), rng, accept_key, index)


def _changed(before, after):
    """after's leaves, None where propose passed before's leaf through unchanged (the same
    traced array): carried beside the loop state's own, such a leaf (a head's feature
    buffer) would be a second live copy of one buffer, which XLA copies every round. A
    state that changed shape is kept whole."""
    new, tree = jax.tree.flatten(after)
    if tree != jax.tree.structure(before):
        return {"whole": after}
    return tuple(None if a is b else a for a, b in zip(new, jax.tree.leaves(before), strict=True))


def _proposed_state(state: LoopState, drafted: _Drafted):
    """The drafter's state after proposing `drafted`, from the loop state it was drafted from."""
    leaves, tree = jax.tree.flatten(state.draft_state)
    changed = drafted.changed
    if isinstance(changed, dict):
        return changed["whole"]
    return jax.tree.unflatten(tree, [a if c is None else c for a, c in zip(leaves, changed, strict=True)])


def _commit(j: int, target_params, draft_weights, state: LoopState, drafted: _Drafted):
    """Verify the first widths[j] - 1 of the drafts drafted from `state` and commit: (the
    state, the schedule not yet folded; drafts accepted per row [B]; the evidence per
    verified position [B, w - 1], verify_proposal's)."""
    config = state.plan.verify_schedule
    w = config.widths[j]
    proposal = drafted.proposal
    cut = Proposal(
        tokens=proposal.tokens[:, : w - 1],
        q=None if proposal.q is None else proposal.q[:, : w - 1],
        found=proposal.found,
    )
    ctx = draft_context(state, target_params)  # what `propose` read: the state is the one drafted from
    after, expected = verify_proposal(
        target_params, draft_weights, state, ctx, cut, _proposed_state(state, drafted), drafted.rng, drafted.accept_key,
        expect=True,
    )  # fmt: skip
    return after, jnp.sum(after.accepted_at - state.accepted_at, axis=1), expected  # [B], [B, w - 1]


def _verify(j: int, target_params, draft_weights, state: LoopState, drafted: _Drafted) -> LoopState:
    """A round of the confidence arm: verify the first widths[j] - 1 of the drafts drafted
    from `state`, commit, and fold it into the schedule."""
    config = state.plan.verify_schedule
    after, num_accepted, expected = _commit(j, target_params, draft_weights, state, drafted)
    proposal = drafted.proposal
    k = state.plan.num_speculative_tokens
    sched = fold(
        state.schedule, config, j, num_accepted, ~state.done, proposal.found, drafted.confidence, k, expected=expected
    )
    return after.replace(schedule=sched)


def schedule_round(target_params, draft_weights, state: LoopState) -> LoopState:
    """One segment of scheduled rounds: at most ROUNDS_PER_CALL of them, fewer once every row
    is done (none if it is on entry). With `VerifySchedule.chains` each round runs one arm,
    chosen from past rounds only (choose_arm): a static chain of K = w - 1, or the confidence
    arm, whose every round drafts K and chooses its own verify width (_confidence_segment).
    Each arm's rounds are exact and the choice reads no round it governs, so the output is
    the target's under greedy and under sampling alike.

    The arms are not branches of a `lax.switch`: each is a while loop that runs while the
    choice is its arm, and the loops follow one another (_gated). On XLA:CPU a conditional
    copies the buffers it may write on every entry (both target caches, a head's feature
    buffer and cache: ~23 MB, 2-5 ms, per segment at batch 16 on the embedded pair); a
    while loop that runs no iteration costs one evaluation of its condition and copies
    nothing. A change to a later arm runs in the same call, one to an earlier arm in the
    next; the chosen arm's loop runs at least one round, so every call progresses."""
    config = state.plan.verify_schedule
    if len(config.widths) == 1:  # one width (verify_costs.py times exactly one such round)
        return _verify(0, target_params, draft_weights, state, _draft(target_params, draft_weights, state))
    if not config.chain_ks:
        return _confidence_segment(target_params, draft_weights, state)
    confident = _has_confidence(target_params, draft_weights, state)

    def chosen(arm: int):  # the choice, remade from past rounds before every round, is `arm`
        return lambda s: choose_arm(s.schedule, config, ~s.done, confident, _remaining(s)) == arm

    carry = (state, jnp.zeros((), jnp.int32))
    for arm, k in enumerate(config.chain_ks):
        full = confident and arm == len(config.chain_ks) - 1
        carry = _chain_segment(k, target_params, draft_weights, carry, chosen(arm), full)
    if confident:
        carry = _confidence_segment(target_params, draft_weights, carry[0], chosen(len(config.chain_ks)), carry[1])
    return carry[0]


def _remaining(state: LoopState) -> jax.Array:
    """[B] int32: the tokens each row may still write (EOS may end it sooner)."""
    return state.max_new_tokens - (state.lengths - state.prompt_lengths)


def _gated(rounds, stays=None) -> jax.Array:
    """[] bool: another round may run in this call (the budget of ROUNDS_PER_CALL, rows
    left) and the choice is still this loop's (`stays(state)`, when given)."""
    s, n = rounds
    going = ~jnp.all(s.done) & (n < ROUNDS_PER_CALL)
    return going if stays is None else going & stays(s)


def _has_confidence(target_params, draft_weights, state: LoopState) -> bool:
    """Whether the drafter's proposal carries what the confidence arm reads (trace time: the
    proposal's structure, from an abstract evaluation that adds nothing to the program)."""
    proposal = jax.eval_shape(lambda s: propose(target_params, draft_weights, s)[1], state)
    return gives_confidence(proposal, state.plan.sampling.greedy)


def _chain_segment(k: int, target_params, draft_weights, carry, stays, full: bool = False):
    """Chain rounds of K = k (rounds.py's own, the static chain's program), folded into the
    measured rates, while `stays(state)` and the call's budget lasts: carry (state, rounds
    run in this call) -> the same. The loop state keeps the schedule's plan while each round
    runs a chain's.

    full: the widest chain beside a confidence arm. Its rounds draft as the confidence arm
    does (K drafts, the width the confidence would choose computed and kept) and verify the
    widest width, so each also says what the confidence arm would have committed in it
    (fold's `counterfactual`). With widths up to K + 1, as by default, that is the static
    chain of K's round plus the choice."""
    plan = carry[0].plan
    config = plan.verify_schedule
    chain = dataclasses.replace(plan, num_speculative_tokens=k, verify_schedule=None)
    index = config.widths.index(k + 1)
    k_max = plan.num_speculative_tokens

    def body_fn(c):
        s, rounds = c
        if full:
            drafted = _draft(target_params, draft_weights, s)
            after, num_accepted, expected = _commit(index, target_params, draft_weights, s, drafted)
            # Every draft it reached is verified: an unbiased sample for the calibration too
            found, confidence, counterfactual = drafted.proposal.found, drafted.confidence, drafted.index
        else:
            # chain_round's program (propose, then verify), with the verify's evidence kept
            lone = s.replace(plan=chain)
            ctx, proposal, draft_state, rng, accept_key = propose(target_params, draft_weights, lone)
            after, expected = verify_proposal(
                target_params, draft_weights, lone, ctx, proposal, draft_state, rng, accept_key, expect=True
            )
            after = after.replace(plan=plan)
            num_accepted = jnp.sum(after.accepted_at - s.accepted_at, axis=1)  # [B]
            found, confidence, counterfactual = None, None, None
        live = ~s.done
        sched = fold(
            s.schedule, config, index, num_accepted, live, found, confidence, k_max, k, counterfactual, expected
        )
        return after.replace(schedule=sched), rounds + 1

    return jax.lax.while_loop(lambda c: _gated(c, stays), body_fn, carry)


def _confidence_segment(target_params, draft_weights, state: LoopState, stays=None, rounds=None):
    """Scheduled rounds, each: draft K, choose the verify width, verify that many drafts and
    commit; while `stays(state)` (beside chains) and the call's budget of ROUNDS_PER_CALL
    rounds lasts (`rounds`: those already run in this call). Returns the state, or with
    `stays` (state, rounds).

    A round's width is chosen after drafting it, so the round after a run of equal widths
    is drafted inside that run and carried into the next (_Drafted): no round is drafted
    twice within a segment and every round splits the keys a lone round would. Runs of one
    width are while loops that follow one another in width order, gated by the carried
    round's choice (as the arms in schedule_round, and for the same reason: a `lax.switch`
    over the widths copied the loop state per run, which made a schedule forced to one
    width up to 45% slower than that width's static chain at batch 16, results/verify_schedule).
    A segment ends with the next round drafted and dropped (the next segment drafts it
    again from the same state, the same round). What the carried round holds of the
    drafter's state is only what its propose changed (_changed): a draft model's cache,
    written by propose while the loop state still holds the one before, is still copied
    every round, the target's caches are not.
    """
    config = state.plan.verify_schedule
    counted = rounds is not None
    rounds = jnp.zeros((), jnp.int32) if rounds is None else rounds

    def more(c) -> jax.Array:
        s, _, n = c
        return _gated((s, n), stays)

    def run_of(j: int):
        def body_fn(c):
            s, drafted, n = c
            s = _verify(j, target_params, draft_weights, s, drafted)
            return s, _draft(target_params, draft_weights, s), n + 1

        return lambda c: jax.lax.while_loop(lambda c: more(c) & (c[1].index == j), body_fn, c)

    def segment(c):  # draft the first round, then the runs of equal widths until the choice or budget ends
        s, n = c
        inner = (s, _draft(target_params, draft_weights, s), n)

        def runs(c):
            for j in range(len(config.widths)):
                c = run_of(j)(c)
            return c

        s, _, n = jax.lax.while_loop(more, runs, inner)
        return s, n

    # The outer loop runs the segment at most once (it ends only when the choice or the budget
    # does); a loop, not a cond, so that nothing is copied when this arm is not chosen.
    out = jax.lax.while_loop(lambda c: _gated(c, stays), segment, (state, rounds))
    return out if counted else out[0]


def schedule_stats(stats, state: LoopState, num_rows: int | None):
    """GenerationStats with the rounds per verify width (in `drafter`, as integer counters
    `verify_width_<w>_rounds`, and `proposed_tokens`) and the draft counters of rounds that
    verified a varying number of drafts: drafted_tokens counts the drafts *verified*,
    acceptance per position divides by the rounds that verified and reached it."""
    config = state.plan.verify_schedule
    sched = jax.device_get(state.schedule)
    tried = np.asarray(sched.tried_at)[:num_rows]  # [B, K]
    accepted_at = np.asarray(jax.device_get(state.accepted_at))[:num_rows]
    verified = int(np.sum(np.asarray(sched.verified)[:num_rows]))
    out = stats.with_drafts(tried[:, 0], accepted_at, tried, verified)
    counters = {f"verify_width_{w}_rounds": int(n) for w, n in zip(config.widths, sched.rounds_per_width, strict=True)}
    arms = [f"chain_{k}" for k in config.chain_ks] + ["confidence"]
    counters.update({f"schedule_{a}_rounds": int(n) for a, n in zip(arms, sched.rounds_per_arm, strict=True)})
    counters["proposed_tokens"] = int(np.sum(np.asarray(sched.proposed)[:num_rows]))
    return dataclasses.replace(out, drafter={**out.drafter, **counters})
