"""The two settings objects every entry point takes.

`GenerationConfig`: how to generate, with Hugging Face `GenerationConfig`'s names and
meanings (`max_new_tokens`, `do_sample`, `temperature`, `top_k`, `top_p`, `min_p`,
`eos_token_id`) plus `seed` and the KV-cache layout. `SpeculativeConfig`: how to speculate,
with vLLM's names (`method`, `model`, `num_speculative_tokens`, `prompt_lookup_min` /
`prompt_lookup_max`) plus specjax's own (`tree`, `adaptive`, `rule`). Both are frozen; both
load from a mapping (YAML/JSON), which is how the CLI and bench configs build them.

Static or traced (what a change costs): `max_new_tokens` (up to the length a prepared call
was sized for), `seed` and the EOS ids' values are traced: changing them reuses the compiled
program. Everything else (sampling, cache layout, the drafter's configuration, K, the
tree, the adaptive candidates, the rule) is part of the jit key: a change compiles anew.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from specjax.core.loop import DEFAULT_CACHE, CacheConfig
from specjax.core.sampling import SamplingConfig


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
    eos_token_id: a stop token id or a list of them; None: generate max_new_tokens.
    seed: the sampling stream (traced).
    cache: the KV-cache layout (dtype, attention block, prefill chunk); None: the default.
    """

    max_new_tokens: int = 64
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    seed: int = 0
    cache: CacheConfig = DEFAULT_CACHE

    def __post_init__(self):
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
        self.sampling  # noqa: B018  (checks top_k, top_p, min_p now, not at the first call)

    @property
    def sampling(self) -> SamplingConfig:
        """The static sampling settings the loop compiles for (greedy: temperature 0)."""
        if not self.do_sample:
            return SamplingConfig(0.0)
        return SamplingConfig(self.temperature, self.top_k, self.top_p, self.min_p)

    def replace(self, **changes) -> GenerationConfig:
        return dataclasses.replace(self, **changes)

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


# vLLM's method names first; specjax's aliases map onto them.
METHODS = ("draft_model", "ngram", "layer_skip", "medusa", "eagle", "eagle3", "head", "fallback")
_ALIASES = {
    "prompt_lookup": "ngram",
    "prompt-lookup": "ngram",
    "draft-model": "draft_model",
    "layer-skip": "layer_skip",
}


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    """How to speculate (vLLM's names where they exist).

    method: "draft_model" (`model` names the draft), "ngram" (prompt lookup, vLLM's name;
      alias "prompt_lookup"), "layer_skip" (the target's first `layers` layers), "medusa" /
      "eagle" / "eagle3" / "head" (a trained head: `model` is its name or directory),
      "fallback" (`first`, then `then`, each a mapping of this kind). None: inferred from
      `model` (a head directory or name is a head, anything else a draft model).
    model: a model or head name (embedded, random preset) or a local directory.
    num_speculative_tokens: K, the draft tokens per round (a tree replaces it).
    prompt_lookup_min, prompt_lookup_max: the n-gram sizes prompt lookup matches.
    layers: layer skip's depth (None: half the target's layers).
    tree: a specjax.Tree, a preset name, "chain:K", "full:B:D" or a list of paths.
    adaptive: choose K each round (True, a specjax.AdaptiveConfig, or a mapping of its fields).
    rule: the acceptance rule (None: greedy or rejection sampling, by the sampling).
    allow_transfer: load a head for a target it was not trained for (shapes must fit).
    first, then: fallback's two drafters (mappings like this one, or names).
    """

    method: str | None = None
    model: str | None = None
    num_speculative_tokens: int = 4
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    layers: int | None = None
    tree: Any = None
    adaptive: Any = False
    rule: Callable | None = None
    allow_transfer: bool = False
    first: Any = None
    then: Any = None

    def __post_init__(self):
        method = _ALIASES.get(self.method, self.method)
        if method is not None and method not in METHODS:
            raise ValueError(f"unknown speculative method {self.method!r}; choose one of {', '.join(METHODS)}")
        object.__setattr__(self, "method", method)
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {k!r}")
        if self.tree is not None and not hasattr(self.tree, "num_nodes"):
            from specjax.trees.tree import Tree

            object.__setattr__(self, "tree", Tree.from_spec(self.tree))

    def replace(self, **changes) -> SpeculativeConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> SpeculativeConfig:
        """From a YAML/JSON mapping, e.g. {method: ngram, prompt_lookup_max: 3,
        num_speculative_tokens: 6}; unknown keys are an error listing the valid ones."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"unknown speculative config key {unknown[0]!r}; valid keys: {', '.join(sorted(fields))}")
        return cls(**dict(data))

    def drafter_spec(self):
        """This config's drafter as the name or mapping `specjax.drafters.make_drafter` takes."""
        method = self.method
        if method is None:
            if self.model is None:
                raise ValueError("a SpeculativeConfig needs a method or a model (or pass draft= directly)")
            return self.model
        if method == "ngram":
            args = {"max_ngram": self.prompt_lookup_max, "min_ngram": self.prompt_lookup_min}
            return {"kind": "prompt_lookup", **{k: v for k, v in args.items() if v is not None}}
        if method == "layer_skip":
            return "layer_skip" if self.layers is None else {"kind": "layer_skip", "layers": self.layers}
        if method == "fallback":
            if self.first is None or self.then is None:
                raise ValueError("method 'fallback' needs `first` and `then`")
            return {"kind": "fallback", "first": _spec(self.first), "then": _spec(self.then)}
        if self.model is None:
            raise ValueError(f"method {method!r} needs `model`: the name or directory of the draft or head")
        if method == "draft_model":
            return {"kind": "draft_model", "model": self.model}
        return {"kind": "head", "path": self.model, "allow_transfer": self.allow_transfer}

    def warn_unused(self) -> None:
        if self.method not in (None, "ngram") and (self.prompt_lookup_min or self.prompt_lookup_max):
            warnings.warn("prompt_lookup_min/max are read only by method 'ngram'", UserWarning, stacklevel=3)


def _spec(value):
    """A fallback part: a SpeculativeConfig, a mapping of one, or a drafter name."""
    if isinstance(value, SpeculativeConfig):
        return value.drafter_spec()
    if isinstance(value, Mapping) and "kind" not in value:
        return SpeculativeConfig.from_mapping(value).drafter_spec()
    return value
