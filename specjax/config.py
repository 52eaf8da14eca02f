"""The two settings objects every entry point takes.

`GenerationConfig`: how to generate, with Hugging Face `GenerationConfig`'s names and
meanings (`max_new_tokens`, `do_sample`, `temperature`, `top_k`, `top_p`, `min_p`,
`eos_token_id`) plus `seed` and the KV-cache layout. `SpeculativeConfig`: how to speculate,
with vLLM's names (`method`, `model`, `num_speculative_tokens`, `prompt_lookup_min` /
`prompt_lookup_max`) plus specjax's own (`tree`, `adaptive`, `rule`, `verify_schedule`).
Both are frozen; both load from a mapping (YAML/JSON), which is how the CLI and bench
configs build them.

Static or traced (what a change costs): `max_new_tokens` (up to the length a prepared call
was sized for), `seed` and the EOS ids' values are traced: changing them reuses the compiled
program. Everything else (sampling, cache layout, the drafter's configuration, K, the
tree, the adaptive candidates, the rule, the verify schedule) is part of the jit key: a
change compiles anew.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

from specjax.constraints import constraint as constraint_module
from specjax.core import acceptance
from specjax.core.loop import DEFAULT_CACHE, CacheConfig
from specjax.core.sampling import SamplingConfig
from specjax.core.verify_widths import as_verify_schedule
from specjax.drafters import registry
from specjax.models import ModelConfig


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """How to generate (Hugging Face names and meanings, HF defaults where they matter).

    max_new_tokens: tokens to generate per prompt (traced).
    do_sample: False = greedy (argmax), whatever `temperature` says (as in HF); True samples
      from the processed distribution, and speculation stays exact (rejection sampling).
    temperature, top_k, top_p, min_p: the processing applied to both models' logits when
      sampling: temperature, keep the k most likely, keep the smallest set holding top_p of
      the mass, keep tokens whose probability is >= min_p x the most likely one's. None
      turns a filter off (HF's top_k defaults to 50; here no filter is on unless you ask).
    eos_token_id: a stop token id or a list of them; None (the default): the target's own
      (its tokenizer's eos_token_id), as HF's generate takes the model's.
    ignore_eos: never stop early, always generate max_new_tokens (vLLM's name): what
      benchmarks of fixed lengths want.
    seed: the sampling stream (traced).
    cache: the KV-cache layout (dtype, attention block, prefill chunk); None: the default.
    constraint: the output must match a JSON schema or a regular expression: a
      specjax.Constraint for every row, or a list of them, one per prompt (None entries
      leave a row free); a mapping ({regex: ...} / {json_schema: ...}) is read as one. Every
      drafter stays exact under it (docs/constraints.md). The compiled table is traced:
      another constraint of as many states reuses the compiled loop.

    Temperature conventions: this class follows HF (`do_sample` decides greedy or sampled;
    `temperature` must then be > 0). The `specjax` command line and the bench configs follow
    vLLM (temperature 0 = greedy, > 0 samples); `at_temperature(t, **fields)` converts theirs
    to this one: `at_temperature(0.0)` is greedy, `at_temperature(0.7)` is
    `GenerationConfig(do_sample=True, temperature=0.7)`.
    """

    max_new_tokens: int = 64
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    ignore_eos: bool = False
    seed: int = 0
    cache: CacheConfig = DEFAULT_CACHE
    constraint: Any = None

    def __post_init__(self):
        object.__setattr__(self, "constraint", constraint_module.normalise(self.constraint))
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        if self.cache is None:  # "no preference" (as HF reads None): the default layout
            object.__setattr__(self, "cache", DEFAULT_CACHE)
        elif isinstance(self.cache, Mapping):
            object.__setattr__(self, "cache", CacheConfig(**self.cache))
        if not isinstance(self.cache, CacheConfig):
            raise ValueError(f"cache must be a CacheConfig, a mapping of its fields or None, got {self.cache!r}")
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 when do_sample is True, got {self.temperature}")
        eos = self.eos_token_id
        if eos is not None and not all(
            isinstance(i, int) and i >= 0 for i in (eos if isinstance(eos, tuple) else (eos,))
        ):
            raise ValueError(f"eos_token_id must be a token id >= 0, a list of them, or None, got {eos!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos is true or false, got {self.ignore_eos!r}")
        self.sampling  # noqa: B018  (checks top_k, top_p, min_p now, not at the first call)

    @property
    def sampling(self) -> SamplingConfig:
        """The static sampling settings the loop compiles for (greedy: temperature 0)."""
        if not self.do_sample:
            return SamplingConfig(0.0)
        return SamplingConfig(self.temperature, self.top_k, self.top_p, self.min_p)

    def replace(self, **changes) -> GenerationConfig:
        return dataclasses.replace(self, **changes)

    def stop_ids(self, target) -> int | tuple[int, ...] | None:
        """The ids rows stop at on `target` (a Model): None when there are none to stop at."""
        if self.ignore_eos:
            return None
        if self.eos_token_id is not None:
            return self.eos_token_id
        return getattr(getattr(target, "tokenizer", None), "eos_token_id", None)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> GenerationConfig:
        """From a YAML/JSON mapping: unknown keys and wrong types are errors naming the key."""
        from specjax.configs import from_dict

        return from_dict(cls, dict(data), "generation")

    @classmethod
    def at_temperature(cls, temperature: float = 0.0, **fields) -> GenerationConfig:
        """Greedy at temperature 0, sampling above it (the convention of specjax's bench
        configs and CLI, and of the keyword arguments before this class)."""
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        return cls(do_sample=temperature > 0, temperature=temperature if temperature > 0 else 1.0, **fields)


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    """How to speculate: the one drafter spec of the API, the CLI (`--drafter`) and bench
    configs (`draft:`), with vLLM's names where they exist.

    method: the drafter kind, a key of `specjax.drafters.registry.REGISTRY`:
      "draft_model" (`model` names the draft), "parallel_draft" (a PARD draft: K proposals
      from one forward), "prompt_lookup" (n-gram matching), "layer_skip" (the target's first
      `layers` layers), "head" (a trained or published Medusa / EAGLE / EAGLE-3 / block head),
      "fallback" (`first` where it found something, `then` elsewhere), "suffix" (suffix
      decoding: the row's own text and `suffix_pool`), "tli" (a draft model with another
      tokenizer, `model`, restricted to the tokens both vocabularies share: token-level
      intersection, drafters/cross_vocab.py), "uag" (such a draft, unrestricted: its text re-encoded
      by the target's tokenizer, universal assisted generation, drafters/universal.py). vLLM's names are
      aliases (`registry.ALIASES`: "ngram", "eagle", "eagle3", "medusa", ...). None: read from
      `model`, which says what it is (a head directory is a head, a draft that records a mask
      token is a PARD draft, any other model a draft model).
    model: a drafter or model name (shipped, packaged, random preset), a local directory, or
      a ModelConfig (a draft model of that shape with random weights).
    num_speculative_tokens: K, the draft tokens per round (a tree replaces it).
    prompt_lookup_min, prompt_lookup_max, prompt_lookup_prefer: prompt lookup's n-gram sizes,
      and which match wins ("latest" or "earliest"); suffix decoding's shortest and longest
      match (min and max only).
    suffix_pool: earlier outputs suffix decoding may copy from: a list of token-id lists or
      texts (tokenized by the target's tokenizer), or a .json/.jsonl file of them
      (`specjax generate --json` and `specjax regenerate` output read as such); None: none
      (drafters/suffix.py `pool_entries`).
    layers: layer skip's depth (None: half the target's layers).
    mask_token_id: a PARD draft's mask token (None: the one the draft records).
    catch_up, tree_candidates: a model-backed drafter's catch-up width and tree candidates
      ("sample" or "top"); None: the drafter's default.
    draft_length: "uag" only: the draft's own tokens drafted per round before re-encoding
      (None: K; more suits a draft whose tokens are shorter than the target's).
    allow_transfer: load a head for a target it was not trained for (shapes must fit).
    aux_layers, aux_convention: which target blocks a published EAGLE-3 head reads.
    first, then: fallback's two drafters (each a SpeculativeConfig, a mapping of one, or a name).
    tree: a specjax.Tree, a preset name, "chain:K", "full:B:D" or a list of paths.
    adaptive: choose K each round (True, a specjax.AdaptiveConfig, or a mapping of its fields).
    verify_schedule: draft K each round and verify only as many drafts as pay, chosen from
      the drafter's confidence (True, a specjax.VerifySchedule, or a mapping of its fields,
      e.g. {widths: [1, 2, 3, 5]}); chains only, not with a tree or adaptive.
    rule: the acceptance rule, a function or the name of a chain rule
      (`specjax.core.acceptance.RULES`: "greedy", "rejection_sampling", "block_verification");
      None: greedy or rejection sampling, by the sampling (tree rounds: the tree rules).
    """

    method: str | None = None
    model: str | ModelConfig | None = None
    num_speculative_tokens: int = 4
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    prompt_lookup_prefer: str | None = None
    suffix_pool: Any = None
    layers: int | None = None
    mask_token_id: int | None = None
    catch_up: int | None = None
    tree_candidates: str | None = None
    draft_length: int | None = None
    allow_transfer: bool = False
    aux_layers: tuple[int, ...] | None = None
    aux_convention: str | None = None
    first: Any = None
    then: Any = None
    tree: Any = None
    adaptive: Any = False
    rule: Callable | str | None = None
    verify_schedule: Any = None

    def __post_init__(self):
        if self.method is not None:
            object.__setattr__(self, "method", registry.canonical(self.method))
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {k!r}")
        if self.model is not None and not isinstance(self.model, str | ModelConfig):
            raise ValueError(f"model must be a name, a directory or a ModelConfig, got {self.model!r}")
        if isinstance(self.suffix_pool, list):  # from YAML/JSON: a tuple keeps the spec hashable
            pool = tuple(tuple(e) if isinstance(e, list) else e for e in self.suffix_pool)
            object.__setattr__(self, "suffix_pool", pool)
        if not isinstance(self.allow_transfer, bool):
            raise ValueError(f"allow_transfer is true or false, got {self.allow_transfer!r}")
        aux = self.aux_layers
        if aux is not None:
            if not isinstance(aux, list | tuple) or not all(isinstance(i, int) for i in aux):
                raise ValueError(f"aux_layers is a list of block indices, got {aux!r}")
            object.__setattr__(self, "aux_layers", tuple(aux))
        for part in ("first", "then"):
            if getattr(self, part) is not None:
                object.__setattr__(self, part, SpeculativeConfig.parse(getattr(self, part), part))
        if self.tree is not None and not hasattr(self.tree, "num_nodes"):
            from specjax.trees.tree import Tree

            object.__setattr__(self, "tree", Tree.from_spec(self.tree))
        if self.method is not None:
            registry.check_arguments(self.method, self.drafter_arguments())
        if isinstance(self.rule, str):
            object.__setattr__(self, "rule", acceptance.rule_named(self.rule))
        if self.rule is not None and not callable(self.rule):
            raise ValueError(f"rule must be an acceptance rule or its name, got {self.rule!r}")
        self._check_rule_fits_rounds()
        self._check_verify_schedule()

    def _check_verify_schedule(self) -> None:
        """The schedule as a VerifySchedule (None: off), refused where it cannot run: it
        chooses how many of a chain's drafts to verify, so neither a tree nor adaptive K."""
        schedule = as_verify_schedule(self.verify_schedule)
        object.__setattr__(self, "verify_schedule", schedule)
        if schedule is None:
            return
        if self.tree is not None:
            raise ValueError("verify_schedule verifies a chain of drafts, not a token tree: pass no tree")
        if self.adaptive is not False and self.adaptive is not None:
            raise ValueError(
                "verify_schedule and adaptive both choose the round's width: pass one of them "
                "(adaptive chooses K before drafting, verify_schedule how many of K drafts to verify)"
            )

    def _check_rule_fits_rounds(self) -> None:
        """A named chain rule judges a chain of K drafts; tree rounds call their rule with the
        tree (trees/tree_acceptance.py), so pairing the two is an error said here, not a
        TypeError from inside the compiled loop."""
        if self.rule not in acceptance.RULES.values():
            return
        adaptive = self.adaptive
        adaptive_trees = adaptive.get("trees") if isinstance(adaptive, Mapping) else getattr(adaptive, "trees", None)
        if self.tree is not None or adaptive_trees:
            name = next(n for n, r in acceptance.RULES.items() if r is self.rule)
            raise ValueError(
                f"rule {name!r} verifies chains of drafts, not token trees: with a tree, pass no rule "
                "(the tree rules are chosen by the sampling) or a tree rule (specjax.trees.tree_rejection_rule)"
            )

    def replace(self, **changes) -> SpeculativeConfig:
        return dataclasses.replace(self, **changes)

    def drafter_arguments(self) -> dict[str, Any]:
        """The drafter fields set to something other than their defaults (what the method's
        registry entry must take), `model` included."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name in _DRAFTER_FIELDS and getattr(self, f.name) != f.default
        }

    @classmethod
    def parse(cls, value, where: str = "drafter") -> SpeculativeConfig:
        """A spec from what a user writes: a SpeculativeConfig, a mapping (YAML/JSON), a
        ModelConfig (random weights of that shape), or a name: "prompt-lookup" / "ngram",
        "layer-skip", "layer-skip:N", a drafter kind that needs no model, or the name or
        directory of a drafter or model (`model`, whose own files say what it is)."""
        if isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, ModelConfig):
            return cls(model=value)
        if isinstance(value, Mapping):
            return cls.from_mapping(value, where)
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{where}: a drafter is a name or a mapping {{method: ...}}, got {value!r}")
        name, _, count = value.partition(":")
        method = registry.ALIASES.get(name.replace("-", "_"), name.replace("-", "_"))
        if method == "layer_skip" and count:
            if not count.isdigit():
                raise ValueError(f"{where}: layer-skip:N needs an integer N, got {value!r}")
            return cls(method=method, layers=int(count))
        if not count and method in registry.REGISTRY and "model" not in registry.REGISTRY[method].required:
            return cls(method=method)  # e.g. "prompt-lookup": a kind that needs nothing more
        return cls(model=value)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "speculative") -> SpeculativeConfig:
        """From a YAML/JSON mapping, e.g. {method: ngram, prompt_lookup_max: 3,
        num_speculative_tokens: 6}. Unknown keys are an error listing the valid ones; the
        spellings of earlier releases ({kind: ..., path: ..., max_ngram: ...}) are read as
        the fields `_OLD_KEYS` names."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {}
        for key, value in data.items():
            name = _OLD_KEYS.get(key, key)
            if name not in fields:
                raise ValueError(f"{where}: unknown key {key!r}; valid keys: {', '.join(sorted(fields))}")
            if name in values:
                raise ValueError(f"{where}: {key!r} and another spelling of {name!r} are both given")
            values[name] = value
        if isinstance(values.get("model"), Mapping):  # a draft model's shape, random weights
            from specjax.configs import from_dict

            values["model"] = from_dict(ModelConfig, dict(values["model"]), f"{where}.model")
        try:
            return cls(**values)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None

    def describe(self) -> str:
        """A short name for reports: the model's name, or the set fields as a mapping."""
        arguments = dict(self.drafter_arguments())
        if self.method is not None:
            arguments = {"method": self.method, **arguments}
        if list(arguments) == ["model"]:
            return "random weights" if isinstance(self.model, ModelConfig) else str(self.model)
        parts = []
        for key, value in arguments.items():
            if isinstance(value, SpeculativeConfig):
                value = value.describe()
            elif isinstance(value, ModelConfig):
                value = "random weights"
            parts.append(f"{key}: {value}")
        return "{" + ", ".join(parts) + "}"

    def warn_unused(self) -> None:
        """Kept for callers of earlier releases: unused fields are now errors at construction."""


# The fields that describe the drafter (the rest say how rounds run: K, tree, adaptive, rule,
# verify_schedule).
_DRAFTER_FIELDS = frozenset(
    {"model", "prompt_lookup_min", "prompt_lookup_max", "prompt_lookup_prefer", "suffix_pool", "layers",
     "mask_token_id", "catch_up", "tree_candidates", "draft_length", "allow_transfer", "aux_layers", "aux_convention",
     "first", "then"}
)  # fmt: skip
# Spellings of the drafter mappings of earlier releases (bench configs, --drafter), read as fields.
_OLD_KEYS = {
    "kind": "method",
    "path": "model",
    "max_ngram": "prompt_lookup_max",
    "min_ngram": "prompt_lookup_min",
    "prefer": "prompt_lookup_prefer",
}
