"""The settings of confidence-scheduled verification (engine/verify_schedule.py runs it).

A config of the loop's, like SamplingConfig and CacheConfig: hashable (the jit key holds
it), with nothing to run, so that SpeculativeConfig (specjax/config.py) can check and parse
it without reaching up into the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np


@dataclasses.dataclass(frozen=True)
class VerifySchedule:
    """How `SpeculativeConfig(verify_schedule=...)` chooses the verify width each round.

    widths: the verify widths, 1 (verify no draft: a plain step after drafting) up to K + 1
      (verify them all); each is one compiled branch. None: 1, 2, 3, 5, 9, ... below K + 1,
      and K + 1.
    costs: {width: seconds of one round at that width} for this target, drafter, batch and
      context (part of the jit key: other costs compile anew). "measure": `prepare` times a
      round at each width for the call's shape (engine/verify_costs.py) once and keeps the
      result in the round-cost disk cache for later processes (engine/cost_cache.py). None:
      the fallback cost model 1 + width_cost * (w - 1), in units of a width-1 round
      (drafting K included).
    width_cost: the fallback's cost of one more verified slot, as a share of a width-1 round:
      about 0 on an accelerator at small batch (verifying is memory-bound), more where the
      verify forward is compute-bound (CPU, large batch).
    prior: the acceptance per position assumed before any round measured it.
    decay: how much of its past evidence the measured rate keeps each round (0 < decay < 1).
    probe_every: after this many rounds in a row at width 1 verify at the next width once,
      so that measured rates that fell to nothing can recover (0: never).
    lookahead: under sampling, choose from every position's confidence at once (as greedy
      does). Exact only when the drafter's confidence depends on no drafted token; with q
      (or a confidence that reads the drafts) it biases the output. False: bucket by bucket.
    chains: also run static chains. Before every round one arm is chosen from past rounds
      only: a static chain of K = w - 1 (each width w > 1: draft w - 1, verify them all) or
      the confidence arm (draft K, choose the round's width from its drafts, as above). The
      chain is the one that would finish the batch soonest (each row's acceptance per
      position in chain rounds and `chain_costs`: the slowest row decides); the confidence
      arm runs only where, on the widest chain's rounds (which draft what it drafts and
      verify everything), it would have committed more per second than every chain by
      `confidence_margin` (schedule_policy.choose_arm). Each arm is a while loop gated by
      the choice (no conditional: nothing is copied when the arm changes). Where the
      confidence does not pay, the rounds are the best static chain's as the measured rates
      and costs rank them. False: every round is the confidence arm's.
    confidence_margin: the confidence arm runs only if, on the same rounds, its tokens per
      second beat every chain's by this factor: its costs are timed one width at a time,
      without the choosing and the runs of widths, which cost it 4-13% more than the
      static chain of the same width (results/verify_schedule).
    chain_costs: {K: seconds of one chain round of K} (a chain of K drafts only K, so it
      costs less than the confidence arm's round at width K + 1). None: the width costs
      (`costs`, or the fallback) at K + 1. `costs="measure"` measures these too.
    acceptance: the acceptance per draft position measured before this call, for i = 1..
      P(draft i accepted | drafts < i were): e.g. an earlier run's
      `stats.accepted_per_position` for the same pair and sampling. The schedule starts from
      it, worth `acceptance_rounds` rounds of evidence, instead of from no evidence (where a
      64-token generation at batch 1, sampled, spent 10-20% of its rounds on chains that lose,
      results/verify_schedule section 8). Positions past its end take
      its last value, extra ones are ignored. Evidence from before the call, so the choice
      stays a function of past rounds and exactness holds. None: no evidence (the widest chain
      runs first).
    acceptance_rounds: how many rounds of evidence `acceptance` counts as (> 0); it fades
      with `decay` as the call's own rounds arrive. 16: at batch 1, sampled, 4 still let a
      few unlucky verdicts move a row off the best chain (1.028 of the best static K against
      1.010 with 16, section 8); at batch 16 the rows' own evidence outweighs either.
    """

    widths: tuple[int, ...] | None = None
    costs: tuple[tuple[int, float], ...] | str | None = None
    width_cost: float = 0.1
    prior: float = 0.5
    decay: float = 0.9
    probe_every: int = 16
    lookahead: bool = False
    chains: bool = True
    confidence_margin: float = 1.1
    chain_costs: tuple[tuple[int, float], ...] | None = None
    acceptance: tuple[float, ...] | None = None
    acceptance_rounds: float = 16.0

    def __post_init__(self):
        if self.widths is not None:
            if isinstance(self.widths, int | str) or not all(isinstance(w, int | np.integer) for w in self.widths):
                raise ValueError(f"verify_schedule widths must be a list of integers >= 1, got {self.widths!r}")
            widths = tuple(sorted(int(w) for w in self.widths))
            if not widths or widths[0] < 1 or len(set(widths)) != len(widths):
                raise ValueError(f"verify_schedule widths must be distinct integers >= 1, got {self.widths!r}")
            object.__setattr__(self, "widths", widths)
        if self.costs is not None and not self.measures_costs:
            if isinstance(self.costs, str):
                raise ValueError(
                    f"verify_schedule costs is a mapping of widths to seconds or 'measure', got {self.costs!r}"
                )
            object.__setattr__(self, "costs", _cost_pairs(self.costs, "costs", "widths"))
        if not self.width_cost >= 0:
            raise ValueError(f"verify_schedule width_cost must be >= 0, got {self.width_cost}")
        if not 0.0 < self.prior < 1.0:
            raise ValueError(f"verify_schedule prior must lie in (0, 1), got {self.prior}")
        if not 0.0 < self.decay < 1.0:
            raise ValueError(f"verify_schedule decay must lie in (0, 1), got {self.decay}")
        if not isinstance(self.probe_every, int) or self.probe_every < 0:
            raise ValueError(f"verify_schedule probe_every must be an integer >= 0, got {self.probe_every!r}")
        if not isinstance(self.lookahead, bool):
            raise ValueError(f"verify_schedule lookahead is true or false, got {self.lookahead!r}")
        if not isinstance(self.chains, bool):
            raise ValueError(f"verify_schedule chains is true or false, got {self.chains!r}")
        if not self.confidence_margin > 0:
            raise ValueError(f"verify_schedule confidence_margin must be > 0, got {self.confidence_margin}")
        if self.chain_costs is not None:
            object.__setattr__(self, "chain_costs", _cost_pairs(self.chain_costs, "chain_costs", "Ks"))
        if self.acceptance is not None:
            object.__setattr__(self, "acceptance", _probabilities(self.acceptance))
        if not self.acceptance_rounds > 0:
            raise ValueError(f"verify_schedule acceptance_rounds must be > 0, got {self.acceptance_rounds}")

    def resolved(self, k_max: int) -> VerifySchedule:
        """This schedule with its widths fixed for K_MAX drafts (checked, costs for each)."""
        widths = self.widths if self.widths is not None else default_widths(k_max)
        if widths[-1] > k_max + 1:
            raise ValueError(
                f"verify_schedule widths {widths} exceed num_speculative_tokens + 1 = {k_max + 1} "
                "(a round verifies at most its K drafts)"
            )
        if len(widths) < 2:
            raise ValueError(f"verify_schedule needs at least two widths to choose from, got {widths}")
        if self.costs is not None and not self.measures_costs:
            given = dict(self.costs)
            missing = [w for w in widths if w not in given]
            if missing:
                raise ValueError(f"verify_schedule costs lack widths {missing} (have {sorted(given)})")
        resolved = dataclasses.replace(self, widths=widths)
        if self.chains and self.chain_costs is not None:
            given = dict(self.chain_costs)
            missing = [k for k in resolved.chain_ks if k not in given]
            if missing:
                raise ValueError(f"verify_schedule chain_costs lack K = {missing} (have {sorted(given)})")
        return resolved

    @property
    def chain_ks(self) -> tuple[int, ...]:
        """The static chains' K (one per width w > 1: K = w - 1); () with chains off."""
        return tuple(w - 1 for w in self.widths if w > 1) if self.chains else ()

    @property
    def measures_costs(self) -> bool:
        """costs="measure": `prepare` replaces it with the measured costs before the loop runs."""
        return self.costs == "measure"

    def acceptance_vector(self, k: int) -> np.ndarray | None:
        """[k] float32: `acceptance` cut or extended (by its last value) to k positions, or None."""
        if self.acceptance is None:
            return None
        rates = list(self.acceptance[:k]) + [self.acceptance[-1]] * max(0, k - len(self.acceptance))
        return np.asarray(rates, np.float32)

    def cost_vector(self) -> np.ndarray:
        """[n] float32 seconds (or fallback units) of a round at each width, in order."""
        if self.measures_costs:
            raise ValueError('verify_schedule costs="measure" must be measured before the loop (specjax.prepare does)')
        if self.costs is None:
            return np.asarray([1.0 + self.width_cost * (w - 1) for w in self.widths], np.float32)
        given = dict(self.costs)
        return np.asarray([given[w] for w in self.widths], np.float32)

    def chain_cost_vector(self) -> np.ndarray:
        """[len(chain_ks)] float32 seconds (or fallback units) of a chain round of each K."""
        if self.chain_costs is not None:
            given = dict(self.chain_costs)
            return np.asarray([given[k] for k in self.chain_ks], np.float32)
        width_costs = dict(zip(self.widths, self.cost_vector(), strict=True))
        return np.asarray([width_costs[k + 1] for k in self.chain_ks], np.float32)


def _cost_pairs(costs, name: str, keys: str) -> tuple[tuple[int, float], ...]:
    """{width or K: seconds} (keys may be strings, from YAML/JSON) as sorted hashable pairs."""
    items = costs.items() if isinstance(costs, Mapping) else costs
    try:
        pairs = tuple(sorted((int(w), float(c)) for w, c in items))
    except (TypeError, ValueError):
        raise ValueError(f"verify_schedule {name} must map {keys} to seconds, got {costs!r}") from None
    if not all(c > 0 for _, c in pairs):
        raise ValueError(f"verify_schedule {name} must be positive seconds, got {costs!r}")
    return pairs


def _probabilities(value) -> tuple[float, ...]:
    """`acceptance` as a hashable tuple of probabilities, or a ValueError naming what is wrong."""
    if isinstance(value, str | bytes | Mapping) or not hasattr(value, "__iter__"):
        raise ValueError(f"verify_schedule acceptance must be a list of probabilities, got {value!r}")
    try:
        rates = tuple(float(x) for x in value)
    except (TypeError, ValueError):
        raise ValueError(f"verify_schedule acceptance must be a list of probabilities, got {value!r}") from None
    if not rates or not all(0.0 <= x <= 1.0 for x in rates):
        raise ValueError(f"verify_schedule acceptance must be probabilities in [0, 1], one per position, got {value!r}")
    return rates


def default_widths(k_max: int) -> tuple[int, ...]:
    return tuple(sorted({w for w in (1, 2, 3, 5, 9, 17, 33) if w < k_max + 1} | {k_max + 1}))


def as_verify_schedule(value) -> VerifySchedule | None:
    """SpeculativeConfig.verify_schedule (None/False, True, a VerifySchedule or a mapping of its
    fields from YAML/JSON) as a VerifySchedule, or None when it is off."""
    if value is None or value is False:
        return None
    if value is True:
        return VerifySchedule()
    if isinstance(value, Mapping):
        fields = {f.name for f in dataclasses.fields(VerifySchedule)}
        unknown = sorted(set(value) - fields)
        if unknown:
            raise ValueError(f"verify_schedule: unknown keys {unknown}; valid keys: {', '.join(sorted(fields))}")
        return VerifySchedule(**value)
    if not isinstance(value, VerifySchedule):
        raise ValueError(f"verify_schedule must be True, False, a specjax.VerifySchedule or a mapping, got {value!r}")
    return value
