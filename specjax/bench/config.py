"""What `specjax bench` runs: one typed config, one section per experiment (E1-E9).

A model is named (an embedded model, a random preset or a local HF directory) or given
as a `ModelConfig` mapping, which builds a random-weight model of that shape: cost does
not depend on training, so cost experiments can run a 1B-parameter bf16 target that was
never trained, while acceptance is always measured on the (trained) `target`/`draft` pair.
`draft` may also be any drafter (see drafter_spec.py), e.g. {kind: prompt_lookup}.
"""

from __future__ import annotations

import dataclasses

from specjax.bench.drafter_spec import DrafterSpec, Raw, parse_draft
from specjax.configs import from_dict
from specjax.models import ModelConfig
from specjax.trees.tree import PRESETS

ModelSpec = str | ModelConfig

EXPERIMENTS = {
    "tokens_per_round": "E1",
    "verify_cost": "E2",
    "k_sweep": "E3",
    "batch_sweep": "E4",
    "context_sweep": "E5",
    "waste": "E6",
    "sampling": "E7",
    "methods": "E8",
    "trees": "E9",
    "scaling": "E10",
    "adaptive_sweep": "E11",
}


@dataclasses.dataclass(frozen=True)
class Prompts:
    """One prompt source: held-out prompts from the stdlib corpus (the default; see
    specjax.training.data.held_out_prompts), or, when `file` is set, a JSONL or text file
    (format: bench/prompts.py). `prompts:` may also be a list of sources."""

    domain: str = "code"  # corpus: "code" or "prose"
    count: int | None = None  # corpus: how many (default 8); file: the first `count` (default all)
    prompt_bytes: int = 96  # corpus: bytes per prompt
    split: str = "test"  # corpus: held-out split
    file: str | None = None  # a .jsonl or text file (relative to the working directory)
    category: str | None = None  # default category (corpus: the domain; file: per line, else the file stem)
    chat_template: bool = False  # wrap each prompt as a user turn with the tokenizer's chat template

    def __post_init__(self):
        if self.count is not None and self.count < 1:
            raise ValueError(f"prompts.count must be >= 1, got {self.count}")
        if self.category == "all":
            raise ValueError('prompts.category "all" is reserved for the pooled rows')


@dataclasses.dataclass(frozen=True)
class Timing:
    repeats: int = 5  # timed repetitions per configuration (medians are reported)
    warmup: int = 1  # untimed calls first: the first one compiles
    tpot_target_ms: float = 5.0  # the latency target of goodput
    cost_inner: int = 16  # forwards per timed sample in the cost model (amortises dispatch)


@dataclasses.dataclass(frozen=True)
class TokensPerRound:
    """E1: measured tokens per round vs 1 + a + ... + a^K."""

    ks: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 3, 4, 6, 8])
    temperatures: list[float] = dataclasses.field(default_factory=lambda: [0.0, 1.0])


@dataclasses.dataclass(frozen=True)
class VerifyCost:
    """E2: cost of one target forward of width w, relative to w = 1."""

    widths: list[int] = dataclasses.field(default_factory=lambda: list(range(1, 17)))
    batch_sizes: list[int] = dataclasses.field(default_factory=lambda: [1])
    context: int = 256  # cache slots of the forward (attention reads all of them)


@dataclasses.dataclass(frozen=True)
class KSweep:
    """E3: speedup vs K at one batch size, measured beside the cost-model prediction."""

    ks: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 3, 4, 6, 8, 12])
    batch_size: int = 1
    temperature: float = 0.0


@dataclasses.dataclass(frozen=True)
class BatchSweep:
    """E4: speedup and total tokens/s vs batch size at one K."""

    batch_sizes: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    num_speculative_tokens: int = 4
    temperature: float = 0.0
    end_to_end: bool = True  # also time real generations (needs a trained pair to mean much)


@dataclasses.dataclass(frozen=True)
class FillCapacity:
    """E5, second part: a decode step against fill and capacity varied separately, with
    attention over the filled blocks only ("blockwise") and over every slot ("full", the
    behaviour before blockwise attention), for each KV-cache dtype; and the trained pair's
    acceptance with each cache dtype."""

    capacities: list[int] = dataclasses.field(default_factory=lambda: [512, 2048, 8192])
    fills: list[int] = dataclasses.field(default_factory=lambda: [128, 512, 2048])
    cache_dtypes: list[str | None] = dataclasses.field(default_factory=lambda: [None, "bfloat16"])
    attention: list[str] = dataclasses.field(default_factory=lambda: ["blockwise", "full"])


@dataclasses.dataclass(frozen=True)
class ContextSweep:
    """E5: decode and verify cost vs context length, beside the KV-cache bytes."""

    contexts: list[int] = dataclasses.field(default_factory=lambda: [128, 256, 512, 1024, 2048])
    batch_size: int = 1
    num_speculative_tokens: int = 4
    fill_capacity: FillCapacity | None = None  # None: the context sweep alone


@dataclasses.dataclass(frozen=True)
class Waste:
    """E6: drafted, accepted, correction/bonus and wasted positions per round."""

    ks: list[int] = dataclasses.field(default_factory=lambda: [2, 4, 8])
    temperature: float = 0.0


@dataclasses.dataclass(frozen=True)
class SamplingCheck:
    """E7: the target distribution test, plus acceptance at temperature 0 vs > 0."""

    ks: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 4, 8])
    temperatures: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.7, 1.0])
    test_temperature: float = 1.0
    test_num_speculative_tokens: int = 4
    test_samples: int = 4000  # independent two-token continuations of one prompt
    p_value_threshold: float = 0.001


@dataclasses.dataclass(frozen=True)
class Method:
    """One drafting method of E8: a label and a draft spec (None: the bench's `draft`)."""

    name: str
    draft: str | ModelConfig | DrafterSpec | Raw | None = None

    def __post_init__(self):
        if self.draft is not None:
            object.__setattr__(self, "draft", parse_draft(self.draft, f"methods.drafters[name={self.name}].draft"))


def _default_methods() -> list[Method]:
    return [Method("draft"), Method("prompt lookup", DrafterSpec("prompt_lookup", max_ngram=3))]


@dataclasses.dataclass(frozen=True)
class Methods:
    """E8: drafting methods on the same prompts, each against plain decoding measured beside it."""

    drafters: list[Method] = dataclasses.field(default_factory=_default_methods)
    num_speculative_tokens: int = 4
    temperatures: list[float] = dataclasses.field(default_factory=lambda: [0.0, 1.0])
    batch_size: int = 1

    def __post_init__(self):
        names = [m.name for m in self.drafters]
        if not names or len(set(names)) != len(names) or "none" in names:
            raise ValueError(
                f"methods.drafters needs at least one method, with unique names other than 'none': {names}"
            )


@dataclasses.dataclass(frozen=True)
class Trees:
    """E9: chain vs preset and tuned token trees at equal verify width (N + 1 positions).

    At each width w: the chain of K = w - 1 and the trees tuned to the pair with w - 1
    nodes; each preset at its own width. The tuned trees come from one acceptance table
    per temperature (specjax.engine.tune.measure_acceptance), measured on `tune_prompts`,
    which should not overlap the measured prompts (default: the train split of the
    bench's corpus domains, while the bench measures the test split).
    """

    widths: list[int] = dataclasses.field(default_factory=lambda: [8, 16, 32, 64])
    presets: list[str] = dataclasses.field(default_factory=lambda: ["binary-3", "prior-16", "prior-32"])
    # One tuned tree per width for each entry: null lets it be as deep as its node count (the
    # best tree under the measured acceptance); d caps its depth at d, i.e. at d draft forwards
    # per round (Sequoia caps depth for hardware cost the same way). []: no tuned trees.
    tuned_depths: list[int | None] = dataclasses.field(default_factory=lambda: [None])
    temperatures: list[float] = dataclasses.field(default_factory=lambda: [0.0, 1.0])
    batch_size: int = 1
    tune_prompts: Prompts | list[Prompts] | Raw | None = None  # None: the bench's corpus domains, train split
    tune_max_new_tokens: int = 128  # target tokens generated per tuning prompt
    tune_max_rank: int = 8

    def __post_init__(self):
        if self.tune_prompts is not None:
            object.__setattr__(self, "tune_prompts", _parse_prompts(self.tune_prompts))
        if not self.widths or any(w < 2 for w in self.widths) or len(set(self.widths)) != len(self.widths):
            raise ValueError(f"trees.widths must be distinct verify widths >= 2 (N >= 1 nodes), got {self.widths}")
        unknown = [p for p in self.presets if p not in PRESETS]
        if unknown:
            raise ValueError(f"unknown tree preset {unknown[0]!r} in trees.presets; choose from {', '.join(PRESETS)}")
        if self.batch_size < 1 or self.tune_max_new_tokens < 2 or self.tune_max_rank < 1:
            raise ValueError("trees.batch_size and tune_max_rank must be >= 1, tune_max_new_tokens >= 2")
        depths = self.tuned_depths
        if any(d is not None and d < 1 for d in depths) or len(set(depths)) != len(depths):
            raise ValueError(f"trees.tuned_depths must be distinct depth caps >= 1 (or null: no cap), got {depths}")


_DEFAULT_MESHES = ("data=1,model=1", "data=1,model=2", "data=1,model=4", "data=2,model=2", "data=8,model=1")


@dataclasses.dataclass(frozen=True)
class Scaling:
    """E10: tokens/s against mesh shape ("data=D,model=M"), the draft replicated or sharded.

    Needs as many devices as the largest mesh: on CPU, run the bench with
    XLA_FLAGS=--xla_force_host_platform_device_count=8 (figures are then relative only).
    A mesh the target cannot use (heads not divisible) is skipped with the reason recorded.
    """

    meshes: list[str] = dataclasses.field(default_factory=lambda: list(_DEFAULT_MESHES))
    batch_size: int = 8
    num_speculative_tokens: int = 4
    draft_layouts: list[str] = dataclasses.field(default_factory=lambda: ["replicated", "sharded"])
    max_new_tokens: int | None = None  # None: the bench's max_new_tokens
    link_megabytes: float = 4.0  # all-reduce size of the link measurement (0: none)

    def __post_init__(self):
        from specjax.parallel.mesh import parse_mesh

        for mesh in self.meshes:
            parse_mesh(mesh)
        bad = [x for x in self.draft_layouts if x not in ("replicated", "sharded")]
        if bad or not self.draft_layouts:
            raise ValueError(f"scaling.draft_layouts must be 'replicated' and/or 'sharded', got {self.draft_layouts}")
        if self.batch_size < 1 or self.num_speculative_tokens < 1:
            raise ValueError("scaling.batch_size and num_speculative_tokens must be >= 1")


@dataclasses.dataclass(frozen=True)
class AdaptiveSweep:
    """E11: adaptive speculation (K_MAX = k_max) against plain decoding and static K
    (specjax/bench/adaptive.py says what each scenario measures and aims at)."""

    k_max: int = 8
    static_ks: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 4, 8])
    batch_sizes: list[int] = dataclasses.field(default_factory=lambda: [1, 4, 16, 64])
    temperature: float = 0.0
    random_draft: bool = True  # scenario 1: a random-weight draft of the bench draft's shape
    random_k: int = 4
    # Scenario 4: prompts whose acceptance shifts mid-generation, drafted by `shift_drafter`
    # (a drafter spec as in `draft`). None: skipped.
    shift_prompts: Prompts | list[Prompts] | Raw | None = None
    shift_drafter: str | ModelConfig | DrafterSpec | Raw = "prompt-lookup"
    # Predicted, not run: the policy and static K simulated on the round costs of the cost
    # models (cost_target/cost_draft, else the pair) at these batch sizes, with the pair's
    # acceptance (bench/adaptive_predict.py). Empty: no prediction.
    predict_batch_sizes: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if any(b < 1 for b in self.predict_batch_sizes):
            raise ValueError(f"adaptive_sweep.predict_batch_sizes must be >= 1, got {self.predict_batch_sizes}")
        if self.shift_prompts is not None:
            object.__setattr__(self, "shift_prompts", _parse_prompts(self.shift_prompts))
        object.__setattr__(self, "shift_drafter", parse_draft(self.shift_drafter, "adaptive_sweep.shift_drafter"))
        if self.k_max < 1 or not self.static_ks or min(self.static_ks) < 1 or max(self.static_ks) > self.k_max:
            raise ValueError(
                f"adaptive_sweep.static_ks must be K values in [1, k_max={self.k_max}], got {self.static_ks}"
            )
        if not self.batch_sizes or min(self.batch_sizes) < 1 or self.random_k < 1:
            raise ValueError("adaptive_sweep.batch_sizes and random_k must be >= 1")


def _parse_prompts(value) -> Prompts | list[Prompts]:
    """A source or a list of sources; anything else fails with the error of the shape it resembles."""
    if isinstance(value, Prompts) or (isinstance(value, list) and value and all(isinstance(p, Prompts) for p in value)):
        return value
    if isinstance(value, dict):
        return from_dict(Prompts, value, "prompts")
    if isinstance(value, list) and value:
        return [
            from_dict(Prompts, v, f"prompts[{i}]") if isinstance(v, dict) else _parse_prompts(v)
            for i, v in enumerate(value)
        ]
    raise ValueError(f"prompts: expected a mapping (one source) or a non-empty list of them, got {value!r}")


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    target: ModelSpec = "stdlib-target"
    draft: str | ModelConfig | DrafterSpec | Raw = "stdlib-draft"  # a model, or any drafter mapping
    # Models for the cost experiments (E2, E4, E5) when they should differ from the pair,
    # e.g. a large random-weight target on a GPU; their predictions use the pair's acceptance.
    cost_target: ModelSpec | None = None
    cost_draft: ModelSpec | None = None
    prompts: Prompts | list[Prompts] | Raw = Prompts()
    max_new_tokens: int = 128
    seed: int = 0
    timing: Timing = Timing()
    bandwidth_megabytes: int = 256  # array size of the memory-bandwidth measurement
    # Clear JAX's compilation caches after every experiment, so the process never holds
    # more than one experiment's compiled programs (bench/compiles.py explains why).
    clear_caches: bool = True
    experiments: list[str] = dataclasses.field(default_factory=lambda: list(EXPERIMENTS))
    tokens_per_round: TokensPerRound = TokensPerRound()
    verify_cost: VerifyCost = VerifyCost()
    k_sweep: KSweep = KSweep()
    batch_sweep: BatchSweep = BatchSweep()
    context_sweep: ContextSweep = ContextSweep()
    waste: Waste = Waste()
    sampling: SamplingCheck = SamplingCheck()
    methods: Methods = Methods()
    trees: Trees = Trees()
    scaling: Scaling = Scaling()
    adaptive_sweep: AdaptiveSweep = AdaptiveSweep()
    # `adaptive: true`: every experiment's speculative configurations get an adaptive twin
    # (K_MAX = their largest K at each batch size, temperature and drafter), timed in the
    # same round-robin (E11 compares adaptive speculation in depth).
    adaptive: bool = False
    # Every experiment's target (and draft model) on this mesh: "data=2,model=4" or
    # {data: 2, model: 4} (specjax.make_mesh); None: one device. E10 sweeps meshes itself.
    mesh: str | dict | None = None

    def __post_init__(self):
        object.__setattr__(self, "draft", parse_draft(self.draft, "draft"))
        if isinstance(self.mesh, str):
            from specjax.parallel.mesh import parse_mesh

            parse_mesh(self.mesh)
        object.__setattr__(self, "prompts", _parse_prompts(self.prompts))
        unknown = [e for e in self.experiments if e not in EXPERIMENTS]
        if unknown:
            raise ValueError(f"unknown experiment {unknown[0]!r}; choose from {', '.join(EXPERIMENTS)}")
        if self.timing.repeats < 1 or self.timing.warmup < 1:
            raise ValueError("timing.repeats and timing.warmup must be >= 1 (the warm-up call compiles)")
        ks = [*self.tokens_per_round.ks, *self.k_sweep.ks, *self.waste.ks, *self.sampling.ks]
        ks += [self.batch_sweep.num_speculative_tokens, self.context_sweep.num_speculative_tokens]
        ks += [self.methods.num_speculative_tokens]
        if any(k < 1 for k in ks):
            raise ValueError(f"every num_speculative_tokens (K) must be >= 1, got {min(ks)}")
        sizes = [*self.verify_cost.batch_sizes, *self.batch_sweep.batch_sizes, self.k_sweep.batch_size]
        sizes.append(self.methods.batch_size)
        if any(b < 1 for b in sizes) or any(w < 1 for w in self.verify_cost.widths):
            raise ValueError("batch sizes and verify widths must be >= 1")
        if self.max_new_tokens < 2:
            raise ValueError("max_new_tokens must be >= 2 (TPOT needs a token after the first)")

    @property
    def prompt_sources(self) -> list[Prompts]:
        return [self.prompts] if isinstance(self.prompts, Prompts) else list(self.prompts)

    @property
    def max_k(self) -> int:
        """The largest K the chosen experiments use: acceptance profiles are measured at this K."""
        ks = {
            "tokens_per_round": self.tokens_per_round.ks,
            "k_sweep": self.k_sweep.ks,
            "batch_sweep": [self.batch_sweep.num_speculative_tokens],
            "context_sweep": [self.context_sweep.num_speculative_tokens],
            "waste": self.waste.ks,
            "adaptive_sweep": [
                self.adaptive_sweep.k_max,
                *([self.adaptive_sweep.random_k] * self.adaptive_sweep.random_draft),
            ],
        }
        return max([1, *(k for name in self.experiments for k in ks.get(name, []))])
