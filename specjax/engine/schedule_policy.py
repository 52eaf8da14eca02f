"""Confidence-scheduled verification's choices and what they learn from (verify_schedule.py
runs the rounds): the verify width of a round from its drafts' confidence (choose_width),
the arm of a segment from past rounds (choose_arm), and the schedule's part of the loop
state with the fold that updates it after every round. The formulas and why each choice
keeps the output exact are in verify_schedule.py's docstring.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.core.verify_widths import VerifySchedule
from specjax.drafters import Proposal

__all__ = [
    "ScheduleState",
    "calibrated",
    "choose_arm",
    "choose_width",
    "draft_confidence",
    "fold",
    "gives_confidence",
    "init_schedule",
    "measured_rates",
]


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


def gives_confidence(proposal, greedy: bool) -> bool:
    """Whether draft_confidence has anything for this proposal (its structure only, so an
    abstract proposal from jax.eval_shape will do)."""
    return proposal.confidence is not None or (proposal.q is not None and not greedy)


def draft_confidence(proposal: Proposal, greedy: bool):
    """[B, K] survival chances that may depend on the drafts, or None: the drafter's own
    confidence, else under sampling q_i(d_i) (under greedy q is one-hot and says nothing)."""
    if proposal.confidence is not None:
        return proposal.confidence.astype(jnp.float32)
    if not gives_confidence(proposal, greedy):
        return None
    return jnp.take_along_axis(proposal.q, proposal.tokens[..., None], axis=-1)[..., 0].astype(jnp.float32)


# --- What the schedule learns ----------------------------------------------------------


@struct.dataclass
class ScheduleState:
    """The schedule's part of the loop state (LoopState.schedule)."""

    # The hits here and below count, at each position a round reached, its acceptance: the
    # verdict (0/1), or under sampling the probability that the rule accepts it (fold's `expected`).
    hits: jax.Array  # [K] float32: forgotten counts of accepted draft positions, pooled over rows
    tries: jax.Array  # [K] float32: forgotten counts of verified-and-reached positions
    said: jax.Array  # [K] float32: forgotten sums of the confidence of those positions (calibration)
    said_hits: jax.Array  # [K] float32: `hits` of the rounds that had a confidence (calibration)
    chain_hits: jax.Array  # [K] float32: `hits` of the chain arms' rounds (every position reached is verified)
    chain_tries: jax.Array  # [K] float32: `tries` of the chain arms' rounds
    row_hits: jax.Array  # [B, K] float32: `chain_hits` per row
    row_tries: jax.Array  # [B, K] float32: `chain_tries` per row
    # [A] float32: forgotten sums, over the widest chain's rounds when the drafter gives a
    # confidence, of the tokens each arm (the chains, then the confidence arm) would have
    # committed in that same round (exact under greedy: that chain verified every draft), and
    # [A]: of the costs of those arms' rounds times the live rows. The confidence arm is
    # judged against the chains on the same rounds (choose_arm).
    same_tokens: jax.Array
    same_seconds: jax.Array
    since_full: jax.Array  # [] int32: rounds since the widest chain's last round
    rounds_per_width: jax.Array  # [n] int32
    rounds_per_arm: jax.Array  # [A] int32: the chains of VerifySchedule.chain_ks, then the confidence arm
    tried_at: jax.Array  # [B, K] int32: rounds that verified draft position i and reached it
    verified: jax.Array  # [B] int32: drafts verified per row
    proposed: jax.Array  # [B] int32: drafts proposed per row (K per round)
    narrow_run: jax.Array  # [] int32: rounds in a row at width 1


def init_schedule(batch: int, k: int, config: VerifySchedule) -> ScheduleState:
    """The state before the first round: no evidence, or `config.acceptance` as
    `acceptance_rounds` rounds that reached every position (pooled; each row's own rates
    start from the pooled ones, choose_arm)."""
    rates = config.acceptance_vector(k)
    if rates is None:
        hits = tries = jnp.zeros((k,), jnp.float32)
    else:
        tries = jnp.full((k,), config.acceptance_rounds, jnp.float32)
        hits = tries * jnp.asarray(rates)
    return ScheduleState(
        hits=hits,
        tries=tries,
        said=jnp.zeros((k,), jnp.float32),
        said_hits=jnp.zeros((k,), jnp.float32),
        chain_hits=hits,
        chain_tries=tries,
        row_hits=jnp.zeros((batch, k), jnp.float32),
        row_tries=jnp.zeros((batch, k), jnp.float32),
        same_tokens=jnp.zeros((len(config.chain_ks) + 1,), jnp.float32),
        same_seconds=jnp.zeros((len(config.chain_ks) + 1,), jnp.float32),
        since_full=jnp.zeros((), jnp.int32),
        rounds_per_width=jnp.zeros((len(config.widths),), jnp.int32),
        rounds_per_arm=jnp.zeros((len(config.chain_ks) + 1,), jnp.int32),
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
    return _rates(sched.hits, sched.tries, config.prior)


def _rates(hits, tries, prior: float) -> jax.Array:
    means, previous = [], jnp.asarray(prior, jnp.float32)
    for i in range(hits.shape[0]):  # K is small and static
        previous = (hits[i] + previous) / (tries[i] + 1.0)
        means.append(previous)
    return jnp.stack(means)


def calibrated(confidence, sched: ScheduleState, config: VerifySchedule):
    """confidence [B, K] scaled per position by accepted / said over past verified positions
    (shrunk to 1 by a weight-1 prior), clipped to [0, 1]: q_i(d_i) says how sure the draft is,
    not how often the target agrees (a well-matched pair accepts low-q drafts too), so its
    level is set by what past rounds saw and only its variation across drafts is read. The
    scale is history only: the choice stays a function of the drafts and past rounds."""
    scale = (sched.said_hits + config.prior) / (sched.said + config.prior)
    return jnp.clip(confidence * scale[None, :], 0.0, 1.0)


def fold(
    sched: ScheduleState,
    config: VerifySchedule,
    index,
    num_accepted,
    live,
    found,
    confidence,
    k: int,
    chain: int | None = None,
    counterfactual=None,
    expected=None,
) -> ScheduleState:
    """The state after a round of width widths[index] that accepted num_accepted [B] drafts in
    the live [B] rows, with the drafts' raw confidence [B, K] (or None): a round of the
    chain arm of K = `chain` (drafted `chain` per row), or with chain None a round of the
    confidence arm (drafted K). `counterfactual` ([] int32 index into widths, or None): the
    width the confidence arm would have chosen for this round, given for the widest chain's
    rounds when the drafter gives a confidence; every arm's tokens in this round are then
    added to the same-round sums choose_arm judges the confidence arm by. The measured rates
    learn only from rows that had a proposal (found [B] or None), as they are applied only to
    those. `expected` ([B, w - 1] float32, or None: the verdicts): what each position the
    round reached counts as accepted (verify_proposal's evidence: under sampling the
    probability that it passes, the verdict's mean without its draw)."""
    width = jnp.asarray(config.widths)[index]
    i = jnp.arange(k)[None, :]
    tried = (i < width - 1) & (num_accepted[:, None] >= i) & live[:, None]  # [B, K]
    if expected is None:
        hit = (i < num_accepted[:, None]) & live[:, None]
    else:
        hit = tried * jnp.pad(expected, ((0, 0), (0, k - expected.shape[1])))  # [B, K]
    evidence = 1.0 if found is None else found.astype(jnp.float32)[:, None]
    decay = jnp.where(width > 1, config.decay, 1.0)  # a width-1 round brings no evidence and forgets nothing
    hits = jnp.sum(hit * evidence, axis=0)
    sched = sched.replace(
        hits=decay * sched.hits + hits,
        tries=decay * sched.tries + jnp.sum(tried * evidence, axis=0),
        rounds_per_width=sched.rounds_per_width.at[index].add(1),
        tried_at=sched.tried_at + tried.astype(jnp.int32),
        verified=sched.verified + (width - 1) * live.astype(jnp.int32),
        proposed=sched.proposed + (k if chain is None else chain) * live.astype(jnp.int32),
        narrow_run=jnp.where(width == 1, sched.narrow_run + 1, 0).astype(jnp.int32),
        since_full=sched.since_full + 1,
    )
    if confidence is not None:
        sched = sched.replace(
            said=decay * sched.said + jnp.sum(tried * evidence * confidence, axis=0),
            said_hits=decay * sched.said_hits + hits,
        )
    if chain is None:
        return sched.replace(rounds_per_arm=sched.rounds_per_arm.at[-1].add(1))
    row_hits, row_tries = hit * evidence, tried * evidence  # [B, K]
    sched = sched.replace(
        chain_hits=config.decay * sched.chain_hits + hits,
        chain_tries=config.decay * sched.chain_tries + jnp.sum(row_tries, axis=0),
        row_hits=config.decay * sched.row_hits + row_hits,
        row_tries=config.decay * sched.row_tries + row_tries,
        rounds_per_arm=sched.rounds_per_arm.at[config.chain_ks.index(chain)].add(1),
    )
    if counterfactual is None:
        return sched
    # Every arm's drafts kept in this round: a chain of K keeps min(accepted, K) (this round
    # verified more, so its count is known), the confidence arm min(accepted, its width - 1).
    kept = jnp.asarray([*config.chain_ks, 0]).at[-1].set(jnp.asarray(config.widths)[counterfactual] - 1)  # [A]
    tokens = jnp.sum(live[:, None] * (1 + jnp.minimum(num_accepted[:, None], kept[None, :])), axis=0)  # [A]
    costs = jnp.append(jnp.asarray(config.chain_cost_vector()), jnp.asarray(config.cost_vector())[counterfactual])
    return sched.replace(
        same_tokens=config.decay * sched.same_tokens + tokens,
        same_seconds=config.decay * sched.same_seconds + costs * jnp.sum(live),
        since_full=jnp.zeros((), jnp.int32),
    )


# How many rounds of the batch's pooled evidence a row's own rates start from: a row's
# estimate is its own chain rounds' hits and tries plus this many rounds at the pooled rates.
ROW_PRIOR_ROUNDS = 2.0
# Rounds the confidence arm may run before the widest chain runs one to renew the comparison.
REFRESH_ROUNDS = 8


def choose_arm(sched: ScheduleState, config: VerifySchedule, live, confident: bool, remaining=None) -> jax.Array:
    """[] int32: the arm of the next segment, an index into chain_ks, or len(chain_ks) for the
    confidence arm (only when `confident`: the drafter gives a confidence, or samples with
    q; under greedy without one the confidence arm is a chain that drafts K and verifies
    fewer, never better than the chain it verifies). Past rounds only.

    The chain: the widest before any chain round has run (it measures every position at
    once), then the one that would finish the batch soonest if it ran every round from here.
    A batch is done when its last row is, and a round costs the same however many rows gain
    from it, so what a chain is worth is how fast it moves the rows that will finish last,
    not the batch's mean (at batch 16 with the embedded DSpark head, K = 2 keeps 27% more
    tokens per row-round than K = 1 but finishes the batch 17% later: its slowest rows gain
    little). With `remaining` [B] (tokens each row may still write; None: equal) a chain's
    finish is max over live rows of remaining_b * cost(K) / (1 + E_b[K]), E_b the drafts row b
    is expected to keep, from its acceptance per position in chain rounds (the confidence
    arm's rounds would overstate it: they verify a position when it is likely to pass),
    shrunk to the batch's pooled rates by ROW_PRIOR_ROUNDS.

    The confidence arm: judged on the widest chain's rounds, against the chains on those
    same rounds. That chain drafts what the confidence arm drafts and verifies all of it, so
    each of its rounds says what every arm would have committed there (fold's
    `counterfactual`): the confidence arm runs only if its tokens per second over those
    rounds beat every chain's over the same rounds by `confidence_margin`. Comparing arms on
    rounds of their own would compare different stretches of text (acceptance drifts within
    a generation: whichever arm ran where the text was easy would look better). With no
    such round yet, the widest chain runs first if the most the confidence arm could commit
    (every draft of K the chains' rates expect to pass, at the price of its cheapest round)
    beats every chain by the margin; and once the confidence arm has run REFRESH_ROUNDS
    rounds since the widest chain last did, the widest chain runs one round to renew the
    comparison. Where a chain is the best the confidence could ever be, no round is spent
    exploring.
    Ties go to the shorter chain, then to the chains."""
    alpha = _rates(sched.chain_hits, sched.chain_tries, config.prior)  # [K], pooled over rows
    own = (sched.row_hits + ROW_PRIOR_ROUNDS * alpha) / (sched.row_tries + ROW_PRIOR_ROUNDS)  # [B, K]
    kept = jnp.concatenate([jnp.zeros_like(own[:, :1]), jnp.cumsum(jnp.cumprod(own, axis=1), axis=1)], axis=1)
    ks = np.asarray(config.chain_ks)
    left = jnp.ones(live.shape, jnp.float32) if remaining is None else remaining.astype(jnp.float32)  # [B]

    def finish(rate):  # rate [B, n] tokens per second per row -> [n] seconds until the last live row is done
        return jnp.max(jnp.where(live[:, None], left[:, None] / rate, 0.0), axis=0)

    chain_costs = jnp.asarray(config.chain_cost_vector())  # [A - 1]
    full = len(ks) - 1  # the widest chain
    # Before any chain round, the widest: it measures every position at once, where starting
    # from the prior's choice (K = 1 at prior 0.5) took 2-4 rounds to learn that a longer
    # chain pays (results/verify_schedule section 6).
    best = jnp.where(sched.chain_tries[0] > 0, jnp.argmin(finish((1.0 + kept[:, ks]) / chain_costs)), full)
    if not confident:
        return best.astype(jnp.int32)
    expected = jnp.concatenate([jnp.zeros((1,)), jnp.cumsum(jnp.cumprod(alpha))])  # [K + 1]: drafts kept, pooled
    chains = jnp.max((1.0 + expected[ks]) / chain_costs)  # the best chain's tokens per second per row, pooled
    bound = (1.0 + expected[-1]) / jnp.min(jnp.asarray(config.cost_vector()))
    hopeful = (sched.chain_tries[0] > 0) & (bound > chains * config.confidence_margin)
    rates = sched.same_tokens / jnp.maximum(sched.same_seconds, 1e-30)  # [A]: each arm on the same rounds
    judged = sched.same_seconds[-1] > 0
    wins = judged & (rates[-1] > jnp.max(rates[:-1]) * config.confidence_margin)
    arm = jnp.where(wins, jnp.where(sched.since_full >= REFRESH_ROUNDS, full, len(ks)), best)
    return jnp.where(~judged & hopeful, full, arm).astype(jnp.int32)
