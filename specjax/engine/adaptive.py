"""Adaptive speculation: every round picks K from a small static set, inside the compiled loop.

Each candidate K is a static-shaped branch of one `lax.switch`: K = 0 is a plain decode
step (a verify of width 1 that drafts nothing), K > 0 a chain round of K (speculative.py).
The branch index is the K that would finish the batch soonest if every remaining round
used it,

    tokens(row, K) = 1 + sum_{i <= K} prod_{j <= i} alpha[row, j]
    time(K)        = cost(K) * max over live rows of remaining(row) / tokens(row, K)

(a static batch takes as long as its slowest row; `objective="throughput"` maximises the
sum of tokens(row, K) over live rows per second instead), where alpha[row, i] estimates
P(draft position i is accepted | positions < i were) from that row's past rounds, and cost(K) is
the measured seconds of one loop iteration at K for
this batch size (bench/round_costs.py, or the caller's). Only past rounds feed the choice,
so each round's tokens are still distributed exactly as the target's.

The estimate is a Beta posterior over exponentially forgotten counts. Each round that
drafts multiplies its estimate's hits and tries by `decay` at every position and adds what it
saw at the positions it reached: a draft whose agreement shifts mid-generation (code turning
into prose, a passage that starts repeating) is followed within about 1 / (1 - decay)
rounds, and the evidence about positions that rounds stopped reaching fades too. A
position's prior is centred on the previous position's estimate, so a faded position is
expected to behave like the one before it: after a run of short rounds that all agree, a
long K looks as good as it probably is, and the policy climbs back to it without a probe.
Plain steps bring no evidence and forget nothing.
The argmax is over the posterior mean; `thompson=True` takes it over one draw from each
posterior instead (on the embedded pair at batch 1 the draws spread rounds over every K).
The first round chooses from the prior like any other, except that it probes when the prior
says plain (`start_at_max=True`: it drafts K_MAX, so that every position gets evidence
first). The draft is switched off only when an estimate `optimism` standard deviations above
the mean says plain too; otherwise the round probes with the cheapest K > 0. After a run of
P plain steps the policy probes the draft with the cheapest K > 0, where
P = ceil((cost(probe) - cost(0) + switch_cost * cost(0)) / (probe_budget * cost(0))): a probe
costs its longer round and two branch switches (on the CPU about one plain step together:
scripts/adaptive_overhead.py, 9 probes of K = 1 cost 1.7 ms each, where a plain step costs
1.0 ms and cost(1) - cost(0) is 0.6 ms), so a draft that never agrees costs
at most `probe_budget` of plain decoding's time, one that starts agreeing is noticed within
P steps.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.engine.loop import commit, gather_tokens
from specjax.engine.sampling import select
from specjax.engine.state import SpecState, draft_context
from specjax.engine.tree_round import tree_round
from specjax.models import forward
from specjax.trees.acceptance import default_tree_rule


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
    switch_cost: what the two branch switches of a probe cost, in plain steps (about 1 on
      the CPU; it lengthens the interval between probes).
    explore: choose by the estimate `explore` posterior standard deviations above its mean
      (upper confidence bound), which favours the longer K whose deep positions lack
      evidence; 0 (the default) chooses by the mean.
    optimism: the draft is switched off (K = 0) only when the estimate `optimism` posterior
      standard deviations above its mean says so too; until then the policy probes with the
      cheapest K > 0. One unlucky round does not switch a good draft off for P steps.
    objective: "makespan" (default): the K that finishes the batch soonest if every remaining
      round used it, i.e. cost x the most rounds any live row still needs; the right aim for
      a static batch, whose slowest row sets its time. "throughput": the most expected
      tokens per second over live rows (what a server with continuous batching wants).
    thompson: choose by a draw from each posterior (True) instead of its mean (False).
    start_at_max: the first round drafts K_MAX (or the last tree) instead of what the prior
      favours: evidence at every position at once, for the price of one long round.
    trees: choose among these token trees (specjax.Tree) and a plain step instead of chains;
      each tree keeps its own acceptance estimate by depth (its width shapes it). Costs are
      then keyed 0 (the plain step) and "tree0", "tree1", ... in this order.
    """

    ks: tuple[int, ...] | None = None
    costs: dict | None = dataclasses.field(default=None, compare=False, hash=False)
    decay: float = 0.9
    prior: float = 0.5
    prior_weight: float = 1.0
    probe_budget: float = 0.03
    switch_cost: float = 1.0
    explore: float = 0.0
    optimism: float = 2.0
    objective: str = "makespan"
    thompson: bool = False
    trees: tuple | None = None
    start_at_max: bool = False

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
        if self.objective not in ("makespan", "throughput"):
            raise ValueError(f"adaptive objective must be 'makespan' or 'throughput', got {self.objective!r}")
        if self.switch_cost < 0:
            raise ValueError(f"adaptive switch_cost must be >= 0 plain steps, got {self.switch_cost}")
        if self.optimism < 0 or self.explore < 0:
            raise ValueError(
                f"adaptive optimism and explore must be >= 0 standard deviations, got {self.optimism}, {self.explore}"
            )
        if not 0.0 < self.probe_budget <= 1.0:
            raise ValueError(f"adaptive probe_budget must lie in (0, 1], got {self.probe_budget}")
        if self.trees is not None:
            trees = tuple(self.trees)
            if not trees or self.ks is not None:
                raise ValueError("adaptive trees: give a non-empty sequence of specjax.Tree, and no ks")
            object.__setattr__(self, "trees", trees)

    # The candidates, by index into the lax.switch: what each is called, how many positions
    # (chain K, tree depth) its estimate covers, which estimate it reads, and what it drafts.
    @property
    def labels(self) -> tuple:
        return self.ks if not self.trees else (0, *(f"tree{i}" for i in range(len(self.trees))))

    @property
    def widths(self) -> tuple[int, ...]:
        return self.ks if not self.trees else (0, *(t.depth for t in self.trees))

    @property
    def groups(self) -> tuple[int, ...]:
        """Chains share one estimate by position; each tree has its own by depth."""
        return (0,) * len(self.ks) if not self.trees else (0, *range(1, len(self.trees) + 1))

    @property
    def drafted(self) -> tuple[int, ...]:
        return self.ks if not self.trees else (0, *(t.num_nodes for t in self.trees))

    def resolved(self, k_max: int) -> AdaptiveConfig:
        """This config with its candidates fixed for K_MAX (checked), without costs (the static part)."""
        if self.trees:
            return dataclasses.replace(self, ks=None, costs=None)
        ks = self.ks if self.ks is not None else default_ks(k_max)
        if max(ks) > k_max:
            raise ValueError(f"adaptive ks {ks} exceed num_speculative_tokens={k_max}")
        if len(ks) < 2:
            raise ValueError(f"adaptive speculation needs at least two candidate K values, got {ks}")
        return dataclasses.replace(self, ks=ks, costs=None)

    def cost_vector(self, costs: dict) -> np.ndarray:
        """[n] float32 seconds per iteration, in the order of the candidates (a clear error if one is missing)."""
        missing = [k for k in self.labels if k not in costs]
        if missing:
            raise ValueError(f"adaptive costs lack K={missing} (have {sorted(costs, key=str)})")
        vector = np.asarray([float(costs[k]) for k in self.labels], np.float32)
        if not np.all(vector > 0):
            raise ValueError(f"adaptive costs must be positive seconds, got {costs}")
        return vector


def default_ks(k_max: int) -> tuple[int, ...]:
    powers = [k for k in (1, 2, 4, 8, 16, 32) if k < k_max]
    return (0, *powers, k_max)


@struct.dataclass
class AdaptiveState:
    """The policy's part of the loop state (SpecState.adaptive)."""

    costs: jax.Array  # [n] float32: seconds of one iteration at each candidate
    # W = K_MAX (chains) or the deepest tree; G = 1 (chains share it) or 1 + the trees.
    hits: jax.Array  # [G, B, W] float32: forgotten counts of accepted draft positions
    tries: jax.Array  # [G, B, W] float32: forgotten counts of drafted-and-reached positions
    tried_at: jax.Array  # [B, W] int32: rounds that drafted and reached position i (all of them)
    drafted: jax.Array  # [B] int32: draft tokens proposed to each row
    rounds_per_k: jax.Array  # [n] int32
    chosen: jax.Array  # [R] int32: the candidate of round r (-1: no such round)
    estimate: jax.Array  # [R] float32: the chosen group's mean estimate of position 1 over live rows
    round: jax.Array  # [] int32
    plain_run: jax.Array  # [] int32: plain steps since the last round that drafted
    key: jax.Array  # the posterior draws' key (folded with the round number)


_NEVER_DRAFTED = 2**30  # plain_run before the first round: longer than any probe interval


def init_adaptive(costs, batch: int, width: int, max_rounds: int, groups: int = 1, key=None) -> AdaptiveState:
    return AdaptiveState(
        costs=jnp.asarray(costs, jnp.float32),
        hits=jnp.zeros((groups, batch, width), jnp.float32),
        tries=jnp.zeros((groups, batch, width), jnp.float32),
        tried_at=jnp.zeros((batch, width), jnp.int32),
        drafted=jnp.zeros((batch,), jnp.int32),
        rounds_per_k=jnp.zeros((len(costs),), jnp.int32),
        chosen=jnp.full((max_rounds,), -1, jnp.int32),
        estimate=jnp.zeros((max_rounds,), jnp.float32),
        round=jnp.zeros((), jnp.int32),
        plain_run=jnp.asarray(_NEVER_DRAFTED, jnp.int32),  # round 0 probes rather than step plain
        key=jax.random.key(0) if key is None else key,
    )


def acceptance_estimate(ad: AdaptiveState, config: AdaptiveConfig, key=None, optimism: float = 0.0) -> jax.Array:
    """[G, B, W]: each row's acceptance of draft position i given the earlier ones: the
    posterior mean plus `optimism` standard deviations (key None), or one draw from the
    posterior (Thompson sampling).

    Position i's prior is centred on position i - 1's posterior mean (position 1's on
    `prior`), with `prior_weight` rounds of weight: a position no round has reached yet is
    expected to behave like the one before it, not like a coin. The draw is from the normal
    with the posterior's mean and variance, clipped to [0, 1]: Beta draws cost a rejection
    loop per entry, and the policy only needs the spread.
    """
    w = config.prior_weight
    # mean_i = a_i + b_i mean_{i-1} with a = hits / (tries + w), b = w / (tries + w), unrolled
    # as mean_i = P_i (prior + sum_{j<=i} a_j / P_j) with P_i = b_1 ... b_i: a few vector ops
    # instead of a loop over positions (the policy runs before every round). b >= w / (w +
    # 1 / (1 - decay)) keeps P far from underflow.
    a = ad.hits / (ad.tries + w)
    b = w / (ad.tries + w)
    p = jnp.cumprod(b, axis=-1)  # [G, B, W]
    mean = p * (config.prior + jnp.cumsum(a / p, axis=-1))
    if key is None and not optimism:
        return mean
    sd = jnp.sqrt(mean * (1.0 - mean) / (ad.tries + w + 1.0))
    shift = optimism * sd if key is None else sd * jax.random.normal(key, mean.shape)
    return jnp.clip(mean + shift, 0.0, 1.0)


def expected_tokens(alpha, widths, groups) -> jax.Array:
    """alpha [G, B, W] -> [B, n]: committed tokens per row of a round of each candidate, which
    reads estimate groups[c] over its first widths[c] positions (0: a plain step, 1 token)."""
    reach = jnp.cumprod(alpha, axis=2)  # [G, B, W]: P(positions 1..i all accepted)
    cumulative = jnp.concatenate([jnp.zeros_like(reach[..., :1]), jnp.cumsum(reach, axis=2)], axis=2)
    return 1.0 + cumulative[jnp.asarray(groups), :, jnp.asarray(widths)].T


def choose(alpha, remaining, costs, widths, groups, objective: str = "makespan") -> jax.Array:
    """[] int32: the candidate that finishes the batch soonest if every remaining round used it
    ("makespan": cost x the most expected rounds any row still needs, remaining / tokens), or
    that commits the most expected tokens per second over live rows ("throughput").
    alpha [G, B, W]; remaining [B]: tokens each row still needs (0: done; a bool live mask
    works); costs [n]. Ties go to the earlier (cheaper) candidate."""
    tokens = expected_tokens(alpha, widths, groups)  # [B, n]
    remaining = jnp.asarray(remaining, jnp.float32)[:, None]
    if objective == "throughput":
        return jnp.argmax(jnp.sum(tokens * (remaining > 0), axis=0) / costs).astype(jnp.int32)
    rounds = jnp.max(remaining / tokens, axis=0)  # [n]
    return jnp.argmin(rounds * costs).astype(jnp.int32)


def policy(ad: AdaptiveState, config: AdaptiveConfig, remaining) -> jax.Array:
    """[] int32: the index of this round's candidate (see the module docstring); remaining [B]
    as in `choose`. The posterior draw's key depends on the round number only, so the choice
    is a function of the state."""
    widths, last = config.widths, len(config.widths) - 1
    key = jax.random.fold_in(ad.key, ad.round) if config.thompson else None
    args = (remaining, ad.costs, widths, config.groups, config.objective)
    index = choose(acceptance_estimate(ad, config, key, optimism=config.explore), *args)
    if widths[0] == 0:
        # Switch the draft off only when an optimistic estimate agrees, and probe it when off.
        hopeful = choose(acceptance_estimate(ad, config, optimism=config.optimism), *args)
        probe_cost = ad.costs[1] - ad.costs[0] + config.switch_cost * ad.costs[0]
        probe_every = jnp.maximum(jnp.ceil(probe_cost / (config.probe_budget * ad.costs[0])), 1)
        index = jnp.where((index == 0) & ((hopeful != 0) | (ad.plain_run >= probe_every)), 1, index)
    if config.start_at_max:
        index = jnp.where(ad.round == 0, last, index)
    return index.astype(jnp.int32)


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


def _branch(c: int, chain_round, target_params, draft_weights, state: SpecState) -> SpecState:
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


def _learn(c: int, before: SpecState, after: SpecState) -> SpecState:
    """Fold candidate c's round (before -> after) into its estimate and the statistics.
    A round that drafts forgets at every position of its estimate and counts the positions
    it reached; a plain step brings no evidence and forgets nothing."""
    config, ad = before.plan.adaptive, before.adaptive
    width, group, live = config.widths[c], config.groups[c], ~before.done
    num_accepted = jnp.sum(after.accepted_at - before.accepted_at, axis=1)  # [B]
    i = jnp.arange(1, ad.hits.shape[2] + 1)[None, :]  # draft positions 1..W
    tried = (i <= width) & (num_accepted[:, None] >= i - 1) & live[:, None]  # [B, W]
    hit = (i <= num_accepted[:, None]) & live[:, None]
    mine = (jnp.arange(ad.hits.shape[0]) == group)[:, None, None] & live[None, :, None]  # [G, B, 1]
    if width == 0:
        mine = jnp.zeros_like(mine)
    mean = acceptance_estimate(ad, config)[group, :, 0]  # [B]
    r = jnp.minimum(ad.round, ad.chosen.shape[0] - 1)
    return after.replace(
        adaptive=ad.replace(
            hits=jnp.where(mine, config.decay * ad.hits + hit[None], ad.hits),
            tries=jnp.where(mine, config.decay * ad.tries + tried[None], ad.tries),
            tried_at=ad.tried_at + tried.astype(jnp.int32),
            drafted=ad.drafted + config.drafted[c] * live.astype(jnp.int32),
            rounds_per_k=ad.rounds_per_k.at[c].add(1),
            chosen=ad.chosen.at[r].set(c),
            estimate=ad.estimate.at[r].set(jnp.sum(mean * live) / jnp.maximum(jnp.sum(live), 1)),
            round=ad.round + 1,
            plain_run=ad.plain_run + 1 if width == 0 else jnp.zeros_like(ad.plain_run),
        )
    )


def _remaining(state: SpecState) -> jax.Array:
    """[B] float32: the tokens each row still needs (0 once done)."""
    left = state.max_new_tokens - (state.lengths - state.prompt_lengths)
    return jnp.where(state.done, 0, jnp.maximum(left, 1)).astype(jnp.float32)


def adaptive_round(target_params, draft_weights, state: SpecState, chain_round) -> SpecState:
    """Rounds of the candidate the policy picks, for as long as it keeps picking it.

    One `lax.switch` per run of equal choices, not per round: on XLA:CPU a conditional in
    the loop body costs about a copy of the loop state (the KV caches) each time it runs,
    15% of a plain step for the embedded pair. Inside a run the rounds are an ordinary
    while loop, and the policy is evaluated before every round, exactly as if each round
    were its own switch.
    """
    config = state.plan.adaptive

    def run_of(c: int):
        def cond_fn(s: SpecState):
            return ~jnp.all(s.done) & (policy(s.adaptive, config, _remaining(s)) == c)

        def body_fn(s: SpecState):
            return _learn(c, s, _branch(c, chain_round, target_params, draft_weights, s))

        return lambda s: jax.lax.while_loop(cond_fn, body_fn, s)

    index = policy(state.adaptive, config, _remaining(state))
    return jax.lax.switch(index, [run_of(c) for c in range(len(config.widths))], state)


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
    labels = [k if isinstance(k, str) else int(k) for k in config.labels]
    policy = {
        "ks": labels,
        "trees": None if not config.trees else [repr(t) for t in config.trees],
        "costs_seconds": [float(c) for c in ad.costs],
        "rounds_per_k": {k: int(n) for k, n in zip(labels, ad.rounds_per_k, strict=True)},
        "plain_steps": int(ad.rounds_per_k[labels.index(0)]) if 0 in labels else 0,
        "chosen_k": [labels[c] for c in chosen],
        "estimate_position_1": [round(float(x), 4) for x in np.asarray(ad.estimate)[: len(chosen)]],
    }
    return dataclasses.replace(
        stats,
        drafted_tokens=drafted,
        acceptance_rate=stats.accepted_tokens / drafted if drafted else 0.0,
        accepted_per_position=per_position,
        adaptive=policy,
    )


def plan_tokens(adaptive, num_speculative_tokens: int) -> int:
    """Slots a round may write past the committed length: K_MAX, or the largest tree's nodes."""
    if isinstance(adaptive, AdaptiveConfig) and adaptive.trees:
        return max(tree.num_nodes for tree in adaptive.trees)
    return num_speculative_tokens


def resolve_adaptive(adaptive, plan, target, drafter, batch, rule=None):
    """(plan with its static AdaptiveConfig, costs [n] float32) for `adaptive` (False, True or
    an AdaptiveConfig); (plan, None) when it is off. Costs the caller did not give are measured
    once per shape, at the batch's bucket size and cache length. `rule`: the caller's
    acceptance rule, or None (trees then get the default tree rule)."""
    if adaptive is False or adaptive is None:
        return plan, None
    config = AdaptiveConfig() if adaptive is True else adaptive
    if not isinstance(config, AdaptiveConfig):
        raise ValueError(f"adaptive must be True, False or a specjax.AdaptiveConfig, got {adaptive!r}")
    if plan.tree is not None:
        raise ValueError(
            "adaptive speculation chooses its own rounds: pass no tree (AdaptiveConfig(trees=...) chooses among trees)"
        )
    static = config.resolved(plan.num_speculative_tokens)
    if static.trees:
        for tree in static.trees:
            drafter.check_tree(target.config, tree)
        if rule is None:
            plan = dataclasses.replace(plan, rule=default_tree_rule(plan.sampling))
    else:
        for k in static.ks:
            if k:
                drafter.check(target.config, k)
    costs = config.costs
    if costs is None:
        # The bench times loop iterations; it depends on the engine, so it is imported here.
        from specjax.bench.round_costs import measure_round_costs

        costs = measure_round_costs(
            target, drafter, batch.bucket_rows, static, batch.cache_length, plan.sampling.temperature
        )
    return dataclasses.replace(plan, adaptive=static), jnp.asarray(static.cost_vector(costs))
