"""Seconds of one confidence-scheduled round at each verify width, for `VerifySchedule(costs=...)`.

A scheduled round drafts K and verifies w - 1 of the drafts, so its cost is neither a plain
step's nor a chain round of w - 1's (adaptive K's costs, engine/round_costs.py): it is
timed here as it runs, a schedule of the one width w inside the generation loop
(engine/timed_loops.py's `_rounds`, rewound after every round), at two loop lengths,
round-robin across widths, and the slope taken, exactly as round_costs.py times adaptive
K's candidates. A static chain of K, which the schedule may run instead (its `chains`),
is the same one-width round drafting K and verifying all K. Nothing the loop runs imports
this module.

    costs, chain_costs = measure_schedule_costs(target, draft, batch=1, k=4, context=256, ks=(1, 2, 4))
    speculative = SpeculativeConfig(num_speculative_tokens=4,
                                    verify_schedule=VerifySchedule(costs=costs, chain_costs=chain_costs))
"""

from __future__ import annotations

import dataclasses

import jax

from specjax.core.loop import DEFAULT_CACHE, CacheConfig
from specjax.core.sampling import SamplingConfig
from specjax.core.state import Plan
from specjax.core.verify_widths import VerifySchedule
from specjax.drafters import Drafter, as_drafter
from specjax.engine.clock import interleaved, median
from specjax.engine.plan import default_rule_for
from specjax.engine.round_costs import LONG, REPEATS, SHORT
from specjax.engine.timed_loops import _rounds, filled_state
from specjax.io.model import Model


def measure_schedule_costs(
    target: Model,
    draft: Model | Drafter,
    batch: int,
    k: int,
    context: int,
    widths: tuple[int, ...] | None = None,
    ks: tuple[int, ...] = (),
    sampling: SamplingConfig | float = 0.0,
    repeats: int = REPEATS,
    cache: CacheConfig = DEFAULT_CACHE,
) -> tuple[dict[int, float], dict[int, float]]:
    """({width: marginal seconds of one scheduled round of K = k drafts}, {K: seconds of one
    chain round of K} for K in ks) for `batch` rows and a cache of `context` slots half
    filled (widths None: VerifySchedule's default for k), timed in one round-robin, and the
    round both share (a width of k + 1 is a chain of k: drafting k, verifying all) timed once.
    The schedule compares the two (schedule_policy.choose_arm); timed in two sessions they
    drifted apart by more than its margin (results/verify_schedule section 6: the same
    width-5 round at 13.5 ms as a width and 15.6 ms as a chain of 4)."""
    widths = VerifySchedule(widths=widths).resolved(k).widths
    shapes = sorted({(k, w) for w in widths} | {(j, j + 1) for j in ks})
    seconds = _measure(target, draft, batch, {shape: shape for shape in shapes}, context, sampling, repeats, cache)
    return {w: seconds[(k, w)] for w in widths}, {j: seconds[(j, j + 1)] for j in ks}


def _measure(target, draft, batch, shapes: dict, context, sampling, repeats, cache) -> dict:
    """{label: marginal seconds of one round} for shapes {label: (K drafted, verify width)}."""
    if not isinstance(sampling, SamplingConfig):
        sampling = SamplingConfig(temperature=float(sampling))
    drafter = as_drafter(draft)
    weights = drafter.weights()
    context = max(context, 2 * (max(k for k, _ in shapes.values()) + 2))
    fill = context // 2
    calls = {}
    for label, (k, w) in shapes.items():
        plan = Plan(
            target=target.config,
            drafter=drafter.without_weights(),
            num_speculative_tokens=k,
            sampling=sampling,
            rule=default_rule_for(sampling, tree_rounds=False),
            cache=cache,
            # One width: the switch has one branch, so the round is exactly a round at w.
            verify_schedule=dataclasses.replace(VerifySchedule(), widths=(w,)),
        )
        for n in (SHORT, LONG):
            calls[(label, n)] = _timed(target, weights, plan, batch, fill, context, n)
            jax.block_until_ready(calls[(label, n)]())  # the warm-up that compiles
    times = interleaved(calls, repeats, warmup=0)
    out = {}
    for label in shapes:
        short, long = median(times[(label, SHORT)]), median(times[(label, LONG)])
        out[label] = max((long - short) / (LONG - SHORT), 0.25 * long / LONG)  # round_costs.py's floor
    return out


def _timed(target: Model, weights, plan: Plan, batch: int, fill: int, context: int, inner: int):
    """A callable running `inner` scheduled rounds on a state of `fill` committed tokens."""
    state = filled_state(target, weights, plan, fill, batch, context)

    def call():
        nonlocal state
        state = _rounds(target.params, weights, state, inner)
        return state.tokens

    return call
