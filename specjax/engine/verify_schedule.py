"""Confidence-scheduled verification: draft K_MAX every round, verify only the drafts that pay.

Each round the drafter proposes K = K_MAX drafts (the plan's K); then one of a few static
verify widths w (`VerifySchedule.widths`, each a compiled branch of one `lax.switch`)
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

__all__ = ["VerifySchedule", "as_verify_schedule", "choose_width", "default_widths", "schedule_round"]


# --- The choice --------------------------------------------------------------------------


def choose_width(alpha, live, costs, widths, confidence=None, found=None, lookahead: bool = True) -> jax.Array:
    """[] int32: the index into `widths` of this round's verify width.

    alpha [K]: measured acceptance per position (context-only); live [B] bool; costs [n];
    confidence [B, K] or None: per-draft survival chances that may depend on the drafts;
    found [B] bool or None: rows with a proposal. lookahead: read every position's
    confidence at once (greedy, or a confidence independent of the drafts); False: bucket
    by bucket, each extension decided from the drafts already inside (the module docstring).
    Ties go to the narrower width."""
    k = alpha.shape[0]
    n = len(widths)
    live = live.astype(jnp.float32)
    base = jnp.broadcast_to(alpha[None, :], (live.shape[0], k))
    mask = 1.0 if found is None else found.astype(jnp.float32)[:, None]
    upto = jnp.asarray(widths) - 1  # drafts verified at each width

    def values(c):  # [B, K] -> [n]: expected committed tokens over live rows per second
        s = jnp.cumprod(c * mask, axis=1)
        cumulative = jnp.concatenate([jnp.zeros_like(s[:, :1]), jnp.cumsum(s, axis=1)], axis=1)  # [B, K+1]
        tokens = 1.0 + cumulative[:, upto]  # [B, n]
        return jnp.sum(tokens * live[:, None], axis=0) / costs

    if confidence is None:
        return jnp.argmax(values(base)).astype(jnp.int32)
    if lookahead:
        return jnp.argmax(values(confidence)).astype(jnp.int32)
    stops = []
    for j, w in enumerate(widths):
        known = (jnp.arange(k) < w - 1)[None, :]  # the drafts bucket j already verifies
        ahead = jnp.where(jnp.arange(n) >= j, values(jnp.where(known, confidence, base)), -jnp.inf)
        stops.append(jnp.argmax(ahead) <= j)
    return jnp.argmax(jnp.stack(stops)).astype(jnp.int32)  # the first bucket that stops (the last always does)


def draft_confidence(proposal: Proposal, greedy: bool):
    """[B, K] survival chances that may depend on the drafts, or None: the drafter's own
    confidence, else under sampling q_i(d_i) (under greedy q is one-hot and says nothing)."""
    if proposal.confidence is not None:
        return proposal.confidence.astype(jnp.float32)
    if proposal.q is None or greedy:
        return None
    return jnp.take_along_axis(proposal.q, proposal.tokens[..., None], axis=-1)[..., 0].astype(jnp.float32)


# --- The loop state and the round --------------------------------------------------------

# The most rounds one call of schedule_round runs (one iteration of the generation loop, or
# one `specjax.step`): a call ends with the next round drafted and dropped (the next call
# drafts it again from the same state, the same round), so longer calls waste less drafting,
# shorter ones return to the host sooner.
ROUNDS_PER_CALL = 16


@struct.dataclass
class ScheduleState:
    """The schedule's part of the loop state (LoopState.schedule)."""

    hits: jax.Array  # [K] float32: forgotten counts of accepted draft positions, pooled over rows
    tries: jax.Array  # [K] float32: forgotten counts of verified-and-reached positions
    said: jax.Array  # [K] float32: forgotten sums of the confidence of those positions (calibration)
    rounds_per_width: jax.Array  # [n] int32
    tried_at: jax.Array  # [B, K] int32: rounds that verified draft position i and reached it
    verified: jax.Array  # [B] int32: drafts verified per row
    proposed: jax.Array  # [B] int32: drafts proposed per row (K per round)
    narrow_run: jax.Array  # [] int32: rounds in a row at width 1


def init_schedule(batch: int, k: int, n: int) -> ScheduleState:
    return ScheduleState(
        hits=jnp.zeros((k,), jnp.float32),
        tries=jnp.zeros((k,), jnp.float32),
        said=jnp.zeros((k,), jnp.float32),
        rounds_per_width=jnp.zeros((n,), jnp.int32),
        tried_at=jnp.zeros((batch, k), jnp.int32),
        verified=jnp.zeros((batch,), jnp.int32),
        proposed=jnp.zeros((batch,), jnp.int32),
        narrow_run=jnp.zeros((), jnp.int32),
    )


def measured_rates(sched: ScheduleState, config: VerifySchedule) -> jax.Array:
    """[K]: P(draft i accepted | drafts < i were), pooled: the posterior mean under a weight-1
    prior centred on position i - 1's estimate (position 1's on `prior`), as adaptive K's
    estimate is (adaptive_policy.py). A position no round verified yet is expected to behave
    like the one before it; with a flat prior, rounds that stopped at width 2 would leave
    positions 2.. at `prior` for good, and the schedule would never widen."""
    means, previous = [], jnp.asarray(config.prior, jnp.float32)
    for i in range(sched.hits.shape[0]):  # K is small and static
        previous = (sched.hits[i] + previous) / (sched.tries[i] + 1.0)
        means.append(previous)
    return jnp.stack(means)


def calibrated(confidence, sched: ScheduleState, config: VerifySchedule):
    """confidence [B, K] scaled per position by accepted / said over past verified positions
    (shrunk to 1 by a weight-1 prior), clipped to [0, 1]: q_i(d_i) says how sure the draft is,
    not how often the target agrees (a well-matched pair accepts low-q drafts too), so its
    level is set by what past rounds saw and only its variation across drafts is read. The
    scale is history only: the choice stays a function of the drafts and past rounds."""
    scale = (sched.hits + config.prior) / (sched.said + config.prior)
    return jnp.clip(confidence * scale[None, :], 0.0, 1.0)


def _fold(
    sched: ScheduleState, config: VerifySchedule, index, num_accepted, live, found, confidence, k: int
) -> ScheduleState:
    """The state after a round of width widths[index] that accepted num_accepted [B] drafts in
    the live [B] rows, with the drafts' raw confidence [B, K] (or None). The measured rates
    learn only from rows that had a proposal (found [B] or None), as they are applied only
    to those."""
    width = jnp.asarray(config.widths)[index]
    i = jnp.arange(k)[None, :]
    tried = (i < width - 1) & (num_accepted[:, None] >= i) & live[:, None]  # [B, K]
    hit = (i < num_accepted[:, None]) & live[:, None]
    evidence = 1.0 if found is None else found.astype(jnp.float32)[:, None]
    decay = jnp.where(width > 1, config.decay, 1.0)  # a width-1 round brings no evidence and forgets nothing
    return sched.replace(
        hits=decay * sched.hits + jnp.sum(hit * evidence, axis=0),
        tries=decay * sched.tries + jnp.sum(tried * evidence, axis=0),
        said=sched.said if confidence is None else decay * sched.said + jnp.sum(tried * evidence * confidence, axis=0),
        rounds_per_width=sched.rounds_per_width.at[index].add(1),
        tried_at=sched.tried_at + tried.astype(jnp.int32),
        verified=sched.verified + (width - 1) * live.astype(jnp.int32),
        proposed=sched.proposed + k * live.astype(jnp.int32),
        narrow_run=jnp.where(width == 1, sched.narrow_run + 1, 0).astype(jnp.int32),
    )


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


def _verify(j: int, target_params, draft_weights, state: LoopState, drafted: _Drafted) -> LoopState:
    """Verify the first widths[j] - 1 of the drafts drafted from `state` and commit."""
    config = state.plan.verify_schedule
    w = config.widths[j]
    proposal = drafted.proposal
    cut = Proposal(
        tokens=proposal.tokens[:, : w - 1],
        q=None if proposal.q is None else proposal.q[:, : w - 1],
        found=proposal.found,
    )
    ctx = draft_context(state, target_params)  # what `propose` read: the state is the one drafted from
    after = verify_proposal(
        target_params, draft_weights, state, ctx, cut, _proposed_state(state, drafted), drafted.rng, drafted.accept_key
    )
    num_accepted = jnp.sum(after.accepted_at - state.accepted_at, axis=1)  # [B]
    k = state.plan.num_speculative_tokens
    sched = _fold(state.schedule, config, j, num_accepted, ~state.done, proposal.found, drafted.confidence, k)
    return after.replace(schedule=sched)


def schedule_round(target_params, draft_weights, state: LoopState) -> LoopState:
    """Scheduled rounds, each: draft K, choose the verify width, verify that many drafts and
    commit; at most ROUNDS_PER_CALL of them, fewer once every row is done (none if it is
    on entry).

    One `lax.switch` per run of rounds that choose the same width, not per round: on
    XLA:CPU a conditional in the loop body copies the loop state (the KV caches, the token
    buffer, a head's feature buffer) each time it runs, which made a schedule forced to
    one width up to 45% slower than the static chain of that width at batch 16
    (results/verify_schedule). Inside a run the rounds are an ordinary while loop, each
    choosing from its own proposal as a round of its own would: the round after a run's
    last is drafted (its choice made) inside the run and carried into the next run, so no
    round is drafted twice within a call and every round splits the keys a lone round
    would. What the carried round holds of the drafter's state is only what its propose
    changed (_changed): a draft model's cache, written by propose while the loop state
    still holds the one before, is still copied every round, the target's caches are not.
    """
    config = state.plan.verify_schedule
    first = _draft(target_params, draft_weights, state)
    if len(config.widths) == 1:  # one width (verify_costs.py times exactly one such round)
        return _verify(0, target_params, draft_weights, state, first)

    def more(carry) -> jax.Array:
        s, _, rounds = carry
        return ~jnp.all(s.done) & (rounds < ROUNDS_PER_CALL)

    def run_of(j: int):
        def cond_fn(carry):
            return more(carry) & (carry[1].index == j)

        def body_fn(carry):
            s, drafted, rounds = carry
            s = _verify(j, target_params, draft_weights, s, drafted)
            return s, _draft(target_params, draft_weights, s), rounds + 1

        return lambda carry: jax.lax.while_loop(cond_fn, body_fn, carry)

    runs = [run_of(j) for j in range(len(config.widths))]
    carry = (state, first, jnp.zeros((), jnp.int32))
    state, _, _ = jax.lax.while_loop(more, lambda c: jax.lax.switch(c[1].index, runs, c), carry)
    return state


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
    counters["proposed_tokens"] = int(np.sum(np.asarray(sched.proposed)[:num_rows]))
    return dataclasses.replace(out, drafter={**out.drafter, **counters})
