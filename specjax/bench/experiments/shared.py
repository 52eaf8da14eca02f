"""What the experiments share: the `Experiment` record each module exports, a drafting
`Method` (E8's and E12's `drafters:`), the cost-model
prediction and the overhead split of E3-E5, and the setting line under every figure.

"measured" always means timed or counted in this run; "predicted" always means the cost
model (measured forward costs x measured acceptance), and is labelled so.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specjax.bench.cost_model import batch_tokens_per_round, draft_seconds, predicted_speedup, round_seconds
from specjax.bench.drafter_spec import Raw, parse_draft
from specjax.bench.measure import POOLED

if TYPE_CHECKING:
    from specjax.bench.context import BenchContext


@dataclasses.dataclass(frozen=True)
class Method:
    """One drafting method of E8 or E12 (`drafters:`): a label and a draft spec (None: the
    bench's `draft`)."""

    name: str
    draft: str | Raw | None = None  # a SpeculativeConfig (bench/drafter_spec.py); None: the bench's draft

    def __post_init__(self):
        if self.draft is not None:
            object.__setattr__(self, "draft", parse_draft(self.draft, f"drafters[name={self.name}].draft"))


def _no_ks(section) -> list[int]:
    return []


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One experiment of `specjax bench`, as its module exports it (`EXPERIMENT = Experiment(...)`).

    `run(ctx)` returns {"claim", "rows", "summary", ...}: rows become the experiment's CSV
    (<id>_<name>.csv) and `plot(result, path, title)` draws its PNG (<id>_<name>.png);
    `setting(ctx)` says what its figure was measured at (see `setting` below).
    """

    id: str  # "E3": its number in results.json, summary.md and the file names (e3_k_sweep.png)
    name: str  # "k_sweep": its config section (BenchConfig.k_sweep), `experiments:` entry and results key
    section: type  # the config section: a frozen dataclass whose defaults are the section's defaults
    run: Callable[[BenchContext], dict]
    plot: Callable[[dict, Path, str], Path]
    columns: tuple[str, ...]  # what summary.md shows of its rows
    setting: Callable[[BenchContext], dict]
    # The K values it runs at that count toward BenchConfig.max_k: the K the acceptance
    # profile is measured at (once, for every experiment) and the cost model's context.
    ks: Callable[[Any], Iterable[int]] = _no_ks

    def __post_init__(self):
        if not re.fullmatch(r"E[1-9]\d*", self.id) or not self.name.isidentifier():
            raise ValueError(f"an experiment needs an id like 'E12' and a name like 'k_sweep', got {self!r}")
        if not dataclasses.is_dataclass(self.section):
            raise ValueError(f"experiment {self.id}: its section must be a dataclass, got {self.section!r}")
        object.__setattr__(self, "columns", tuple(self.columns))

    @property
    def number(self) -> int:
        return int(self.id[1:])


def check_ks(ks: Iterable[int]) -> None:
    """Every K of a section must be >= 1 (the message every section shares)."""
    ks = list(ks)
    if any(k < 1 for k in ks):
        raise ValueError(f"every num_speculative_tokens (K) must be >= 1, got {min(ks)}")


def check_sizes(sizes: Iterable[int]) -> None:
    """Batch sizes (and E2's verify widths) must be >= 1."""
    if any(b < 1 for b in sizes):
        raise ValueError("batch sizes and verify widths must be >= 1")


def cost_prediction(
    ctx: BenchContext, k: int, batch: int, temperature: float, target, draft, context: int, category: str = POOLED
) -> dict:
    """Cost-model prediction from the costs of (target, draft) and the acceptance of `category`."""
    components = round_seconds(ctx.costs, target, draft, batch, k, context)
    # Per row and round, with the batch's stragglers and the cut last round counted.
    tokens = batch_tokens_per_round(ctx.profile(temperature, category), k, ctx.config.max_new_tokens, batch)
    costs = {
        f"cost_{name}": v for name, v in components.items() if name not in ("draft_share", "draft_share_definition")
    }
    return {
        "predicted_tokens_per_round": tokens,
        "predicted_speedup": predicted_speedup(tokens, components),
        "draft_time_share": components["draft_share"],
        "draft_time_share_definition": components["draft_share_definition"],
        **costs,
    }


def add_overhead(ctx: BenchContext, row: dict, target, draft) -> None:
    """Split a loop iteration into its forwards (or proposal) and everything else.

    non_forward_ms_per_iteration is what an iteration spends outside its forwards: sampling,
    acceptance, commit and dispatch. It is the iteration *timed in isolation* (cost_model's
    iteration_seconds: a plain step, or a round of K, on a half-full cache) minus its forwards
    timed in isolation on the same cache. It used to be the end-to-end ms_per_iteration minus
    forwards timed on a full cache: two measurements of different work (an end-to-end step
    reads a cache filling up from the prompt, a full cache costs every forward more), so for
    plain decoding, one forward plus an argmax, it came out negative (-0.39 ms). A difference
    of two timings can still fall below zero by noise: it is then recorded as 0, with the
    difference measured beside it as `non_forward_noise_ms`.
    """
    batch, k = row["batch_size"], row["num_speculative_tokens"]
    fill = ctx.context // 2  # where iteration_seconds times an iteration (engine/timed_loops.py)
    if row["method"] == "plain":
        forwards = ctx.costs.seconds(target, batch, 1, ctx.context, fill)
        iteration = ctx.costs.iteration_seconds(target, None, batch, 0, ctx.context)
    else:
        c = round_seconds(ctx.costs, target, draft, batch, k, ctx.context, fill=fill)
        forwards, iteration = draft_seconds(c) + c["verify_forward_seconds"], c["round_seconds"]
    row["forward_ms_per_iteration"] = 1e3 * forwards
    outside = 1e3 * (iteration - forwards)
    row["non_forward_ms_per_iteration"] = max(outside, 0.0)
    if outside < 0:
        row["non_forward_noise_ms"] = outside


# --- The setting line under every figure ----------------------------------------------------

COUNTED = "acceptance counted, not timed"
ONE_BATCH = (None, "each prompt category in one batch")  # (batch_size, text) of the counted experiments


def _listed(values) -> str:
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def one_or_swept(name: str, values, sep: str = " ") -> tuple[object, str]:
    """(value or list, text): "temperature 0" for one value, "temperature swept: 0, 1" for several."""
    values = list(dict.fromkeys(values))
    if len(values) == 1:
        return values[0], f"{name}{sep}{_listed(values)}"
    return values, f"{name} swept: {_listed(values)}"


def timed_text(ctx: BenchContext) -> str:
    return f"medians of {ctx.config.timing.repeats} timed repeats (error bars: min-max)"


def costs_text(ctx: BenchContext) -> str:
    timing = ctx.config.timing
    return f"cost timings: medians of {timing.repeats} repeats of {timing.cost_inner} iterations"


def setting(
    ctx: BenchContext,
    batch: tuple[object, str],
    temperature: tuple[object, str],
    extra: list[str],
    *,
    counted: bool = False,
    prompts: bool = True,
    new_tokens: int | None = None,
) -> dict:
    """What an experiment's figure was measured at: batch size, temperature and prompt count
    (a list where the experiment sweeps it), the timed repeats, and the same as one line of
    text that every plot and summary.md show. `batch` and `temperature` are (value, text)
    pairs (`one_or_swept`); `counted`: acceptance counted, not timed (no repeats); `prompts`:
    False where no prompts are run (forwards alone); `new_tokens`: when not max_new_tokens."""
    c = ctx.config
    count = len(ctx.workload.prompts) if prompts else None
    new_tokens = new_tokens or c.max_new_tokens
    out: dict = {"prompts": count, "repeats": None if counted else c.timing.repeats}
    parts = [batch[1], temperature[1]]
    if count is not None:
        parts.append(f"{count} prompts, {new_tokens} new tokens each")
    out.update(batch_size=batch[0], temperature=temperature[0], max_new_tokens=new_tokens)
    out["text"] = "; ".join([*parts, *extra])
    return out
