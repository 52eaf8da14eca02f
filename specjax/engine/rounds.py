"""The rounds of the loop: a plain step and a chain of K (a tree round is in tree_round.py,
confidence-scheduled verification of a chain in verify_schedule.py).

Every round is a pure function (target params, drafter weights, LoopState) -> LoopState with
static shapes, and ends in `finish_round` (state.py). Per-row variable acceptance is carried
by counts and masks, and rollback is a length change.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.core.acceptance import acceptance_probability, rejection_sampling_rule
from specjax.core.grammar import mask_logits, states_along
from specjax.core.loop import gather_tokens
from specjax.core.sampling import probabilities, select
from specjax.core.state import LoopState, finish_round
from specjax.drafters import DraftContext
from specjax.models import forward


def draft_context(state: LoopState, target_params) -> DraftContext:
    """What the drafter may read of `state`: its committed sequence, the target and the plan."""
    plan = state.plan
    return DraftContext(
        tokens=state.tokens,
        lengths=state.lengths,
        prompt_lengths=state.prompt_lengths,
        done=state.done,
        target_params=target_params,
        target=plan.target,
        num_speculative_tokens=plan.num_speculative_tokens,
        sampling=plan.sampling,
        cache=plan.cache,
        tree=plan.tree,
        grammar=state.grammar,
    )


def plain_round(target_params, draft_weights, state: LoopState) -> LoopState:
    """One target forward of width 1 at position L - 1 and one token drawn from it: plain
    decoding, and adaptive speculation's K = 0 (whose drafter sees a round that accepted
    nothing)."""
    plan = state.plan
    rng, key = jax.random.split(state.rng)
    positions = state.lengths[:, None] - 1  # [B, 1]
    wants = plan.wants_features
    tokens = gather_tokens(state.tokens, positions)
    out = forward(plan.target, target_params, tokens, positions, state.target_cache, features=wants)
    logits, target_cache = out[:2]  # [B, 1, V]
    if state.grammar is not None:  # the constrained distribution: forbidden tokens get -inf
        logits = mask_logits(logits, state.grammar.next_state, state.grammar.states[:, None])
    token = select(key, logits[:, 0], plan.sampling)  # [B]
    none = jnp.zeros_like(state.lengths)
    update = None
    if plan.drafter is not None:
        ctx = draft_context(state, target_params)

        def update(tokens, lengths, done):
            after = ctx.replace(tokens=tokens, lengths=lengths, done=done, features=out[2] if wants else None)
            return plan.drafter.update(draft_weights, state.draft_state, after, none)

    return finish_round(state, token[:, None], none, target_cache, rng, update)


def propose(target_params, draft_weights, state: LoopState):
    """The drafting half of a chain round: (ctx, proposal of K drafts, the drafter's state
    after it, the round's rng, the acceptance key). The keys are split as chain rounds
    always split them, so a chain round's output does not depend on who drafted."""
    plan = state.plan
    rng, draft_key, accept_key = jax.random.split(state.rng, 3)
    ctx = draft_context(state, target_params)
    proposal, draft_state = plan.drafter.propose(draft_weights, state.draft_state, ctx, draft_key)
    return ctx, proposal, draft_state, rng, accept_key


def verify_proposal(
    target_params, draft_weights, state: LoopState, ctx: DraftContext, proposal, draft_state, rng, accept_key,
    expect: bool = False,
):  # fmt: skip
    """The verifying half: the proposal's k = proposal.tokens.shape[1] drafts (k may be
    below the K the drafter proposed: confidence-scheduled verification, verify_schedule.py)
    at width k + 1, the acceptance rule, the commit. The drafter's update sees a chain round
    that accepted num_accepted <= k drafts; drafts past k were never judged.

    Returns the state, or with `expect` (state, evidence [B, k] float32): at each draft
    position, what a policy that learns acceptance from rounds may count as its verdict
    (read only at positions the round reached). Under sampling with the token-by-token rule,
    the probability that the rule accepts it (acceptance_probability: the verdict's mean,
    without its draw); otherwise the verdict itself, 1.0 where accepted."""
    plan = state.plan
    drafts = proposal.tokens  # [B, k]
    k = drafts.shape[1]
    lengths = state.lengths  # L: the token at L - 1 is committed but not yet verified past

    # Verify, width k + 1: [token at L-1, d_1..d_k] at positions L-1..L+k-1. Output i is
    # the target's distribution p_{i+1} for the token at position L+i.
    positions = lengths[:, None] - 1 + jnp.arange(k + 1)  # [B, k+1]
    verify_tokens = jnp.concatenate([gather_tokens(state.tokens, positions[:, :1]), drafts], axis=1)
    wants = plan.wants_features
    out = forward(plan.target, target_params, verify_tokens, positions, state.target_cache, features=wants)
    logits, target_cache = out[:2]  # features: out[2], [B, k+1, D] at positions L-1..L+k-1
    if state.grammar is not None:
        # Position i is masked at the state after d_1..d_i: a forbidden draft has p = 0 and is
        # rejected, so any drafter stays exact (q need not know the grammar); the positions
        # after it keep its last valid state and are never reached.
        grammar = state.grammar
        logits = mask_logits(logits, grammar.next_state, states_along(grammar.next_state, grammar.states, drafts))
    if k == 0:  # nothing to judge: the round is a plain step after drafting
        num_accepted = jnp.zeros_like(lengths)
        next_token = select(accept_key, logits[:, 0], plan.sampling)  # [B]
    else:
        p = probabilities(logits, plan.sampling)  # [B, k+1, V]; greedy: the one-hot on each argmax
        num_accepted, next_token = plan.rule(accept_key, drafts, p, proposal.q)  # [B], [B]
    if not expect:
        evidence = None
    elif k > 0 and not plan.sampling.greedy and plan.rule is rejection_sampling_rule:
        evidence = acceptance_probability(drafts, p, proposal.q)  # [B, k]
    else:  # greedy (the verdict is its own mean), or a rule that does not accept token by token
        evidence = (jnp.arange(k)[None, :] < num_accepted[:, None]).astype(jnp.float32)  # [B, k]: the verdicts

    # Candidates [d_1..d_n, next, ...]: the first n + 1 count (before EOS/max cuts).
    j = jnp.arange(k + 1)[None, :]
    padded = jnp.concatenate([drafts, jnp.zeros((drafts.shape[0], 1), drafts.dtype)], axis=1)  # k may be 0
    candidates = jnp.where(j == num_accepted[:, None], next_token[:, None], padded)

    def update(tokens, lengths, done):
        after = ctx.replace(tokens=tokens, lengths=lengths, done=done, features=out[2] if wants else None)
        return plan.drafter.update(draft_weights, draft_state, after, num_accepted)

    after = finish_round(state, candidates, num_accepted, target_cache, rng, update)
    return (after, evidence) if expect else after


def chain_round(target_params, draft_weights, state: LoopState) -> LoopState:
    """One chain round: K drafts, a verify of width K + 1, the acceptance rule, the commit."""
    ctx, proposal, draft_state, rng, accept_key = propose(target_params, draft_weights, state)
    return verify_proposal(target_params, draft_weights, state, ctx, proposal, draft_state, rng, accept_key)
