"""Adaptive speculation: every round picks K from a small static set, inside the compiled loop.

Each candidate K is a static-shaped branch of one `lax.switch`: K = 0 is a plain decode
step (a verify of width 1 that drafts nothing), K > 0 a chain round of K (rounds.py),
or with `AdaptiveConfig(trees=...)` a token tree (tree_round.py). Which one runs is the
policy's choice (adaptive_policy.py) before every round, from past rounds only (and, with
AdaptiveConfig.abstain, whether the drafter has anything to propose from the committed
tokens: prompt lookup without a match takes a plain step), so each
round's tokens are still distributed exactly as the target's. This file runs the chosen
rounds, folds what each round saw into the estimate, and reports what the policy did.
Planning the candidates is engine/plan.py's job; the costs are an input (engine/costs.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core.state import LoopState
from specjax.engine.adaptive_policy import fold_round, policy
from specjax.engine.rounds import chain_round, draft_context, plain_round
from specjax.engine.tree_round import tree_round


def _branch(c: int, target_params, draft_weights, state: LoopState) -> LoopState:
    """Candidate c's round: a plain step, a chain of K, or a tree; the loop state keeps the
    adaptive plan while the round runs with a fixed one."""
    plan = state.plan
    config = plan.adaptive
    if config.widths[c] == 0:
        return plain_round(target_params, draft_weights, state)
    if config.trees:
        tree = config.trees[c - 1]
        fixed = dataclasses.replace(plan, num_speculative_tokens=tree.num_nodes, tree=tree, adaptive=None)
        return tree_round(target_params, draft_weights, state.replace(plan=fixed)).replace(plan=plan)
    fixed = dataclasses.replace(plan, num_speculative_tokens=config.ks[c], adaptive=None)
    return chain_round(target_params, draft_weights, state.replace(plan=fixed)).replace(plan=plan)


def _learn(c: int, before: LoopState, after: LoopState) -> LoopState:
    """Fold candidate c's round (before -> after) into its estimate and the statistics."""
    num_accepted = jnp.sum(after.accepted_at - before.accepted_at, axis=1)  # [B]
    adaptive = fold_round(before.adaptive, before.plan.adaptive, c, num_accepted, ~before.done)
    return after.replace(adaptive=adaptive)


def _remaining(state: LoopState) -> jax.Array:
    """[B] float32: the tokens each row still needs (0 once done)."""
    left = state.max_new_tokens - (state.lengths - state.prompt_lengths)
    return jnp.where(state.done, 0, jnp.maximum(left, 1)).astype(jnp.float32)


def _choice(target_params, draft_weights, state: LoopState) -> tuple[jax.Array, jax.Array]:
    """(index [] int32 of this round's candidate, forced [] bool: a plain step only because
    the drafter abstains for every live row). The abstention reads committed history only,
    like the policy, so the round's tokens stay distributed as the target's."""
    config = state.plan.adaptive
    index = policy(state.adaptive, config, _remaining(state))
    no = jnp.zeros((), bool)
    if not config.abstain or config.widths[0] != 0 or state.plan.drafter is None:
        return index, no
    ctx = draft_context(state, target_params)
    abstain = state.plan.drafter.abstains(draft_weights, state.draft_state, ctx)  # [B] or None
    if abstain is None:
        return index, no
    forced = jnp.all(abstain | state.done) & (index != 0)
    return jnp.where(forced, 0, index).astype(index.dtype), forced


def adaptive_round(target_params, draft_weights, state: LoopState) -> LoopState:
    """Rounds of the candidate the policy picks, for as long as it keeps picking it.

    One `lax.switch` per run of equal choices, not per round: on XLA:CPU a conditional in
    the loop body costs about a copy of the loop state (the KV caches) each time it runs,
    15% of a plain step for the embedded pair. Inside a run the rounds are an ordinary
    while loop, and the policy is evaluated before every round, exactly as if each round
    were its own switch.
    """
    config = state.plan.adaptive

    def run_of(c: int):
        def cond_fn(s: LoopState):
            return ~jnp.all(s.done) & (_choice(target_params, draft_weights, s)[0] == c)

        def body_fn(s: LoopState):
            after = _learn(c, s, _branch(c, target_params, draft_weights, s))
            if config.widths[c] != 0:
                return after
            forced = _choice(target_params, draft_weights, s)[1]
            return after.replace(adaptive=after.adaptive.replace(abstained=after.adaptive.abstained + forced))

        return lambda s: jax.lax.while_loop(cond_fn, body_fn, s)

    index = _choice(target_params, draft_weights, state)[0]
    return jax.lax.switch(index, [run_of(c) for c in range(len(config.widths))], state)


def adaptive_stats(stats, state: LoopState, num_rows: int | None):
    """GenerationStats with what the policy did (`.adaptive`) and the draft counters of rounds
    whose K varied: drafted_tokens counts what each round drafted, acceptance per position
    divides by the rounds that drafted and reached it, and verify_width is K_MAX + 1.

    `.adaptive["costs"]` is None here: where the round costs came from (RoundCosts.report)
    is filled in by the prepared call that resolved them (PreparedGeneration.costs)."""
    config = state.plan.adaptive
    ad = jax.device_get(state.adaptive)
    rounds = int(ad.round)
    chosen = np.asarray(ad.chosen)[: min(rounds, ad.chosen.shape[0])]
    drafted = int(np.sum(np.asarray(ad.drafted)[:num_rows]))
    tried = np.asarray(ad.tried_at)[:num_rows]  # [B, W]: drafted position i and reached it
    accepted_at = np.asarray(jax.device_get(state.accepted_at))[:num_rows]
    labels = [k if isinstance(k, str) else int(k) for k in config.labels]
    policy = {
        "ks": labels,
        "trees": None if not config.trees else [repr(t) for t in config.trees],
        "costs_seconds": [float(c) for c in ad.costs],
        # Where the costs came from is host-side knowledge of the call that resolved them
        # (engine/costs.py); a prepared call fills it in, a bare state has none.
        "costs": None,
        "rounds_per_k": {k: int(n) for k, n in zip(labels, ad.rounds_per_k, strict=True)},
        "plain_steps": int(ad.rounds_per_k[labels.index(0)]) if 0 in labels else 0,
        "abstained_steps": int(ad.abstained),  # plain steps because the drafter had nothing
        "chosen_k": [labels[c] for c in chosen],
        "estimate_position_1": [round(float(x), 4) for x in np.asarray(ad.estimate)[: len(chosen)]],
    }
    # A round drafted iff it reached position 1: the plain steps draft nothing.
    return dataclasses.replace(stats.with_drafts(tried[:, 0], accepted_at, tried, drafted), adaptive=policy)
