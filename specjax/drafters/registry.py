"""Every drafter kind, registered the same way: a name, the keys its mapping takes, a builder.

A spec is a name (the CLI's --drafter, a bench config's `draft:`) or a mapping
{kind: ..., **arguments}; names are shorthands for mappings (`name_to_mapping`), and
every mapping is built by its kind's entry here. Adding a drafter is its own file plus one
`register(...)` line below.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from specjax.drafters.base import Drafter
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.fallback import Fallback
from specjax.drafters.head_formats import published_format
from specjax.drafters.head_io import is_head_directory, load_drafter
from specjax.drafters.layer_skip import LayerSkip
from specjax.drafters.parallel_draft import ParallelDraft
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.io.embedded import embedded_heads, embedded_names, embedded_path
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


def _dataclass_kind(cls) -> tuple[Callable[[dict, Build], Drafter], set[str], set[str]]:
    """A drafter dataclass whose mapping keys are its constructor's fields."""
    fields = [f for f in dataclasses.fields(cls) if f.init]
    required = {f.name for f in fields if f.default is f.default_factory is dataclasses.MISSING}
    return (lambda args, build: cls(**args)), {f.name for f in fields}, required


def _layer_skip(args: dict, build: Build) -> Drafter:
    if "layers" not in args:  # half the target's layers
        if build.target_config is None:
            raise ValueError("layer skip needs a layer count: {kind: layer_skip, layers: N} (CLI: layer-skip:N)")
        args = {**args, "layers": max(1, build.target_config.num_hidden_layers // 2)}
    return LayerSkip(**args)


def _head(args: dict, build: Build) -> Drafter:
    if not isinstance(args.get("allow_transfer", False), bool):
        raise ValueError(f"{{kind: head}}'s allow_transfer is true or false, got {args['allow_transfer']!r}")
    aux = args.get("aux_layers")
    if aux is not None and (not isinstance(aux, list | tuple) or not all(isinstance(i, int) for i in aux)):
        raise ValueError(f"{{kind: head}}'s aux_layers is a list of block indices, got {aux!r}")
    return load_drafter(
        str(args["path"]),
        build.target,
        allow_transfer=args.get("allow_transfer", False),
        aux_layers=None if aux is None else tuple(aux),
        aux_convention=args.get("aux_convention") or "vllm",
    )


register("prompt_lookup", *_dataclass_kind(PromptLookup), doc="n-gram matching in the row's own text")
register("layer_skip", _layer_skip, {"layers", "catch_up", "tree_candidates"}, doc="the target's first N layers")
register("draft_model", lambda a, b: DraftModel(b.load(a["model"])), {"model"}, {"model"}, doc="a draft model")
register("parallel_draft", lambda a, b: ParallelDraft(b.load(a["model"]), a.get("mask_token_id")),
         {"model", "mask_token_id"}, {"model"},
         doc="a PARD-trained draft model: K proposals from one forward")  # fmt: skip
register("fallback", lambda a, b: Fallback(b.make(a["first"]), b.make(a["then"])), {"first", "then"},
         {"first", "then"}, doc="`first` where it found something, `then` elsewhere")  # fmt: skip
register("head", _head, {"path", "allow_transfer", "aux_layers", "aux_convention"}, {"path"},
         doc="a trained or published head (Medusa, EAGLE, EAGLE-3, speculators)")  # fmt: skip
ALIASES = {"ngram": "prompt_lookup", "medusa": "head", "eagle": "head", "eagle3": "head"}


def lookup(kind: str, given) -> tuple[str, Kind]:
    """(registered name, Kind) of `kind` (aliases resolved), after checking the keys `given`."""
    name = ALIASES.get(kind.replace("-", "_"), kind.replace("-", "_"))
    if name not in REGISTRY:
        raise ValueError(f"unknown drafter kind {kind!r}; known kinds: {', '.join(sorted(REGISTRY))}")
    entry, given = REGISTRY[name], set(given)
    if given - entry.allowed or entry.required - given:
        raise ValueError(
            f"drafter kind {name!r} takes {', '.join(sorted(entry.allowed))} "
            f"({', '.join(sorted(entry.required)) or 'none'} required), got {', '.join(sorted(given)) or 'none'}"
        )
    return name, entry


def spellings() -> str:
    """Every drafter spelling, for an unknown one's error (one line)."""
    heads = ", ".join(embedded_heads()) or "none installed"
    models = ", ".join([*sorted(RANDOM_PRESETS), *embedded_names()])
    kinds = ", ".join(sorted(REGISTRY))
    return (
        f"prompt-lookup, layer-skip, layer-skip:N, a trained head ({heads}), a model ({models}), a local Hugging "
        f"Face model directory or head directory, or a mapping {{kind: ...}} with kind one of {kinds}"
    )


def name_to_mapping(spec: str) -> dict:
    """The mapping a drafter name stands for."""
    kind = spec.replace("-", "_")
    if kind in ("prompt_lookup", "ngram"):
        return {"kind": "prompt_lookup"}
    if kind == "layer_skip":
        return {"kind": "layer_skip"}
    if kind.startswith("layer_skip:"):
        count = kind.split(":", 1)[1]
        if not count.isdigit():
            raise ValueError(f"layer-skip:N needs an integer N, got {spec!r}")
        return {"kind": "layer_skip", "layers": int(count)}
    where = embedded_path(spec) or Path(spec).expanduser()
    if is_head_directory(where) or published_format(where) is not None:
        return {"kind": "head", "path": spec}  # as given: its errors name the head as the user wrote it
    if spec in RANDOM_PRESETS or spec in embedded_names() or Path(spec).expanduser().exists():
        return {"kind": "draft_model", "model": spec}
    raise ValueError(f"unknown drafter {spec!r}: a drafter is {spellings()}")


def make_drafter(
    spec: str | Mapping[str, Any], load: Callable[[str], Model], target: ModelConfig | Model | None = None
) -> Drafter:
    """A drafter from a CLI/config spec; `load(name)` resolves model names.

    spec: "prompt-lookup", "layer-skip" (half of `target`'s layers), "layer-skip:N", a
    trained head (an embedded name such as stdlib-medusa, or a directory written by
    `save_drafter`), a model name (embedded, random preset or HF directory), or a mapping
    {kind: ..., **arguments} of a registered kind:
        {kind: prompt_lookup, max_ngram: 3, min_ngram: 1, prefer: latest}
        {kind: layer_skip, layers: 2}
        {kind: draft_model, model: stdlib-draft}
        {kind: parallel_draft, model: DIR, mask_token_id: 258}   K proposals from one forward (PARD);
                                                                 mask_token_id: DIR's recorded one if omitted
        {kind: fallback, first: {...}, then: {...}}
        {kind: head, path: stdlib-medusa}                        a head by name or directory
        {kind: head, path: DIR, allow_transfer: true}            ...on a target it was not trained for
        {kind: head, path: DIR, aux_layers: [1, 3, 6]}           a published EAGLE-3 head, its blocks given
    A directory that holds a published head (EAGLE-1/2, EAGLE-3, Medusa, speculators:
    drafters/head_formats.py) is a head too, told from a draft model by its tensor names.
    A head is checked against `target` (load_drafter): one trained for another target is
    refused unless allow_transfer (shapes must match even then). Given a Model, its weights
    are checked too; given a ModelConfig, its config only. An unknown name is a ValueError
    listing every spelling.
    """
    if isinstance(spec, str):
        spec = name_to_mapping(spec)
    if not isinstance(spec, Mapping) or "kind" not in spec:
        raise ValueError(f"a drafter spec is a name or a mapping with a 'kind' key, got {spec!r}")
    args = {k: v for k, v in spec.items() if k != "kind"}
    name, kind = lookup(str(spec["kind"]), args)
    try:
        return kind.build(args, Build(load, target))
    except TypeError as e:
        raise ValueError(f"bad arguments for drafter kind {name!r}: {e}") from e
