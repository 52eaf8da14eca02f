"""Adaptive speculation: every round picks K from a small static set, inside the compiled loop.

Each candidate K is a static-shaped branch of one `lax.switch`: K = 0 is a plain decode
step (a verify of width 1 that drafts nothing), K > 0 a chain round of K (speculative.py).
The branch index is the argmax of expected committed tokens per second,

    tokens(K) = sum over live rows of 1 + sum_{i <= K} prod_{j <= i} alpha[row, j]
    score(K)  = tokens(K) / cost(K)

where alpha[row, i] estimates P(draft position i is accepted | positions < i were) from
that row's past rounds, and cost(K) is the measured seconds of one loop iteration at K for
this batch size (bench/round_costs.py, or the caller's). Only past rounds feed the choice,
so each round's tokens are still distributed exactly as the target's.

The estimate is a Beta posterior over exponentially forgotten counts: hits and tries decay
by `decay` every round that drafts, so a draft whose agreement shifts mid-generation
(code turning into prose, a passage that starts repeating) is followed within about
1 / (1 - decay) rounds. The argmax is taken over one draw from each posterior (Thompson
sampling), not over its mean: a draft judged on one unlucky round still gets tried while
its posterior is wide, and a draft that failed many times is almost never tried again.
Two rounds are not the argmax's to choose:
  - the first round drafts K_MAX, so every position gets evidence before the prior decides;
  - after a run of P plain steps the policy probes the draft with the cheapest K > 0, where
    P = ceil((cost(probe) - cost(0)) / (probe_budget * cost(0))): a draft that never agrees
    costs at most `probe_budget` of plain decoding's time, one that starts agreeing is
    noticed within P steps.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.engine.loop import commit, gather_tokens
from specjax.engine.sampling import select
from specjax.engine.state import SpecState, draft_context
from specjax.models import forward


@dataclasses.dataclass(frozen=True)
class AdaptiveConfig:
    """How `speculative_generate(..., adaptive=...)` chooses K each round.

    ks: the candidate K values (0 = a plain step); None: 0, 1, 2, 4, 8, ... up to K_MAX,
      and K_MAX itself. Each is one compiled branch, so a few are enough.
    costs: seconds of one loop iteration at each K, {K: seconds} for this target, drafter,
      batch size and context; None measures them once per shape (bench/round_costs.py).
    decay: how much of its past evidence the estimate keeps each round (0 < decay < 1);
      1 / (1 - decay) rounds is its memory.
    prior, prior_weight: the Beta prior of each position's acceptance, as a mean and a
      weight in rounds.
    probe_budget: the share of plain decoding's time that probing a switched-off draft
      may cost (it sets how often the policy probes).
    thompson: choose by a draw from the posterior (True) or by its mean (False: greedy,
      deterministic, and slow to recover from an unlucky start).
    """

    ks: tuple[int, ...] | None = None
    costs: dict | None = dataclasses.field(default=None, compare=False, hash=False)
    decay: float = 0.9
    prior: float = 0.5
    prior_weight: float = 1.0
    probe_budget: float = 0.03
    thompson: bool = True

    def __post_init__(self):
        if self.ks is not None:
            ks = tuple(int(k) for k in self.ks)
            if not ks or any(k < 0 for k in ks) or len(set(ks)) != len(ks):
                raise ValueError(f"adaptive ks must be distinct integers >= 0, got {self.ks!r}")
            object.__setattr__(self, "ks", tuple(sorted(ks)))
        if not 0.0 < self.decay < 1.0:
            raise ValueError(f"adaptive decay must lie in (0, 1), got {self.decay}")
        if not 0.0 < self.prior < 1.0 or self.prior_weight <= 0:
            raise ValueError(
                f"adaptive prior must lie in (0, 1) with prior_weight > 0, got {self.prior}, {self.prior_weight}"
            )
        if not 0.0 < self.probe_budget <= 1.0:
            raise ValueError(f"adaptive probe_budget must lie in (0, 1], got {self.probe_budget}")

    def resolved(self, k_max: int) -> AdaptiveConfig:
        """This config with its K set fixed for K_MAX (checked), and without costs (the static part)."""
        ks = self.ks if self.ks is not None else default_ks(k_max)
        if max(ks) > k_max:
            raise ValueError(f"adaptive ks {ks} exceed num_speculative_tokens={k_max}")
        if len(ks) < 2:
            raise ValueError(f"adaptive speculation needs at least two candidate K values, got {ks}")
        return dataclasses.replace(self, ks=ks, costs=None)

    def cost_vector(self, costs: dict) -> np.ndarray:
        """[n] float32 seconds per iteration, in the order of `ks` (a clear error if one is missing)."""
        missing = [k for k in self.ks if k not in costs]
        if missing:
            raise ValueError(f"adaptive costs lack K={missing} (have {sorted(costs)})")
        vector = np.asarray([float(costs[k]) for k in self.ks], np.float32)
        if not np.all(vector > 0):
            raise ValueError(f"adaptive costs must be positive seconds, got {costs}")
        return vector


def default_ks(k_max: int) -> tuple[int, ...]:
    powers = [k for k in (1, 2, 4, 8, 16, 32) if k < k_max]
    return (0, *powers, k_max)


@struct.dataclass
class AdaptiveState:
    """The policy's part of the loop state (SpecState.adaptive)."""

    costs: jax.Array  # [n] float32: seconds of one iteration at each candidate K
    hits: jax.Array  # [B, K_MAX] float32: forgotten counts of accepted draft positions
    tries: jax.Array  # [B, K_MAX] float32: forgotten counts of drafted-and-reached positions
    tried_at: jax.Array  # [B, K_MAX] int32: rounds that drafted and reached position i (all of them)
    drafted: jax.Array  # [B] int32: draft tokens proposed to each row
    rounds_per_k: jax.Array  # [n] int32
    chosen: jax.Array  # [R] int32: the K of round r (-1: no such round)
    estimate: jax.Array  # [R] float32: mean estimated acceptance of position 1 over live rows at round r
    round: jax.Array  # [] int32
    plain_run: jax.Array  # [] int32: plain steps since the last round that drafted


def init_adaptive(costs, batch: int, k_max: int, max_rounds: int) -> AdaptiveState:
    return AdaptiveState(
        costs=jnp.asarray(costs, jnp.float32),
        hits=jnp.zeros((batch, k_max), jnp.float32),
        tries=jnp.zeros((batch, k_max), jnp.float32),
        tried_at=jnp.zeros((batch, k_max), jnp.int32),
        drafted=jnp.zeros((batch,), jnp.int32),
        rounds_per_k=jnp.zeros((len(costs),), jnp.int32),
        chosen=jnp.full((max_rounds,), -1, jnp.int32),
        estimate=jnp.zeros((max_rounds,), jnp.float32),
        round=jnp.zeros((), jnp.int32),
        plain_run=jnp.zeros((), jnp.int32),
    )


def acceptance_estimate(ad: AdaptiveState, config: AdaptiveConfig, key=None) -> jax.Array:
    """[B, K_MAX]: each row's per-position acceptance, the posterior mean (key None) or one
    draw from the posterior Beta(hits + a, misses + b)."""
    a = config.prior * config.prior_weight
    b = config.prior_weight - a
    if key is None:
        return (ad.hits + a) / (ad.tries + config.prior_weight)
    return jax.random.beta(key, ad.hits + a, ad.tries - ad.hits + b)


def expected_tokens(alpha, ks) -> jax.Array:
    """alpha [B, K_MAX] -> [B, n]: committed tokens a round of each K in `ks` yields per row."""
    reach = jnp.cumprod(alpha, axis=1)  # [B, K_MAX]: P(positions 1..i all accepted)
    cumulative = jnp.concatenate([jnp.zeros_like(reach[:, :1]), jnp.cumsum(reach, axis=1)], axis=1)
    return 1.0 + cumulative[:, jnp.asarray(ks)]


def choose(alpha, live, costs, ks) -> jax.Array:
    """[] int32: the index into `ks` with the most expected tokens per second over live rows.
    alpha [B, K_MAX], live [B] bool, costs [n]. Ties go to the smaller K."""
    tokens = jnp.sum(expected_tokens(alpha, ks) * live[:, None], axis=0)  # [n]
    return jnp.argmax(tokens / costs).astype(jnp.int32)


def policy(ad: AdaptiveState, config: AdaptiveConfig, live, key) -> jax.Array:
    """[] int32: the index into config.ks of this round's K (see the module docstring)."""
    ks = config.ks
    index = choose(acceptance_estimate(ad, config, key if config.thompson else None), live, ad.costs, ks)
    if ks[0] != 0:  # no plain steps, nothing to probe
        return jnp.where(ad.round == 0, len(ks) - 1, index)
    probe_every = jnp.maximum(jnp.ceil((ad.costs[1] - ad.costs[0]) / (config.probe_budget * ad.costs[0])), 1)
    index = jnp.where((index == 0) & (ad.plain_run >= probe_every), 1, index)
    return jnp.where(ad.round == 0, len(ks) - 1, index).astype(jnp.int32)


def plain_round(target_params, draft_weights, state: SpecState) -> SpecState:
    """K = 0: one target forward of width 1 at position L - 1 and one token drawn from it, as
    plain decoding does; the drafter sees the commit as a round that accepted nothing."""
    plan = state.plan
    rng, key = jax.random.split(state.rng)
    positions = state.lengths[:, None] - 1  # [B, 1]
    wants = plan.drafter.needs_features
    out = forward(
        plan.target,
        target_params,
        gather_tokens(state.tokens, positions),
        positions,
        state.target_cache,
        features=wants,
    )
    logits, target_cache = out[:2]  # [B, 1, V]
    token = select(key, logits[:, 0], plan.sampling)  # [B]
    tokens, lengths, done = commit(
        state.tokens,
        state.lengths,
        state.prompt_lengths,
        state.done,
        token[:, None],
        jnp.ones_like(state.lengths),
        state.max_new_tokens,
        state.eos_token_id,
    )
    ctx = draft_context(state, target_params)
    after = ctx.replace(tokens=tokens, lengths=lengths, done=done, features=out[2] if wants else None)
    none = jnp.zeros_like(state.lengths)
    return state.replace(
        tokens=tokens,
        lengths=lengths,
        done=done,
        target_cache=target_cache,
        draft_state=plan.drafter.update(draft_weights, state.draft_state, after, none),
        rng=rng,
        row_rounds=state.row_rounds + (~state.done).astype(jnp.int32),
        forwards=state.forwards + 1,
    )


def _branch(k: int, chain_round, target_params, draft_weights, state: SpecState) -> SpecState:
    if k == 0:
        return plain_round(target_params, draft_weights, state)
    plan = state.plan
    # The round runs with a plan of K = k; the loop state keeps the adaptive plan.
    fixed = dataclasses.replace(plan, num_speculative_tokens=k, adaptive=None)
    return chain_round(target_params, draft_weights, state.replace(plan=fixed)).replace(plan=plan)


def adaptive_round(target_params, draft_weights, state: SpecState, chain_round) -> SpecState:
    """Choose K from the past, run that branch, and fold the round's outcome into the estimate."""
    config, ad = state.plan.adaptive, state.adaptive
    ks = config.ks
    live = ~state.done
    rng, key = jax.random.split(state.rng)
    state = state.replace(rng=rng)
    index = policy(ad, config, live, key)
    branches = [functools.partial(_branch, k, chain_round) for k in ks]
    new = jax.lax.switch(index, branches, target_params, draft_weights, state)

    k = jnp.asarray(ks, jnp.int32)[index]
    num_accepted = jnp.sum(new.accepted_at - state.accepted_at, axis=1)  # [B]
    i = jnp.arange(1, ad.hits.shape[1] + 1)[None, :]  # draft positions 1..K_MAX
    tried = (i <= k) & (num_accepted[:, None] >= i - 1) & live[:, None]  # [B, K_MAX]
    hit = (i <= num_accepted[:, None]) & live[:, None]
    alpha_1 = acceptance_estimate(ad, config)[:, 0]
    mean_alpha_1 = jnp.sum(alpha_1 * live) / jnp.maximum(jnp.sum(live), 1)
    r = jnp.minimum(ad.round, ad.chosen.shape[0] - 1)
    forget = jnp.where(k > 0, config.decay, 1.0)  # plain steps bring no evidence, so keep it
    return new.replace(
        adaptive=ad.replace(
            hits=forget * ad.hits + hit,
            tries=forget * ad.tries + tried,
            tried_at=ad.tried_at + tried.astype(jnp.int32),
            drafted=ad.drafted + k * live.astype(jnp.int32),
            rounds_per_k=ad.rounds_per_k.at[index].add(1),
            chosen=ad.chosen.at[r].set(k),
            estimate=ad.estimate.at[r].set(mean_alpha_1),
            round=ad.round + 1,
            plain_run=jnp.where(k > 0, 0, ad.plain_run + 1),
        )
    )


def adaptive_stats(stats, state: SpecState, num_rows: int | None):
    """GenerationStats with what the policy did (`.adaptive`) and the draft counters of rounds
    whose K varied: drafted_tokens counts what each round drafted, acceptance per position
    divides by the rounds that drafted and reached it, and verify_width is K_MAX + 1."""
    config = state.plan.adaptive
    ad = jax.device_get(state.adaptive)
    rounds = int(ad.round)
    chosen = np.asarray(ad.chosen)[: min(rounds, ad.chosen.shape[0])]
    drafted = int(np.sum(np.asarray(ad.drafted)[:num_rows]))
    tried = np.asarray(ad.tried_at)[:num_rows].sum(axis=0)
    per_position = [float(c / t) if t else 0.0 for c, t in zip(stats.accepted_counts, tried, strict=True)]
    policy = {
        "ks": list(config.ks),
        "costs_seconds": [float(c) for c in ad.costs],
        "rounds_per_k": {int(k): int(n) for k, n in zip(config.ks, ad.rounds_per_k, strict=True)},
        "plain_steps": int(ad.rounds_per_k[config.ks.index(0)]) if 0 in config.ks else 0,
        "chosen_k": chosen.tolist(),
        "estimate_position_1": [round(float(x), 4) for x in np.asarray(ad.estimate)[: len(chosen)]],
    }
    return dataclasses.replace(
        stats,
        drafted_tokens=drafted,
        acceptance_rate=stats.accepted_tokens / drafted if drafted else 0.0,
        accepted_per_position=per_position,
        adaptive=policy,
    )


def resolve_adaptive(adaptive, plan, target, drafter, batch):
    """(plan with its static AdaptiveConfig, costs [n] float32) for `adaptive` (False, True or
    an AdaptiveConfig); (plan, None) when it is off. Costs the caller did not give are measured
    once per shape, at the batch's bucket size and cache length."""
    if adaptive is False or adaptive is None:
        return plan, None
    config = AdaptiveConfig() if adaptive is True else adaptive
    if not isinstance(config, AdaptiveConfig):
        raise ValueError(f"adaptive must be True, False or a specjax.AdaptiveConfig, got {adaptive!r}")
    if plan.tree is not None:
        raise ValueError("adaptive=True chooses among chains of K <= num_speculative_tokens; pass no tree")
    static = config.resolved(plan.num_speculative_tokens)
    for k in static.ks:
        if k:
            drafter.check(target.config, k)
    costs = config.costs
    if costs is None:
        # The bench times loop iterations; it depends on the engine, so it is imported here.
        from specjax.bench.round_costs import measure_round_costs

        costs = measure_round_costs(
            target, drafter, batch.bucket_rows, static.ks, batch.cache_length, plan.sampling.temperature
        )
    return dataclasses.replace(plan, adaptive=static), jnp.asarray(static.cost_vector(costs))
