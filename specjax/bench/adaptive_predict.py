"""E11's predictions: the adaptive policy and static K, simulated on measured round costs.

Batch sizes this machine cannot run end to end (or a cost model it cannot run at all, such
as the GPU config's 0.9B target) are predicted by running the *real* policy
(engine/adaptive_policy.py: `policy`, `fold_round`) on simulated rounds:
  - each row accepts draft position i with the pair's measured conditional acceptance a_i
    (the pooled per-position profile: rows are alike, so stragglers come from chance only);
  - a round of candidate c costs the cost model's measured seconds at c (engine/round_costs.py,
    the same marginal costs the engine's policy reads), a change of candidate another
    switch_cost / 2 plain steps (the branch switch measured on the CPU);
  - the batch runs until every row has max_new_tokens, as the real loop does.
Static K is the same simulation with the choice fixed, and plain decoding is
max_new_tokens plain steps. Everything is averaged over `samples` simulated batches.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.engine.adaptive_policy import AdaptiveConfig, fold_round, init_adaptive, policy


@functools.partial(jax.jit, static_argnames=("config", "batch", "fixed", "max_rounds"))
def _simulate(config: AdaptiveConfig, costs, alpha, key, batch: int, max_new_tokens, fixed, max_rounds: int):
    """(seconds, rounds, rounds per candidate [n]) of one simulated batch; alpha [W]."""
    width_max = alpha.shape[0]
    widths = jnp.asarray(config.widths)
    position = jnp.arange(1, width_max + 1)[None, :]  # [1, W]

    def cond_fn(carry):
        _, remaining, *_ = carry
        return jnp.any(remaining > 0)

    def body_fn(carry):
        ad, remaining, seconds, previous, key = carry
        c = policy(ad, config, remaining) if fixed is None else jnp.int32(fixed)
        key, draw = jax.random.split(key)
        accepted = (jax.random.uniform(draw, (batch, width_max)) < alpha) & (position <= widths[c])  # [B, W]
        num_accepted = jnp.sum(jnp.cumprod(accepted, axis=1), axis=1)  # [B]: the accepted prefix
        live = remaining > 0
        switch = jnp.where((previous >= 0) & (previous != c), 0.5 * config.switch_cost * costs[0], 0.0)
        return (
            fold_round(ad, config, c, num_accepted, live),
            jnp.where(live, jnp.maximum(remaining - num_accepted - 1, 0), 0),
            seconds + costs[c] + switch,
            c,
            key,
        )

    ad = init_adaptive(costs, batch, width_max, max_rounds)
    remaining = jnp.full((batch,), max_new_tokens, jnp.float32)
    init = (ad, remaining, jnp.float32(0.0), jnp.int32(-1), key)
    ad, _, seconds, _, _ = jax.lax.while_loop(cond_fn, body_fn, init)
    return seconds, ad.round, ad.rounds_per_k


def simulate(
    config: AdaptiveConfig,
    costs: dict,
    per_position: list[float],
    batch: int,
    max_new_tokens: int,
    fixed=None,
    samples: int = 8,
    seed: int = 0,
) -> dict:
    """Mean seconds and rounds of `samples` simulated batches of `batch` rows, each generating
    max_new_tokens, under `config` (resolved, chains only) with `costs` {label: seconds}.
    `fixed`: a candidate label that every round uses (static K), or None (the policy)."""
    if config.trees:
        raise ValueError("the E11 prediction simulates chains only, not AdaptiveConfig(trees=...)")
    width_max = max(config.widths)
    if len(per_position) < width_max:
        raise ValueError(f"an acceptance profile of {len(per_position)} positions cannot predict K = {width_max}")
    alpha = jnp.asarray(per_position[:width_max], jnp.float32)
    vector = jnp.asarray(config.cost_vector(costs))
    index = None if fixed is None else config.labels.index(fixed)
    runs = [
        _simulate(config, vector, alpha, jax.random.key(seed + s), batch, max_new_tokens, index, max_new_tokens)
        for s in range(samples)
    ]
    seconds, rounds, per_k = (np.asarray(jax.device_get(x)) for x in zip(*runs, strict=True))
    return {
        "seconds": float(np.mean(seconds)),
        "rounds": float(np.mean(rounds)),
        "rounds_per_k": {k: float(n) for k, n in zip(config.labels, per_k.mean(axis=0), strict=True)},
    }


def predict(
    config: AdaptiveConfig, costs: dict, per_position: list[float], batch: int, max_new_tokens: int, static_ks
) -> dict:
    """Predicted speedups over plain decoding of every static K of `static_ks` and of the
    adaptive policy at one batch size, and adaptive / max(plain, best static K)."""
    plain = costs[0] * max_new_tokens
    static = {}
    for k in static_ks:
        fixed = AdaptiveConfig(ks=(0, k), switch_cost=config.switch_cost).resolved(k)
        static[k] = plain / simulate(fixed, costs, per_position, batch, max_new_tokens, fixed=k)["seconds"]
    adaptive = simulate(config, costs, per_position, batch, max_new_tokens)
    speedup = plain / adaptive["seconds"]
    best_k = max(static, key=static.get)
    return {
        "batch_size": batch,
        "predicted_static_speedups": static,
        "predicted_adaptive_speedup": speedup,
        "predicted_adaptive_rounds_per_k": adaptive["rounds_per_k"],
        "best_static_k": best_k,
        "adaptive_vs_best": speedup / max(1.0, static[best_k]),
        "costs_seconds": {str(k): v for k, v in costs.items()},
    }
