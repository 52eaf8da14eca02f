"""Speculative decoding: a drafter proposes K tokens, one target verify of width K + 1, per-row commits.

The round is drafter-agnostic: `drafter.propose` -> target verify -> `rule` -> commit ->
`drafter.update`. Drafters live in specjax/drafters, acceptance rules in acceptance.py.

Every round has static shapes. Per-row variable acceptance is carried by counts and
masks, rollback is a length change, and the whole generation is one `lax.while_loop`
over `speculative_step`, so a call compiles once and never returns to the host midway.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafters import Drafter, as_drafter
from specjax.engine.acceptance import AcceptanceRule
from specjax.engine.adaptive import adaptive_round, adaptive_stats
from specjax.engine.adaptive_policy import AdaptiveConfig, init_adaptive
from specjax.engine.loop import CacheConfig, commit, gather_tokens, prefill, token_buffer
from specjax.engine.output import GenerationOutput, PreparedGeneration, collect_output
from specjax.engine.plan import plan_generation
from specjax.engine.sampling import probabilities
from specjax.engine.state import SpecState, accepted_positions, draft_context
from specjax.engine.tree_round import tree_round
from specjax.io.model import Model
from specjax.models import forward
from specjax.trees.tree import Tree


def speculative_round(target_params, draft_weights, state: SpecState) -> SpecState:
    """One round as a pure function of the parameters and the loop state (the while-loop body):
    a chain round, a tree round (tree_round.py) when the plan has a tree, or a round whose K
    the adaptive policy (adaptive.py) picks."""
    if state.plan.adaptive is not None:
        return adaptive_round(target_params, draft_weights, state, chain_round)
    if state.plan.tree is not None:
        return tree_round(target_params, draft_weights, state)
    return chain_round(target_params, draft_weights, state)


def chain_round(target_params, draft_weights, state: SpecState) -> SpecState:
    """One chain round: K drafts, a verify of width K + 1, the acceptance rule, the commit."""
    plan = state.plan
    k = plan.num_speculative_tokens
    rng, draft_key, accept_key = jax.random.split(state.rng, 3)
    lengths = state.lengths  # L: the token at L - 1 is committed but not yet verified past
    ctx = draft_context(state, target_params)
    proposal, draft_state = plan.drafter.propose(draft_weights, state.draft_state, ctx, draft_key)
    drafts = proposal.tokens  # [B, K]

    # Verify, width K + 1: [token at L-1, d_1..d_K] at positions L-1..L+K-1. Output i is
    # the target's distribution p_{i+1} for the token at position L+i.
    positions = lengths[:, None] - 1 + jnp.arange(k + 1)  # [B, K+1]
    verify_tokens = jnp.concatenate([gather_tokens(state.tokens, positions[:, :1]), drafts], axis=1)
    wants = plan.drafter.needs_features
    out = forward(plan.target, target_params, verify_tokens, positions, state.target_cache, features=wants)
    logits, target_cache = out[:2]  # features: out[2], [B, K+1, D] at positions L-1..L+K-1
    p = logits if plan.sampling.greedy else probabilities(logits, plan.sampling)
    num_accepted, next_token = plan.rule(accept_key, drafts, p, proposal.q)  # [B], [B]

    # Candidates [d_1..d_n, next, ...]: the first n + 1 count (before EOS/max cuts).
    j = jnp.arange(k + 1)[None, :]
    padded = jnp.concatenate([drafts, jnp.zeros_like(drafts[:, :1])], axis=1)
    candidates = jnp.where(j == num_accepted[:, None], next_token[:, None], padded)
    tokens, new_lengths, done = commit(
        state.tokens,
        lengths,
        state.prompt_lengths,
        state.done,
        candidates,
        num_accepted + 1,
        state.max_new_tokens,
        state.eos_token_id,
    )
    live = ~state.done
    # Rollback is a length change: slots holding rejected drafts stay and get overwritten.
    target_valid = jnp.minimum(lengths + num_accepted, new_lengths)
    after = ctx.replace(tokens=tokens, lengths=new_lengths, done=done, features=out[2] if wants else None)
    return state.replace(
        tokens=tokens,
        lengths=new_lengths,
        done=done,
        target_cache=target_cache.replace(lengths=target_valid),
        draft_state=plan.drafter.update(draft_weights, draft_state, after, num_accepted),
        rng=rng,
        row_rounds=state.row_rounds + live.astype(jnp.int32),
        accepted_at=state.accepted_at + accepted_positions(state.accepted_at, num_accepted, live),
        forwards=state.forwards + 1,
    )


def init_state(
    target_params,
    draft_weights,
    prompt,
    prompt_lengths,
    max_new_tokens,
    eos_token_id,
    rng,
    plan,
    cache_length,
    done=None,
    costs=None,
):
    """Prefill the target, set up the drafter, and return the state before the first round.

    `done` [B] bool marks rows finished from the start (padding rows of a batch bucket);
    None: every row generates. `costs` [n]: seconds per iteration at each adaptive K.
    """
    batch = prompt.shape[0]
    wants = plan.drafter.needs_features
    state = SpecState(
        tokens=token_buffer(prompt, cache_length),
        lengths=prompt_lengths,
        prompt_lengths=prompt_lengths,
        done=jnp.zeros((batch,), bool) if done is None else done,
        target_cache=None,
        draft_state=None,
        rng=rng,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        row_rounds=jnp.zeros((batch,), jnp.int32),
        accepted_at=jnp.zeros((batch, plan.accepted_width), jnp.int32),
        forwards=jnp.zeros((), jnp.int32),
        plan=plan,
    )
    filled = prefill(plan.target, target_params, prompt, prompt_lengths, cache_length, plan.cache, features=wants)
    target_cache, features = filled if wants else (filled, None)  # features [B, T_bucket, D]
    state = state.replace(target_cache=target_cache)
    if plan.adaptive is not None:
        # A round commits at least one token per live row, so cache_length bounds the rounds.
        groups = 1 + len(plan.adaptive.trees or ())
        key = jax.random.fold_in(rng, 1)  # the policy's own stream: sampling's is left as it was
        ad = init_adaptive(costs, batch, plan.accepted_width, max_rounds=cache_length, groups=groups, key=key)
        state = state.replace(adaptive=ad)
    ctx = draft_context(state, target_params).replace(features=features)
    return state.replace(draft_state=plan.drafter.init(draft_weights, ctx, prompt, cache_length))


_jit_init_state = jax.jit(init_state, static_argnames=("plan", "cache_length"))
_jit_round = jax.jit(speculative_round, donate_argnums=2)


@functools.partial(jax.jit, static_argnames=("plan", "cache_length"))
def _generate(
    target_params,
    draft_weights,
    prompt,
    prompt_lengths,
    done,
    max_new_tokens,
    eos_token_id,
    rng,
    costs,
    plan,
    cache_length,
):
    state = init_state(
        target_params,
        draft_weights,
        prompt,
        prompt_lengths,
        max_new_tokens,
        eos_token_id,
        rng,
        plan,
        cache_length,
        done,
        costs,
    )

    def cond_fn(state):
        return ~jnp.all(state.done)

    def body_fn(state):
        return speculative_round(target_params, draft_weights, state)

    return jax.lax.while_loop(cond_fn, body_fn, state)


def init_speculative_state(
    target: Model,
    draft: Model | Drafter,
    prompts,
    num_speculative_tokens: int = 4,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    eos_token_id: int | None = None,
    rule: AcceptanceRule | None = None,
    cache_config: CacheConfig | None = None,
    tree: Tree | None = None,
    adaptive: bool | AdaptiveConfig = False,
) -> SpecState:
    """Prefill both models and return the state before the first round.

    Drive rounds yourself with `state = speculative_step(target, draft, state)`; this is
    what `speculative_generate` does inside one compiled while loop. The state holds
    exactly the caller's rows (no batch-bucket padding), so its arrays and `state_output`
    read row for row.
    """
    batch, plan, weights, costs = plan_generation(
        target,
        draft,
        prompts,
        num_speculative_tokens,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        rule,
        cache_config,
        tree,
        adaptive,
    )
    prompt, prompt_lengths, done, eos, rng = batch.loop_inputs(eos_token_id, seed, padded=False)
    return _jit_init_state(
        target.params,
        weights,
        prompt,
        prompt_lengths,
        jnp.int32(max_new_tokens),
        eos,
        rng,
        plan=plan,
        cache_length=batch.cache_length,
        done=done,
        costs=costs,
    )


def speculative_step(target: Model, draft: Model | Drafter, state: SpecState) -> SpecState:
    """One jitted round (draft K, verify K + 1, commit per row). `state` is donated.

    `draft` must be the drafter `state` was initialised with (its weights are read here).
    """
    drafter = as_drafter(draft)
    if drafter.without_weights() != state.plan.drafter:
        raise ValueError(
            f"state was initialised with drafter {state.plan.drafter!r}, not {drafter.without_weights()!r}"
        )
    return _jit_round(target.params, drafter.weights(), state)


def state_output(state: SpecState, num_rows: int | None = None) -> GenerationOutput:
    """Tokens and statistics of a (possibly unfinished) speculative state.

    `num_rows`: report only the first num_rows rows (the rest pad a batch bucket).
    """
    tokens, prompt_lengths, lengths, row_rounds, accepted_at, forwards, eos, drafter_stats = jax.device_get(
        (
            state.tokens,
            state.prompt_lengths,
            state.lengths,
            state.row_rounds,
            state.accepted_at,
            state.forwards,
            state.eos_token_id,
            state.plan.drafter.stats(state.draft_state),
        )
    )
    out = collect_output(
        np.asarray(tokens),
        prompt_lengths,
        lengths,
        row_rounds,
        forwards,
        accepted_at,
        num_rows=num_rows,
        drafted_per_round=state.plan.num_speculative_tokens,
        eos_token_id=int(eos),
    )
    counters = {k: int(np.sum(np.asarray(v)[:num_rows])) for k, v in drafter_stats.items()}
    drafter = {"kind": state.plan.drafter.name, **counters}
    stats = dataclasses.replace(out.stats, drafter=drafter)
    if state.plan.adaptive is not None:
        stats = adaptive_stats(stats, state, num_rows)
    return dataclasses.replace(out, stats=stats)


def prepare_speculative_generate(
    target: Model,
    draft: Model | Drafter,
    prompts,
    num_speculative_tokens: int = 4,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    eos_token_id: int | None = None,
    rule: AcceptanceRule | None = None,
    cache_config: CacheConfig | None = None,
    tree: Tree | None = None,
    adaptive: bool | AdaptiveConfig = False,
) -> PreparedGeneration:
    """Check and pad the inputs of `speculative_generate` once; run them (repeatedly) later."""
    batch, plan, weights, costs = plan_generation(
        target,
        draft,
        prompts,
        num_speculative_tokens,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        rule,
        cache_config,
        tree,
        adaptive,
    )
    prompt, prompt_lengths, done, eos, rng = batch.loop_inputs(eos_token_id, seed)

    def launch(n: int) -> SpecState:
        return _generate(
            target.params,
            weights,
            prompt,
            prompt_lengths,
            done,
            jnp.int32(n),
            eos,
            rng,
            costs,
            plan=plan,
            cache_length=batch.cache_length,
        )

    return PreparedGeneration(
        max_new_tokens=max_new_tokens,
        batch_size=batch.batch_size,
        cache_length=batch.cache_length,
        launch_fn=launch,
        # Padding rows of the batch bucket, and their drafter counters, are dropped.
        collect_fn=functools.partial(state_output, num_rows=batch.num_rows),
        tokenizer=target.tokenizer if batch.is_text else None,
    )


def speculative_generate(
    target: Model,
    draft: Model | Drafter,
    prompts,
    num_speculative_tokens: int = 4,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    eos_token_id: int | None = None,
    rule: AcceptanceRule | None = None,
    cache_config: CacheConfig | None = None,
    tree: Tree | None = None,
    adaptive: bool | AdaptiveConfig = False,
) -> GenerationOutput:
    """Speculative decoding of a ragged batch with `draft` proposing for `target`.

    `prompts` is a list of token-id lists, or of strings when the target has a tokenizer
    (then `out.text` holds the decoded continuations).
    Greedy (temperature 0) output equals `generate(target, ...)` token for token; with
    temperature > 0 every token is distributed exactly as the target's (rejection
    sampling). `rule` replaces the acceptance rule (see specjax.engine.acceptance) for research
    on lossy or alternative verification.

    `tree` (a specjax.Tree) drafts and verifies a static token tree instead of a chain of
    `num_speculative_tokens` (which it then replaces): one target forward of width N + 1
    checks every root path, and the longest the target agrees with is committed. A tree
    `rule` has the signature of specjax.trees.acceptance.
    """
    return prepare_speculative_generate(
        target,
        draft,
        prompts,
        num_speculative_tokens,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        seed,
        eos_token_id,
        rule,
        cache_config,
        tree,
        adaptive,
    ).run()
