"""What every experiment of one bench run shares: models, prompts, costs, acceptance.

Costs and acceptance profiles are memoised, so E3 and E4 reuse the forward timings and
the acceptance that E1 measured, and each number in results.json is measured once.
"""

from __future__ import annotations

import functools

from specjax.models import ModelConfig
from tqdm.auto import tqdm

from specjax.bench.config import BenchConfig, ModelSpec
from specjax.bench.cost import CostTable, forward_estimate
from specjax.bench.measure import RunSpec, Workload, acceptance, measure
from specjax.bench.timing import matmul_flops, memory_bandwidth
from specjax.io.model import Model, init_model
from specjax.io.presets import resolve_model
from specjax.io.tokenizer import ByteTokenizer
from specjax.training.data import held_out_prompts


def load_model(spec: ModelSpec, seed: int) -> Model:
    """A named model, or random weights of the shape a ModelConfig mapping gives."""
    if isinstance(spec, ModelConfig):
        model = init_model(spec, seed=seed)
        tokenizer = ByteTokenizer() if spec.vocab_size >= ByteTokenizer().vocab_size else None
        return Model(model.config, model.params, tokenizer=tokenizer)
    return resolve_model(spec, seed=seed)


def describe(model: Model, spec: ModelSpec | None) -> dict:
    name = spec if isinstance(spec, str) else "random weights" if spec else "Model object (Python API)"
    return {"name": name, "parameters": model.num_parameters, "dtype": model.config.dtype, "config": vars(model.config)}


class BenchContext:
    def __init__(self, config: BenchConfig, target: Model | None = None, draft: Model | None = None, progress=True):
        self.config = config
        self.progress = progress
        self._given_target, self._given_draft = target is not None, draft is not None
        self.target = target or load_model(config.target, config.seed)
        self.draft = draft or load_model(config.draft, config.seed + 1)
        self.cost_target = self.target if config.cost_target is None else load_model(config.cost_target, config.seed)
        self.cost_draft = self.draft if config.cost_draft is None else load_model(config.cost_draft, config.seed + 1)
        if self.target.tokenizer is None:
            raise ValueError("the bench's target needs a tokenizer to encode its held-out prompts")
        p = config.prompts
        encoded = [
            self.target.tokenizer.encode(text) for text in held_out_prompts(p.domain, p.count, p.prompt_bytes, p.split)
        ]
        shortest = min(len(ids) for ids in encoded)  # one length, so one compiled program per spec
        self.workload = Workload(
            self.target, self.draft, [ids[:shortest] for ids in encoded], config.max_new_tokens, config.seed
        )
        self.costs = CostTable(config.timing.cost_inner, config.timing.repeats)
        self._acceptance: dict[tuple, dict] = {}
        self._machine: dict | None = None

    @property
    def separate_cost_models(self) -> bool:
        return self.cost_target is not self.target or self.cost_draft is not self.draft

    @functools.cached_property
    def context(self) -> int:
        """Cache slots of the pair's generations: the context the cost model times forwards at."""
        spec = RunSpec("speculative", 1, self.config.max_k)
        return self.workload.prepare(spec, self.workload.prompts[:1]).cache_length

    def acceptance(self, k: int, temperature: float) -> dict:
        key = (k, temperature)
        if key not in self._acceptance:
            self._acceptance[key] = acceptance(self.workload, k, temperature)
        return self._acceptance[key]

    def profile(self, temperature: float) -> list[float]:
        """Per-position acceptance a_1..a_Kmax, measured once at the largest K of the config."""
        return self.acceptance(self.config.max_k, temperature)["accepted_per_position"]

    def acceptance_profiles(self) -> dict[str, list[float]]:
        """The per-position profiles measured so far (at the largest K), by temperature."""
        k_max = self.config.max_k
        return {f"temperature={t}": s["accepted_per_position"] for (k, t), s in self._acceptance.items() if k == k_max}

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

    def measure(self, specs: list[RunSpec], description: str) -> list[dict]:
        timing = self.config.timing
        total = timing.repeats * len({*specs, *(s.plain for s in specs)})
        with tqdm(total=total, desc=description, disable=not self.progress, leave=False) as bar:
            return measure(self.workload, specs, timing.repeats, timing.warmup, timing.tpot_target_ms, bar)

    def models(self) -> dict:
        c = self.config
        given = {"target": self._given_target, "draft": self._given_draft}
        out = {
            "target": describe(self.target, None if given["target"] else c.target),
            "draft": describe(self.draft, None if given["draft"] else c.draft),
        }
        if self.separate_cost_models:
            out["cost_target"] = describe(self.cost_target, c.cost_target or c.target)
            out["cost_draft"] = describe(self.cost_draft, c.cost_draft or c.draft)
        return out
