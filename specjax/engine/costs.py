"""Adaptive speculation's round costs, and a verify schedule's, for one call, resolved before
the loop runs.

The policy (engine/adaptive_policy.py) needs the seconds of one loop iteration at each
candidate K. They are an input to the compiled loop, never something it finds out: `prepare`
resolves them here, from AdaptiveConfig.costs when the caller gave them, else from the disk
cache (engine/cost_cache.py), else by timing the loop's own rounds (engine/round_costs.py,
engine/timed_loops.py), and the prepared call carries the result, a RoundCosts, with where
it came from. This module sits above the loop it times (generation.py): nothing the loop
imports reaches it, so timing the loop closes no import cycle.
"""

from __future__ import annotations

import dataclasses
import types

from specjax.config import SpeculativeConfig
from specjax.core.state import Plan
from specjax.drafters import Drafter
from specjax.engine.adaptive_policy import RoundCosts
from specjax.engine.cost_cache import cached_costs, cost_key
from specjax.engine.plan import as_adaptive
from specjax.engine.prompts import PromptBatch
from specjax.engine.round_costs import measure_round_costs
from specjax.engine.verify_costs import measure_schedule_costs
from specjax.io.model import Model


def resolve_costs(
    target: Model, drafter: Drafter | None, speculative: SpeculativeConfig | None, plan: Plan, batch: PromptBatch
) -> RoundCosts | None:
    """The costs of `plan`'s adaptive candidates (None when the plan is not adaptive).

    speculative: the call's SpeculativeConfig, whose `adaptive` as the caller gave it says
    how to get them (`costs`, `remeasure`, `progress`; the plan holds only the static
    part, engine/plan.py). Costs not given
    are read from the disk cache or measured once per shape, at the batch's bucket size and
    cache length, with the plan's whole SamplingConfig and cache layout."""
    if plan.adaptive is None:
        return None
    config, static = as_adaptive(speculative.adaptive), plan.adaptive
    if config.costs is not None:
        return RoundCosts.of(static, config.costs, "given")
    shape = (batch.bucket_rows, static, batch.cache_length, plan.sampling)
    key = cost_key(target, drafter, *shape, plan.cache)

    def measure() -> dict:
        return measure_round_costs(
            target, drafter, *shape, cache=plan.cache, progress=config.progress, remeasure=config.remeasure
        )

    costs, where = cached_costs(key, static.labels, measure, remeasure=config.remeasure)
    return RoundCosts.of(
        static,
        costs,
        where["source"],
        spent=where["seconds"],
        path=where["path"],
        measured_at=where["measured_at"],
        measurement_seconds=where["measurement_seconds"],
    )


def resolve_verify_costs(target: Model, drafter: Drafter | None, plan: Plan, batch: PromptBatch) -> Plan:
    """`plan` with a verify schedule's costs="measure" replaced by the seconds of one round at
    each of its widths, and of a chain round of each of its chains' K, measured at the
    batch's bucket size and cache length (or read from the disk cache, keyed as adaptive
    K's costs are). Costs are part of the jit key, so the loop compiles for the measured
    values; any other plan comes back unchanged."""
    schedule = plan.verify_schedule
    if schedule is None or not schedule.measures_costs:
        return plan
    k, widths, ks = plan.num_speculative_tokens, schedule.widths, schedule.chain_ks
    labels = [f"verify width {w} of K={k}" for w in widths] + [f"chain of K={j}" for j in ks]
    candidates = types.SimpleNamespace(labels=labels, trees=None)
    key = cost_key(target, drafter, batch.bucket_rows, candidates, batch.cache_length, plan.sampling, plan.cache)
    shape = (batch.bucket_rows, batch.cache_length)

    def measure() -> dict:
        seconds, chains = measure_schedule_costs(
            target, drafter, shape[0], k, shape[1], widths, ks, plan.sampling, cache=plan.cache
        )
        return dict(zip(labels, [seconds[w] for w in widths] + [chains[j] for j in ks], strict=True))

    costs, _ = cached_costs(key, labels, measure)
    measured = tuple((w, float(costs[label])) for label, w in zip(labels[: len(widths)], widths, strict=True))
    chained = tuple((j, float(costs[label])) for label, j in zip(labels[len(widths) :], ks, strict=True))
    return dataclasses.replace(
        plan, verify_schedule=dataclasses.replace(schedule, costs=measured, chain_costs=chained or None)
    )
