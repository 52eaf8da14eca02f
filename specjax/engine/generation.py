"""The compiled loop: prefill, then rounds in one `lax.while_loop` until every row is done.

One loop for every kind of generation. The round is chosen by the static plan: a plain step
(no drafter), a chain of K, a token tree, or the adaptive policy's choice among them; all
read and write one LoopState and end in `finish_round` (state.py). A generation is one
compiled program and never returns to the host midway.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core.loop import prefill, token_buffer
from specjax.core.state import LoopState, Plan
from specjax.engine.adaptive import adaptive_round, adaptive_stats
from specjax.engine.adaptive_policy import init_adaptive
from specjax.engine.output import GenerationOutput, PreparedGeneration, collect_output
from specjax.engine.prompts import PromptBatch
from specjax.engine.rounds import chain_round, draft_context, plain_round
from specjax.engine.tree_round import tree_round


def loop_round(target_params, draft_weights, state: LoopState) -> LoopState:
    """One round (the while-loop body), of the kind the plan names."""
    plan = state.plan
    if plan.drafter is None:
        return plain_round(target_params, draft_weights, state)
    if plan.adaptive is not None:
        return adaptive_round(target_params, draft_weights, state)
    if plan.tree is not None:
        return tree_round(target_params, draft_weights, state)
    return chain_round(target_params, draft_weights, state)


def init_state(
    target_params,
    draft_weights,
    prompt,
    prompt_lengths,
    max_new_tokens,
    eos_token_ids,
    rng,
    plan: Plan,
    cache_length: int,
    done=None,
    costs=None,
) -> LoopState:
    """Prefill the target, set up the drafter, and return the state before the first round.

    prompt [B, T_bucket] right-padded; prompt_lengths [B]; eos_token_ids [E]. `done` [B]
    bool marks rows finished from the start (padding rows of a batch bucket); None: every
    row generates. `costs` [n]: seconds per iteration at each adaptive K.
    """
    batch = prompt.shape[0]
    wants = plan.wants_features
    filled = prefill(plan.target, target_params, prompt, prompt_lengths, cache_length, plan.cache, features=wants)
    target_cache, features = filled if wants else (filled, None)  # features [B, T_bucket, D]
    state = LoopState(
        tokens=token_buffer(prompt, cache_length),
        lengths=prompt_lengths,
        prompt_lengths=prompt_lengths,
        done=jnp.zeros((batch,), bool) if done is None else done,
        target_cache=target_cache,
        draft_state=None,
        rng=rng,
        max_new_tokens=max_new_tokens,
        eos_token_ids=eos_token_ids,
        row_rounds=jnp.zeros((batch,), jnp.int32),
        accepted_at=jnp.zeros((batch, plan.accepted_width), jnp.int32),
        forwards=jnp.zeros((), jnp.int32),
        plan=plan,
    )
    if plan.drafter is None:
        return state
    if plan.adaptive is not None:
        # A round commits at least one token per live row, so cache_length bounds the rounds.
        groups = 1 + len(plan.adaptive.trees or ())
        key = jax.random.fold_in(rng, 1)  # the policy's own stream: sampling's is left as it was
        ad = init_adaptive(costs, batch, plan.accepted_width, max_rounds=cache_length, groups=groups, key=key)
        state = state.replace(adaptive=ad)
    ctx = draft_context(state, target_params).replace(features=features, target_cache=target_cache)
    return state.replace(draft_state=plan.drafter.init(draft_weights, ctx, prompt, cache_length))


jit_init_state = jax.jit(init_state, static_argnames=("plan", "cache_length"))
jit_round = jax.jit(loop_round, donate_argnums=2)


@functools.partial(jax.jit, static_argnames=("plan", "cache_length"))
def _generate(
    target_params, draft_weights, prompt, prompt_lengths, done, max_new_tokens, eos_token_ids, rng, costs, plan,
    cache_length,
):  # fmt: skip
    state = init_state(
        target_params, draft_weights, prompt, prompt_lengths, max_new_tokens, eos_token_ids, rng, plan, cache_length,
        done, costs,
    )  # fmt: skip
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done), lambda s: loop_round(target_params, draft_weights, s), state)


def state_output(state: LoopState, num_rows: int | None = None) -> GenerationOutput:
    """Tokens and statistics of a (possibly unfinished) state. `num_rows`: report only the
    first num_rows rows (the rest pad a batch bucket)."""
    plan = state.plan
    drafter_stats = {} if plan.drafter is None else plan.drafter.stats(state.draft_state)
    tokens, prompt_lengths, lengths, row_rounds, accepted_at, forwards, eos, drafter_stats = jax.device_get(
        (
            state.tokens,
            state.prompt_lengths,
            state.lengths,
            state.row_rounds,
            state.accepted_at,
            state.forwards,
            state.eos_token_ids,
            drafter_stats,
        )
    )
    out = collect_output(
        np.asarray(tokens),
        prompt_lengths,
        lengths,
        row_rounds,
        forwards,
        None if plan.drafter is None else accepted_at,
        num_rows=num_rows,
        drafted_per_round=plan.num_speculative_tokens if plan.drafter is not None else None,
        eos_token_id=[int(i) for i in np.asarray(eos) if i >= 0],
    )
    if plan.drafter is None:
        return out
    counters = {k: int(np.sum(np.asarray(v)[:num_rows])) for k, v in drafter_stats.items()}
    stats = dataclasses.replace(out.stats, drafter={"kind": plan.drafter.name, **counters})
    if plan.adaptive is not None:
        stats = adaptive_stats(stats, state, num_rows)
    return dataclasses.replace(out, stats=stats)


def prepared_generation(
    target, batch: PromptBatch, plan: Plan, weights, costs, max_new_tokens: int, eos_token_id, seed: int
) -> PreparedGeneration:
    """A planned call, ready to launch (repeatedly, for n <= max_new_tokens new tokens)."""
    prompt, prompt_lengths, done, eos, rng = batch.loop_inputs(eos_token_id, seed)

    def launch(n: int) -> LoopState:
        return _generate(
            target.params, weights, prompt, prompt_lengths, done, jnp.int32(n), eos, rng, costs, plan=plan,
            cache_length=batch.cache_length,
        )  # fmt: skip

    return PreparedGeneration(
        max_new_tokens=max_new_tokens,
        batch_size=batch.batch_size,
        cache_length=batch.cache_length,
        launch_fn=launch,
        # Padding rows of the batch bucket, and their drafter counters, are dropped.
        collect_fn=functools.partial(state_output, num_rows=batch.num_rows),
        tokenizer=target.tokenizer if batch.is_text else None,
    )
