"""What every experiment of one bench run shares: models, drafters, prompts, costs, acceptance.

Costs and acceptance profiles are memoised, so E3 and E4 reuse the forward timings and
the acceptance that E1 measured, and each number in results.json is measured once.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
from tqdm.auto import tqdm

from specjax.bench.cost_model import CostTable, forward_estimate
from specjax.bench.finished_parts import FinishedParts
from specjax.bench.measure import DRAFT, POOLED, RunSpec, Workload, acceptance, adaptive_specs_for, measure
from specjax.bench.prompt_sets import load_prompts
from specjax.bench.timing import matmul_flops, memory_bandwidth, repeat_values
from specjax.config import SpeculativeConfig
from specjax.drafters import Drafter, as_drafter, make_drafter
from specjax.drafters.pair_placement import shard_pair
from specjax.engine.timed_loops import draft_model_of
from specjax.io.model import Model, init_model
from specjax.io.presets import resolve_model
from specjax.io.tokenizer import ByteTokenizer
from specjax.io.weight_formats import with_weights
from specjax.models import ModelConfig
from specjax.parallel.mesh import mesh_from

if TYPE_CHECKING:  # the config is built from the experiments' registry, whose modules import this one
    from specjax.bench.bench_config import BenchConfig, ModelSpec


def load_model(spec: ModelSpec, seed: int, weights: str = "float32") -> Model:
    """A named model, or random weights of the shape a ModelConfig mapping gives, in the
    weight format `weights` (specjax/io/weight_formats.py)."""
    if isinstance(spec, ModelConfig):
        model = init_model(spec, seed=seed)
        tokenizer = ByteTokenizer() if spec.vocab_size >= ByteTokenizer().vocab_size else None
        return with_weights(Model(model.config, model.params, tokenizer=tokenizer), weights)
    return with_weights(resolve_model(spec, seed=seed), weights)


def describe(model: Model, spec: ModelSpec | None) -> dict:
    name = spec if isinstance(spec, str) else "random weights" if spec else "Model object (Python API)"
    return {"name": name, "parameters": model.num_parameters, "dtype": model.config.dtype, "config": vars(model.config)}


def describe_drafter(drafter: Drafter, spec: SpeculativeConfig | None) -> dict:
    """A draft model as `describe` does; any other drafter by its kind and configuration."""
    model = draft_model_of(drafter)
    named = spec is not None and list(spec.drafter_arguments()) == ["model"] and spec.method in (None, "draft_model")
    if model is not None and (spec is None or named):  # a model name, shape or object
        return {**describe(model, None if spec is None else spec.model), "kind": drafter.name}
    weights = jax.tree.leaves(drafter.weights())
    return {
        "name": spec.describe() if spec is not None else f"{type(drafter).__name__} object (Python API)",
        "kind": drafter.name,
        "parameters": sum(int(w.size) for w in weights),  # its own weights (layer skip reads the target's)
        "drafter": repr(drafter.without_weights()),
    }


def with_repeats(rows: list[dict]) -> list[dict]:
    """Add each timed repetition's figures to measured rows, so plots can show the spread and
    a reader can check the medians: `tokens_per_second_repeats` (median = tokens_per_second)
    and `speedup_vs_plain_repeats`, each repetition's tokens/s over the median tokens/s of the
    plain baseline of the same batch, temperature and category (median = speedup_vs_plain;
    the plain row's own spread around 1 is the baseline's noise)."""
    for row in rows:
        row["tokens_per_second_repeats"] = repeat_values(row)
    plain = {(r["batch_size"], r["temperature"], r.get("category")): r for r in rows if r["method"] == "plain"}
    for row in rows:
        base = plain.get((row["batch_size"], row["temperature"], row.get("category")))
        if base is not None:
            row["speedup_vs_plain_repeats"] = [t / base["tokens_per_second"] for t in row["tokens_per_second_repeats"]]
    return rows


class BenchContext:
    def __init__(
        self, config: BenchConfig, target: Model | None = None, draft: Model | Drafter | None = None, progress=True
    ):
        self.config = config
        self.progress = progress
        self._given_target, self._given_draft = target is not None, draft is not None
        self._models: dict = {}  # name or ModelConfig -> Model: each model is loaded once
        self.target = target or load_model(config.target, config.seed, config.weights)
        self.draft = as_drafter(draft) if draft is not None else self.build_drafter(config.draft)
        if config.mesh is not None:  # every experiment sharded (specjax/parallel)
            self.target, self.draft = shard_pair(self.target, self.draft, mesh_from(config.mesh))
        self.cost_target = (
            self.target if config.cost_target is None else load_model(config.cost_target, config.seed, config.weights)
        )
        self.cost_draft = self.draft if config.cost_draft is None else as_drafter(self.load(config.cost_draft))
        if self.target.tokenizer is None:
            raise ValueError("the bench's target needs a tokenizer to encode its prompts")
        self.method_drafters = self._methods() if "methods" in config.experiments else {}
        for drafter in [self.draft, *self.method_drafters.values()]:  # fail now, not mid-run
            drafter.check(self.target.config, config.max_k)
        prompts = load_prompts(config.prompt_sources, self.target.tokenizer)
        self.workload = Workload(
            self.target, {DRAFT: self.draft}, prompts.tokens, prompts.categories, config.max_new_tokens, config.seed,
            constraint=config.constraint,
        )  # fmt: skip
        self.costs = CostTable(config.timing.cost_inner, config.timing.repeats)
        self._acceptance: dict[tuple, dict] = {}
        self._machine: dict | None = None
        self.parts = FinishedParts()  # run_bench keeps them in the results directory

    def load(self, spec: ModelSpec) -> Model:
        """A draft-side model, loaded once however many drafters use it."""
        if spec not in self._models:
            self._models[spec] = load_model(spec, self.config.seed + 1, self.config.weights)
        return self._models[spec]

    def build_drafter(self, spec: SpeculativeConfig) -> Drafter:
        # The target Model, not its config: a cross-tokenizer drafter (tli, uag) builds its tables
        # from the target's tokenizer, and a head is then checked against the target's weights
        # too (an int8 or bfloat16 target keeps its float32 source's fingerprint).
        return make_drafter(spec, self.load, self.target)

    def _methods(self) -> dict[str, Drafter]:
        """E8's drafters by label (a method without a spec uses the bench's `draft`)."""
        return {
            m.name: self.draft if m.draft is None else self.build_drafter(m.draft) for m in self.config.methods.drafters
        }

    @property
    def given_draft(self) -> bool:
        """The draft came as a Python object, not from the config."""
        return self._given_draft

    @property
    def categories(self) -> list[str]:
        """Categories rows are reported for: POOLED, then each category when there are several."""
        names = self.workload.category_names
        return [POOLED, *names] if len(names) > 1 else [POOLED]

    @property
    def separate_cost_models(self) -> bool:
        return self.cost_target is not self.target or self.cost_draft is not self.draft

    def cache_length(self, k: int) -> int:
        """Cache slots of the longest prompt's generation at K: the context costs are timed at."""
        spec = RunSpec("speculative", 1, k)
        return self.workload.prepare(spec, [max(self.workload.prompts, key=len)]).cache_length

    @functools.cached_property
    def context(self) -> int:
        """Cache slots of the pair's generations: the context the cost model times forwards at."""
        return self.cache_length(self.config.max_k)

    def acceptance(self, k: int, temperature: float, category: str = POOLED) -> dict:
        """Acceptance statistics of the bench's draft at K, of one category or pooled."""
        key = (k, temperature)
        if key not in self._acceptance:
            self._acceptance[key] = acceptance(self.workload, k, temperature)
        return self._acceptance[key][category]

    def profile(self, temperature: float, category: str = POOLED) -> list[float]:
        """Per-position acceptance a_1..a_Kmax, measured once at the largest K of the config."""
        return self.acceptance(self.config.max_k, temperature, category)["accepted_per_position"]

    def acceptance_profiles(self) -> dict[str, list[float]]:
        """The pooled per-position profiles measured so far (at the largest K), by temperature."""
        k_max = self.config.max_k
        return {
            f"temperature={t}": s[POOLED]["accepted_per_position"]
            for (k, t), s in self._acceptance.items()
            if k == k_max
        }

    @property
    def measured_machine(self) -> dict | None:
        """The roofline ceilings if an experiment needed them, else None (nothing is measured twice)."""
        return self._machine

    def machine(self) -> dict:
        """The roofline's two ceilings, measured on this device."""
        if self._machine is None:
            bandwidth = memory_bandwidth(self.config.bandwidth_megabytes)
            flops = matmul_flops(self.cost_target.config.dtype)
            self._machine = {
                "memory_bandwidth_bytes_per_second": bandwidth,
                "matmul_flops_per_second": flops,
                "matmul_dtype": self.cost_target.config.dtype,
                "machine_balance_flops_per_byte": flops / bandwidth,
            }
        return self._machine

    def roofline_seconds(self, model: Model, batch: int, width: int, context: int) -> float:
        """The least time a forward can take: bytes over bandwidth or FLOPs over peak."""
        estimate, machine = forward_estimate(model, batch, width, context), self.machine()
        return max(
            estimate["bytes_moved"] / machine["memory_bandwidth_bytes_per_second"],
            estimate["flops"] / machine["matmul_flops_per_second"],
        )

    def measure(self, specs: list[RunSpec], description: str, workload: Workload | None = None) -> list[dict]:
        """Timed rows of `specs` (and their plain baselines) on `workload` (default: the bench's)."""
        timing = self.config.timing
        if self.config.adaptive:  # `adaptive: true`: an adaptive twin of every configuration
            specs = list(dict.fromkeys([*specs, *adaptive_specs_for(specs)]))
        total = timing.repeats * len({*specs, *(s.plain for s in specs)})
        with tqdm(total=total, desc=description, disable=not self.progress, leave=False) as bar:
            workload = workload or self.workload
            rows = measure(workload, specs, timing.repeats, timing.warmup, timing.tpot_target_ms, bar)
        return with_repeats(rows)

    def models(self) -> dict:
        c = self.config
        given = {"target": self._given_target, "draft": self._given_draft}
        out = {
            "target": describe(self.target, None if given["target"] else c.target),
            "draft": describe_drafter(self.draft, None if given["draft"] else c.draft),
        }
        if self.separate_cost_models:
            out["cost_target"] = describe(self.cost_target, c.cost_target or c.target)
            cost_draft = c.draft if c.cost_draft is None else SpeculativeConfig(model=c.cost_draft)
            out["cost_draft"] = describe_drafter(self.cost_draft, cost_draft)
        return out
