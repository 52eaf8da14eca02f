"""Adaptive speculation's policy: which K the next round drafts, from past rounds and round costs.

Each candidate K is one static-shaped branch of adaptive.py's `lax.switch`: K = 0 is a plain decode
step (a verify of width 1 that drafts nothing), K > 0 a chain round of K (speculative.py).
The branch index is the K that would finish the batch soonest if every remaining round
used it,

    tokens(K)  = 1 + N,  P(N >= i) = prod_{j <= i} alpha[j]   (alpha pooled over live rows)
    rounds(K)  = R / E[tokens] + sqrt(2 ln n) sqrt(R Var[tokens] / E[tokens]^3)
    time(K)    = cost(K) * rounds(K)

for n live rows whose longest still needs R tokens: a static batch takes as long as its
slowest row, and long rounds spread a row's progress more (`choose`).
`objective="throughput"` maximises the sum of E[tokens] over live rows per second instead.
alpha[row, i] estimates P(draft position i is accepted | positions < i were) from that
row's past rounds, and cost(K) is the measured seconds of one loop iteration at K for this
batch size (engine/round_costs.py, or the caller's). Only past rounds feed the choice,
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
The first round has only the prior (0.5 at every position) and reads it optimistically,
`first_optimism` standard deviations up (about 0.85): a long K where rounds are cheap, a short
one where they are not; and it probes when even that says plain (`start_at_max=True`: it
drafts K_MAX). Starting from the plain prior instead, the policy climbs K = 1, 4, 8 over the
first rounds, which the E11 simulation (bench/adaptive_predict.py) put at 6% of a 128-token
generation at batch 1. The draft is switched off only when an estimate `optimism` standard deviations above
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


@dataclasses.dataclass(frozen=True)
class AdaptiveConfig:
    """How `SpeculativeConfig(adaptive=...)` chooses K each round.

    ks: the candidate K values (0 = a plain step); None: 0, 1, 2, 4, 8, ... up to K_MAX,
      and K_MAX itself. Each is one compiled branch, so a few are enough.
    costs: seconds of one loop iteration at each K, {K: seconds} for this target, drafter,
      batch size and context; None measures them once per machine and shape
      (engine/round_costs.py) and keeps them on disk for later processes
      (engine/cost_cache.py: $SPECJAX_CACHE_DIR, else ~/.cache/specjax, under round_costs/).
      `prepare` resolves them (engine/costs.py) into a RoundCosts before the loop runs.
    remeasure: measure the costs even when a file holds them, and overwrite it.
    progress: a progress bar on stderr while costs are measured; None (the default) shows
      it only when stderr is a terminal, False never.
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
    first_optimism: `explore` for the first round, which has only the prior to go on: one
      standard deviation up, the prior 0.5 reads as about 0.85, so the first round tries a
      long K where rounds are cheap and a short one where they are not.
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
    abstain: a round in which the drafter has nothing to propose for any live row
      (`Drafter.abstains`: prompt lookup found no match) is a plain step, whatever the
      estimate says, and teaches the estimate nothing; the estimate then describes the
      rounds that had a proposal. Without K = 0 among the candidates it does nothing.
    """

    ks: tuple[int, ...] | None = None
    costs: dict | None = dataclasses.field(default=None, compare=False, hash=False)
    # How this call gets its costs, not what the compiled loop does: never part of the jit key.
    remeasure: bool = dataclasses.field(default=False, compare=False, hash=False)
    progress: bool | None = dataclasses.field(default=None, compare=False, hash=False)
    decay: float = 0.9
    prior: float = 0.5
    prior_weight: float = 1.0
    probe_budget: float = 0.03
    switch_cost: float = 1.0
    explore: float = 0.0
    first_optimism: float = 1.0
    optimism: float = 2.0
    objective: str = "makespan"
    thompson: bool = False
    trees: tuple | None = None
    start_at_max: bool = False
    abstain: bool = True

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
        if self.optimism < 0 or self.explore < 0 or self.first_optimism < 0:
            raise ValueError(
                "adaptive optimism, explore and first_optimism must be >= 0 standard deviations, got "
                f"{self.optimism}, {self.explore}, {self.first_optimism}"
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
        """This config with its candidates fixed for K_MAX (checked), without costs or how to get
        them (the static part)."""
        if self.trees:
            return dataclasses.replace(self, ks=None, costs=None, remeasure=False, progress=None)
        ks = self.ks if self.ks is not None else default_ks(k_max)
        if max(ks) > k_max:
            raise ValueError(f"adaptive ks {ks} exceed num_speculative_tokens={k_max}")
        if len(ks) < 2:
            raise ValueError(f"adaptive speculation needs at least two candidate K values, got {ks}")
        return dataclasses.replace(self, ks=ks, costs=None, remeasure=False, progress=None)

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


COST_SOURCES = ("measured", "cache", "given")


@dataclasses.dataclass(frozen=True)
class RoundCosts:
    """The policy's cost input for one call, resolved before the loop runs (engine/costs.py),
    and where it came from; a prepared call carries it, the compiled loop reads only `vector`.

    labels: the candidates (AdaptiveConfig.labels). seconds: one loop iteration at each, in
    that order (float32 values: what the loop reads). source: "measured" (in this process),
    "cache" (a file an earlier one wrote) or "given" (AdaptiveConfig.costs). spent: seconds
    getting them took this call. path: the cache file (None: given). measured_at (UTC, ISO
    8601) and measurement_seconds: when and how long the measurement that made them took."""

    labels: tuple
    seconds: tuple[float, ...]
    source: str
    spent: float = 0.0
    path: str | None = None
    measured_at: str | None = None
    measurement_seconds: float | None = None

    def __post_init__(self):
        if self.source not in COST_SOURCES:
            raise ValueError(f"cost source must be one of {COST_SOURCES}, got {self.source!r}")
        if len(self.labels) != len(self.seconds):
            raise ValueError(f"{len(self.seconds)} costs for {len(self.labels)} candidates {self.labels}")

    @classmethod
    def of(cls, config: AdaptiveConfig, costs: dict, source: str, **where) -> RoundCosts:
        """{candidate: seconds} for `config`'s candidates (checked: all there, all positive)."""
        vector = config.cost_vector(costs)
        return cls(tuple(config.labels), tuple(float(c) for c in vector), source, **where)

    @property
    def vector(self) -> np.ndarray:
        """[n] float32 seconds per iteration, in the order of the candidates."""
        return np.asarray(self.seconds, np.float32)

    def report(self) -> dict:
        """GenerationStats.adaptive["costs"]: the provenance, and per_k_ms (milliseconds by K)."""
        per_k_ms = {label: round(1e3 * c, 4) for label, c in zip(self.labels, self.seconds, strict=True)}
        return dict(source=self.source, seconds=self.spent, path=self.path, measured_at=self.measured_at,
                    measurement_seconds=self.measurement_seconds, per_k_ms=per_k_ms)  # fmt: skip


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
    abstained: jax.Array  # [] int32: plain steps taken because the drafter abstained (AdaptiveConfig.abstain)
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
        abstained=jnp.zeros((), jnp.int32),
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
    if key is None and isinstance(optimism, int | float) and optimism == 0:
        return mean
    sd = jnp.sqrt(mean * (1.0 - mean) / (ad.tries + w + 1.0))
    shift = optimism * sd if key is None else sd * jax.random.normal(key, mean.shape)
    return jnp.clip(mean + shift, 0.0, 1.0)


def token_moments(alpha, widths, groups) -> tuple[jax.Array, jax.Array]:
    """alpha [G, B, W] -> (mean, variance) [B, n] of the tokens a round of each candidate
    commits per row; candidate c reads estimate groups[c] over its first widths[c] positions
    (0: a plain step, 1 token). Tokens = 1 + N with N the accepted drafts, P(N >= i) =
    reach_i = a_1 ... a_i, so E[N] = sum_i reach_i and E[N^2] = sum_i (2i - 1) reach_i."""
    reach = jnp.cumprod(alpha, axis=2)  # [G, B, W]: P(positions 1..i all accepted)
    odd = 2.0 * jnp.arange(1, alpha.shape[2] + 1) - 1.0

    def upto(x):  # [G, B, W] -> [B, n]: the sum over each candidate's positions
        cumulative = jnp.concatenate([jnp.zeros_like(x[..., :1]), jnp.cumsum(x, axis=2)], axis=2)
        return cumulative[jnp.asarray(groups), :, jnp.asarray(widths)].T

    first, second = upto(reach), upto(odd * reach)
    return 1.0 + first, second - first**2


def expected_tokens(alpha, widths, groups) -> jax.Array:
    """[B, n]: the mean of `token_moments`."""
    return token_moments(alpha, widths, groups)[0]


def choose(alpha, remaining, costs, widths, groups, objective: str = "makespan") -> jax.Array:
    """[] int32: the candidate that finishes the batch soonest if every remaining round used it
    ("makespan"), or that commits the most expected tokens per second over live rows
    ("throughput"). alpha [G, B, W]; remaining [B]: tokens each row still needs (0: done);
    costs [n]. Ties go to the earlier (cheaper) candidate.

    Makespan: with the live rows' pooled acceptance, a row needs about R / mean rounds for
    the R tokens the longest row still needs, give or take sqrt(R var / mean^3); the
    slowest of n live rows lands about sqrt(2 ln n) of those above the mean. Long rounds
    commit more tokens but spread them more, so at a large batch a row that is unlucky
    at K = 8 keeps everyone waiting. The estimate is pooled because a row's own estimate
    follows its recent rounds, and the row in the deepest passing dip would decide."""
    remaining = jnp.asarray(remaining, jnp.float32)
    live = remaining > 0
    if objective == "throughput":
        tokens = expected_tokens(alpha, widths, groups)  # [B, n]
        return jnp.argmax(jnp.sum(tokens * live[:, None], axis=0) / costs).astype(jnp.int32)
    count = jnp.maximum(jnp.sum(live), 1)
    pooled = jnp.sum(alpha * live[None, :, None], axis=1, keepdims=True) / count  # [G, 1, W]
    mean, var = (x[0] for x in token_moments(pooled, widths, groups))  # [n]
    longest = jnp.max(remaining)
    spread = jnp.sqrt(2.0 * jnp.log(count.astype(jnp.float32)))
    rounds = longest / mean + spread * jnp.sqrt(longest * jnp.maximum(var, 0.0) / mean**3)
    return jnp.argmin(rounds * costs).astype(jnp.int32)


def policy(ad: AdaptiveState, config: AdaptiveConfig, remaining) -> jax.Array:
    """[] int32: the index of this round's candidate (see the module docstring); remaining [B]
    as in `choose`. The posterior draw's key depends on the round number only, so the choice
    is a function of the state."""
    widths, last = config.widths, len(config.widths) - 1
    key = jax.random.fold_in(ad.key, ad.round) if config.thompson else None
    args = (remaining, ad.costs, widths, config.groups, config.objective)
    explore = jnp.where(ad.round == 0, config.first_optimism, config.explore)
    index = choose(acceptance_estimate(ad, config, key, optimism=explore), *args)
    if widths[0] == 0:
        # Switch the draft off only when an optimistic estimate agrees, and probe it when off.
        hopeful = choose(acceptance_estimate(ad, config, optimism=config.optimism), *args)
        probe_cost = ad.costs[1] - ad.costs[0] + config.switch_cost * ad.costs[0]
        probe_every = jnp.maximum(jnp.ceil(probe_cost / (config.probe_budget * ad.costs[0])), 1)
        index = jnp.where((index == 0) & ((hopeful != 0) | (ad.plain_run >= probe_every)), 1, index)
    if config.start_at_max:
        index = jnp.where(ad.round == 0, last, index)
    return index.astype(jnp.int32)


def fold_round(ad: AdaptiveState, config: AdaptiveConfig, c, num_accepted, live) -> AdaptiveState:
    """The state after a round of candidate c (an int, or a traced index) that accepted
    num_accepted [B] drafts in the live [B] rows. A round that drafts forgets at every
    position of its estimate and counts the positions it reached; a plain step brings no
    evidence and forgets nothing."""
    width, group = jnp.asarray(config.widths)[c], jnp.asarray(config.groups)[c]
    i = jnp.arange(1, ad.hits.shape[2] + 1)[None, :]  # draft positions 1..W
    tried = (i <= width) & (num_accepted[:, None] >= i - 1) & live[:, None]  # [B, W]
    hit = (i <= num_accepted[:, None]) & live[:, None]
    mine = (jnp.arange(ad.hits.shape[0]) == group)[:, None, None] & live[None, :, None] & (width > 0)  # [G, B, 1]
    mean = acceptance_estimate(ad, config)[group, :, 0]  # [B]
    r = jnp.minimum(ad.round, ad.chosen.shape[0] - 1)
    return ad.replace(
        hits=jnp.where(mine, config.decay * ad.hits + hit[None], ad.hits),
        tries=jnp.where(mine, config.decay * ad.tries + tried[None], ad.tries),
        tried_at=ad.tried_at + tried.astype(jnp.int32),
        drafted=ad.drafted + jnp.asarray(config.drafted)[c] * live.astype(jnp.int32),
        rounds_per_k=ad.rounds_per_k.at[c].add(1),
        chosen=ad.chosen.at[r].set(c),
        estimate=ad.estimate.at[r].set(jnp.sum(mean * live) / jnp.maximum(jnp.sum(live), 1)),
        round=ad.round + 1,
        plain_run=jnp.where(width == 0, ad.plain_run + 1, 0).astype(ad.plain_run.dtype),
    )
