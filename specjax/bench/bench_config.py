"""What `specjax bench` runs: one typed config, one section per registered experiment (E1-E11).

A model is named (an embedded model, a random preset or a local HF directory) or given
as a `ModelConfig` mapping, which builds a random-weight model of that shape: cost does
not depend on training, so cost experiments can run a 1B-parameter bf16 target that was
never trained, while acceptance is always measured on the (trained) `target`/`draft` pair.
`draft` may be any drafter (a SpeculativeConfig: see drafter_spec.py), e.g. {method: ngram}.

The settings every experiment shares are `_Settings` below; each experiment's section
(`k_sweep:`, `trees:`, ...) is the dataclass its module defines, and BenchConfig gets one
field per experiment of experiments.REGISTRY, placed after `experiments`, so that the YAML
keys and `--set section.field=value` overrides are the experiments' names.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence

from specjax.bench import experiments
from specjax.bench.drafter_spec import Raw, parse_draft
from specjax.bench.experiments.shared import Experiment
from specjax.bench.prompt_sets import Prompts, parse_prompts
from specjax.io.weight_formats import check_weights
from specjax.models import ModelConfig

ModelSpec = str | ModelConfig


@dataclasses.dataclass(frozen=True)
class Timing:
    repeats: int = 5  # timed repetitions per configuration (medians are reported)
    warmup: int = 1  # untimed calls first: the first one compiles
    tpot_target_ms: float = 5.0  # the latency target of goodput
    cost_inner: int = 16  # forwards per timed sample in the cost model (amortises dispatch)


@dataclasses.dataclass(frozen=True)
class _Settings:
    """The fields of BenchConfig that are no experiment's section, in their order."""

    target: ModelSpec = "stdlib-target"
    draft: str | Raw = "stdlib-draft"  # any drafter: a name or a SpeculativeConfig mapping
    # Models for the cost experiments (E2, E4, E5) when they should differ from the pair,
    # e.g. a large random-weight target on a GPU; their predictions use the pair's acceptance.
    cost_target: ModelSpec | None = None
    cost_draft: ModelSpec | None = None
    prompts: Prompts | list[Prompts] | Raw = dataclasses.field(default_factory=Prompts)
    max_new_tokens: int = 128
    seed: int = 0
    timing: Timing = Timing()
    bandwidth_megabytes: int = 256  # array size of the memory-bandwidth measurement
    # Clear JAX's compilation caches after every experiment, so the process never holds
    # more than one experiment's compiled programs (bench/compiles.py explains why). The
    # price: an experiment never reuses another's programs (E8 recompiles E3's), which on a
    # tiny model is most of the run; `clear_caches: false` keeps them.
    clear_caches: bool = True
    experiments: list[str] = dataclasses.field(default_factory=list)  # default: every registered experiment
    # (here: one section per registered experiment, e.g. `k_sweep: KSweep`)
    # `adaptive: true`: every experiment's speculative configurations get an adaptive twin
    # (K_MAX = their largest K at each batch size, temperature and drafter), timed in the
    # same round-robin (E11 compares adaptive speculation in depth).
    adaptive: bool = False
    # Every experiment's target (and draft model) on this mesh: "data=2,model=4" or
    # {data: 2, model: 4} (specjax.make_mesh); None: one device. E10 sweeps meshes itself.
    mesh: str | dict | None = None
    # The weight format of the target, the cost models and every draft model, applied at
    # load time: "float32" (the params as loaded), "bfloat16" or "int8" (models/quant.py,
    # specjax/io/weight_formats.py); `--set weights=int8` runs any config in int8.
    weights: str = "float32"
    # Every generation of the bench constrained (docs/constraints.md), plain baselines
    # included: {regex: ...}, {json_schema: ...} (JSON text or a mapping), or the path of
    # a JSON schema file; None: free. Rows keep their fixed lengths (max_new_tokens): a row
    # whose match completes early goes on with the only token then allowed, EOS. The same
    # config with and without it gives the rows with and without the schema.
    constraint: str | dict | None = None


def bench_constraint(value):
    """The bench's `constraint` setting as a specjax Constraint (None: none), checked now:
    a mapping of Constraint's fields, or the path of a JSON schema file."""
    from specjax.constraints import Constraint

    if value is None or isinstance(value, Constraint):
        return value
    if isinstance(value, str):
        try:
            with open(value, encoding="utf-8") as f:
                value = {"json_schema": f.read()}
        except OSError as error:
            raise ValueError(f"constraint: cannot read the JSON schema file {value}: {error.strerror}") from None
    try:
        constraint = Constraint.parse(value)
        constraint.check_syntax()
    except ValueError as error:
        raise ValueError(f"constraint: {error}") from None
    return constraint


class _BenchConfigMethods:
    """What every BenchConfig class does; `registry` is the experiments it was built from."""

    registry: tuple[Experiment, ...] = ()

    def __post_init__(self):
        check_weights(self.weights)  # before anything loads
        if self.weights != "float32" and self.mesh is not None:
            raise ValueError(f"weights={self.weights!r} with a mesh is not supported yet: use weights: float32")
        object.__setattr__(self, "draft", parse_draft(self.draft, "draft"))
        if isinstance(self.mesh, str):
            from specjax.parallel.mesh import parse_mesh

            parse_mesh(self.mesh)
        object.__setattr__(self, "prompts", parse_prompts(self.prompts))
        object.__setattr__(self, "constraint", bench_constraint(self.constraint))
        names = [e.name for e in self.registry]
        unknown = [e for e in self.experiments if e not in names]
        if unknown:
            raise ValueError(f"unknown experiment {unknown[0]!r}; choose from {', '.join(names)}")
        if self.timing.repeats < 1 or self.timing.warmup < 1:
            raise ValueError("timing.repeats and timing.warmup must be >= 1 (the warm-up call compiles)")
        if self.max_new_tokens < 2:
            raise ValueError("max_new_tokens must be >= 2 (TPOT needs a token after the first)")

    @property
    def prompt_sources(self) -> list[Prompts]:
        return [self.prompts] if isinstance(self.prompts, Prompts) else list(self.prompts)

    @property
    def chosen(self) -> list[Experiment]:
        """The experiments this config runs, in registry (id) order."""
        return [e for e in self.registry if e.name in self.experiments]

    @property
    def max_k(self) -> int:
        """The largest K the chosen experiments use: acceptance profiles are measured at this K."""
        return max([1, *(k for e in self.chosen for k in e.ks(getattr(self, e.name)))])


def bench_config_class(registered: Sequence[Experiment] | None = None) -> type:
    """A BenchConfig dataclass with one section per experiment of `registered` (default:
    experiments.REGISTRY, read now, so an experiment registered later gets a class that knows it)."""
    registered = tuple(experiments.REGISTRY if registered is None else registered)
    names = [e.name for e in registered]
    if len(set(names)) != len(names) or len({e.id for e in registered}) != len(registered):
        raise ValueError(f"experiment names and ids must be unique: {[(e.id, e.name) for e in registered]}")
    hints = typing.get_type_hints(_Settings)
    fields = []
    for f in dataclasses.fields(_Settings):
        if f.name == "experiments":
            fields.append((f.name, hints[f.name], dataclasses.field(default_factory=lambda: list(names))))
            fields += [(e.name, e.section, dataclasses.field(default_factory=e.section)) for e in registered]
        else:
            fields.append(
                (f.name, hints[f.name], dataclasses.field(default=f.default, default_factory=f.default_factory))
            )
    namespace = {
        "registry": registered,
        "__doc__": "A `specjax bench` config: the shared settings and one section per experiment (bench_config.py).",
        "__module__": __name__,
    }
    return dataclasses.make_dataclass(
        "BenchConfig", fields, bases=(_BenchConfigMethods,), namespace=namespace, frozen=True
    )


BenchConfig = bench_config_class()

# name -> id of every registered experiment, in order ("k_sweep" -> "E3").
EXPERIMENTS = {e.name: e.id for e in BenchConfig.registry}
