"""Every drafter kind, registered the same way: a name, the spec fields it reads, a builder.

The spec is `specjax.SpeculativeConfig` (its `method` is a key of REGISTRY; vLLM's names are
aliases, in ALIASES and nowhere else). Builders read the spec's fields by name; this module
sits below specjax.config, so it never imports the class. Adding a drafter is its own file
plus one `register(...)` line below.

A spec without a method is resolved from its `model` (`resolve_method`): a drafter's own
files say what it is. A head directory (drafter.json) or a published head's weights is a
head; a draft whose config.json records a mask token (`specjax_mask_token_id`, written by
`specjax distill` with parallel drafting) is a PARD draft; any other model is a draft model.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specjax.drafters.base import Drafter
from specjax.drafters.cross_vocab import CrossVocab
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.fallback import Fallback
from specjax.drafters.formats.files import WEIGHT_FILES
from specjax.drafters.formats.native import is_head_directory, load_head
from specjax.drafters.formats.published import published_format
from specjax.drafters.layer_skip import LayerSkip
from specjax.drafters.parallel_draft import ParallelDraft
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.drafters.suffix import suffix_drafter
from specjax.drafters.universal import Universal
from specjax.io.embedded import embedded_heads, embedded_names, embedded_path
from specjax.io.gguf_file import PACKAGED
from specjax.io.model import Model
from specjax.io.presets import RANDOM_PRESETS
from specjax.models import ModelConfig


@dataclasses.dataclass(frozen=True)
class Build:
    """What a builder may use: model loading by name, the target, and recursion for nested specs."""

    load: Callable[[str], Model]
    target: ModelConfig | Model | None

    @property
    def target_config(self) -> ModelConfig | None:
        return getattr(self.target, "config", self.target)

    def make(self, spec) -> Drafter:
        return make_drafter(spec, self.load, self.target)


@dataclasses.dataclass(frozen=True)
class Kind:
    """One registered drafter kind: its mapping's keys and how to build it."""

    build: Callable[[dict, Build], Drafter]
    allowed: frozenset[str]
    required: frozenset[str] = frozenset()
    doc: str = ""


REGISTRY: dict[str, Kind] = {}


def register(name: str, build: Callable[[dict, Build], Drafter], allowed=(), required=(), doc: str = "") -> None:
    REGISTRY[name] = Kind(build, frozenset(allowed), frozenset(required), doc)


def _set(spec, **names) -> dict[str, Any]:
    """The drafter's constructor arguments from the spec fields `names` maps them to, where set."""
    return {arg: getattr(spec, field) for arg, field in names.items() if getattr(spec, field) is not None}


def _prompt_lookup(spec, build: Build) -> Drafter:
    return PromptLookup(**_set(spec, max_ngram="prompt_lookup_max", min_ngram="prompt_lookup_min",
                               prefer="prompt_lookup_prefer"))  # fmt: skip


def _suffix(spec, build: Build) -> Drafter:
    tokenizer = getattr(build.target, "tokenizer", None)  # texts in the pool need the target's
    return suffix_drafter(spec.suffix_pool, tokenizer,
                          **_set(spec, max_match="prompt_lookup_max", min_match="prompt_lookup_min"))  # fmt: skip


def _layer_skip(spec, build: Build) -> Drafter:
    args = _set(spec, layers="layers", catch_up="catch_up", tree_candidates="tree_candidates")
    if "layers" not in args:  # half the target's layers
        if build.target_config is None:
            raise ValueError("layer skip needs a layer count: {method: layer_skip, layers: N} (CLI: layer-skip:N)")
        args["layers"] = max(1, build.target_config.num_hidden_layers // 2)
    return LayerSkip(**args)


def _draft_model(spec, build: Build) -> Drafter:
    return DraftModel(build.load(spec.model), **_set(spec, catch_up="catch_up", tree_candidates="tree_candidates"))


def _parallel_draft(spec, build: Build) -> Drafter:
    model = build.load(spec.model)
    mask = spec.mask_token_id if spec.mask_token_id is not None else model.mask_token_id
    if mask is None:
        raise ValueError(
            f"method 'parallel_draft' needs mask_token_id: {spec.model!r} records none (a draft trained by "
            "`specjax distill` with parallel.enabled records it)"
        )
    return ParallelDraft(model, mask, **_set(spec, catch_up="catch_up", tree_candidates="tree_candidates"))


def _cross_vocab(kind: type[CrossVocab] | type[Universal]) -> Callable[[Any, Build], Drafter]:
    def build_it(spec, build: Build) -> Drafter:
        if not isinstance(build.target, Model):  # the tables come from the target's tokenizer
            raise ValueError(f"method {kind.name!r} needs the target Model (its tokenizer), not only its config")
        fields = _set(spec, catch_up="catch_up", draft_length="draft_length")
        return kind.between(build.load(spec.model), build.target, **fields)

    return build_it


def _head(spec, build: Build) -> Drafter:
    return load_head(
        spec.model if isinstance(spec.model, str) else str(spec.model),
        build.target,
        allow_transfer=spec.allow_transfer,
        aux_layers=spec.aux_layers,
        aux_convention=spec.aux_convention or "vllm",
    )


_MODEL_ARGS = {"catch_up", "tree_candidates"}
register("prompt_lookup", _prompt_lookup, {"prompt_lookup_min", "prompt_lookup_max", "prompt_lookup_prefer"},
         doc="n-gram matching in the row's own text")  # fmt: skip
register("suffix", _suffix, {"prompt_lookup_min", "prompt_lookup_max", "suffix_pool"},
         doc="suffix decoding: the longest match's most frequent continuation, own text and a pool")  # fmt: skip
register("layer_skip", _layer_skip, {"layers", *_MODEL_ARGS}, doc="the target's first N layers")
register("draft_model", _draft_model, {"model", *_MODEL_ARGS}, {"model"}, doc="a draft model")
register("parallel_draft", _parallel_draft, {"model", "mask_token_id", *_MODEL_ARGS}, {"model"},
         doc="a PARD-trained draft model: K proposals from one forward")  # fmt: skip
register("tli", _cross_vocab(CrossVocab), {"model", "catch_up"}, {"model"},
         doc="a draft model with another tokenizer: token-level intersection (Timor et al. 2025)")  # fmt: skip
register("uag", _cross_vocab(Universal), {"model", "catch_up", "draft_length"}, {"model"},
         doc="a draft model with another tokenizer: its text re-encoded (universal assisted generation)")  # fmt: skip
register("fallback", lambda spec, b: Fallback(b.make(spec.first), b.make(spec.then)), {"first", "then"},
         {"first", "then"}, doc="`first` where it found something, `then` elsewhere")  # fmt: skip
register("head", _head, {"model", "allow_transfer", "aux_layers", "aux_convention"}, {"model"},
         doc="a trained or published head (Medusa, EAGLE, EAGLE-3, block heads, DSpark, speculators)")  # fmt: skip
# vLLM's method names (and the spellings of earlier releases) for the registered kinds.
ALIASES = {
    "ngram": "prompt_lookup",
    "medusa": "head",
    "eagle": "head",
    "eagle3": "head",
    "block_head": "head",
    "dspark": "head",  # a DSpark head saved by train-head (kind: dspark): drafter.json says which
    "dflash2": "head",  # a DFlash 2 head saved by train-head (kind: dflash2)
}


def canonical(method: str) -> str:
    """The registered kind `method` names (aliases and hyphens resolved), or a ValueError."""
    if not isinstance(method, str):
        raise ValueError(f"method is a drafter kind's name, got {method!r}")
    key = method.replace("-", "_")
    name = ALIASES.get(key, key)
    if name not in REGISTRY:
        known = ", ".join([*sorted(REGISTRY), *(f"{a} (= {k})" for a, k in sorted(ALIASES.items()))])
        raise ValueError(f"unknown speculative method {method!r}; choose one of {known}")
    return name


def check_arguments(method: str, given: dict[str, Any]) -> None:
    """A ValueError unless `method` takes every field in `given` and gets the ones it needs."""
    entry = REGISTRY[method]
    extra, missing = sorted(set(given) - entry.allowed), sorted(entry.required - set(given))
    if extra or missing:
        takes = ", ".join(sorted(entry.allowed)) or "no drafter fields"
        problem = f"does not take {', '.join(extra)}" if extra else f"needs {', '.join(missing)}"
        raise ValueError(f"method {method!r} {problem} (it takes {takes})")


def spellings() -> str:
    """Every drafter spelling, for an unknown one's error (one line)."""
    heads = ", ".join(embedded_heads()) or "none installed"
    models = ", ".join([*sorted(RANDOM_PRESETS), *embedded_names(), *sorted(PACKAGED)])
    kinds = ", ".join(sorted(REGISTRY))
    return (
        f"prompt-lookup, layer-skip, layer-skip:N, a trained head ({heads}), a model ({models}), a local Hugging "
        f"Face model directory or head directory, or a mapping {{method: ...}} with method one of {kinds}"
    )


def resolve_method(model: str | ModelConfig, load: Callable[[str], Model]) -> str:
    """The kind a drafter name or directory is, read from its own files (module docstring)."""
    if isinstance(model, ModelConfig):
        return "draft_model"
    packaged = embedded_path(model)
    local = Path(model).expanduser()
    if packaged is not None and local.exists() and local.resolve() != packaged.resolve():
        raise ValueError(
            f"drafter {model!r} is ambiguous: a shipped drafter and the local path {local.resolve()}; "
            f"write ./{model} for the directory"
        )
    where = packaged or local
    if is_head_directory(where) or published_format(where) is not None or _headlike(where):
        return "head"
    if packaged is None and local.is_dir() and not (local / "config.json").is_file():
        raise ValueError(
            f"{local} is neither a specjax head directory (no drafter.json), a published head (no head weights) "
            "nor a model directory (no config.json)"
        )
    if not (model in RANDOM_PRESETS or model in PACKAGED or packaged is not None or local.exists()):
        hint = "no such directory (yet); " if ("/" in model or model.startswith(".")) else ""
        raise ValueError(f"unknown drafter {model!r}: {hint}a drafter is {spellings()}")
    return "parallel_draft" if load(model).mask_token_id is not None else "draft_model"


def _headlike(path: Path) -> bool:
    """Weights a model directory cannot hold (none in safetensors, or no config.json), or a
    config.json that is no Hugging Face model's (no model_type): a head whose format
    `load_head` will name or refuse (a torch pickle, say), not a model it cannot read."""
    if not path.is_dir() or not any((path / name).is_file() for name in WEIGHT_FILES):
        return False
    config = path / "config.json"
    if not config.is_file() or not any((path / name).is_file() for name in _MODEL_WEIGHTS):
        return True
    try:
        return "model_type" not in json.loads(config.read_text())
    except (OSError, ValueError):
        return False


_MODEL_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")  # what io/hf.py reads


def _loading_once(load: Callable[[str], Model]) -> Callable[[str], Model]:
    cache: dict = {}

    def load_once(name):
        if name not in cache:
            cache[name] = load(name)
        return cache[name]

    return load_once


def make_drafter(spec, load: Callable[[str], Model], target: ModelConfig | Model | None = None) -> Drafter:
    """The drafter a `SpeculativeConfig` names; `load(name)` resolves model names (it is
    called once per model: pass a caching one to share loads). A head is checked against
    `target` (`load_head`): one trained for another target is refused unless
    allow_transfer (shapes must match even then); given a Model, its weights are checked
    too, given a ModelConfig its config only. Names and mappings are parsed by
    `SpeculativeConfig.parse`; `specjax.load_drafter` does both."""
    if not hasattr(spec, "drafter_arguments"):
        raise ValueError(f"make_drafter takes a specjax.SpeculativeConfig (specjax.load_drafter takes names), "
                         f"got {spec!r}")  # fmt: skip
    method = spec.method
    if method is None:
        if spec.model is None:
            raise ValueError("a drafter spec needs a method or a model: {method: ...} or a drafter's name")
        load = _loading_once(load)  # telling a PARD draft loads it: the builder reuses that load
        method = resolve_method(spec.model, load)
        check_arguments(method, spec.drafter_arguments())
    try:
        return REGISTRY[method].build(spec, Build(load, target))
    except TypeError as e:
        raise ValueError(f"bad arguments for method {method!r}: {e}") from e
