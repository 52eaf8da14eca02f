"""A bench config's `draft:`: a model name, a ModelConfig mapping, or a typed drafter mapping.

    draft: stdlib-draft                                   a model (embedded, preset, HF directory)
    draft: stdlib-eagle                                   a trained head (embedded name or directory)
    draft: {kind: prompt_lookup, max_ngram: 3}            any drafter of specjax.drafters.make_drafter
    draft: {kind: layer_skip, layers: 2}
    draft: {kind: draft_model, model: stdlib-draft-pretrained}
    draft: {kind: fallback, first: {kind: prompt_lookup}, then: stdlib-draft}

`DrafterSpec` is a frozen dataclass like every config section, so a misspelt key fails
with its dotted path. It holds the union of the drafters' arguments; a key that the chosen
kind does not take fails too. A new drafter kind with a new argument needs a field here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from specjax.configs import from_dict
from specjax.drafters import Drafter, DraftModel, PromptLookup, make_drafter
from specjax.drafters.registry import lookup
from specjax.io.model import Model
from specjax.models import ModelConfig


class Raw:
    """Type hint of the last option of a multi-shape field: a value that fits no shape arrives
    unchanged, so the field's owner can re-parse it with the shape it was meant to have and
    report that shape's error (configs.from_dict alone reports the *first* shape's error,
    e.g. "expected str" for a drafter mapping with a misspelt key)."""


@dataclasses.dataclass(frozen=True)
class DrafterSpec:
    """{kind: ..., **arguments} of one drafter (unset arguments take the drafter's defaults)."""

    kind: str
    max_ngram: int | None = None  # prompt_lookup
    min_ngram: int | None = None  # prompt_lookup
    prefer: str | None = None  # prompt_lookup: "latest" or "earliest"
    layers: int | None = None  # layer_skip
    catch_up: int | None = None  # layer_skip
    tree_candidates: str | None = None  # layer_skip
    model: str | ModelConfig | None = None  # draft_model
    first: DrafterSpec | str | None = None  # fallback
    then: DrafterSpec | str | None = None  # fallback
    path: str | None = None  # head: an embedded head's name or a head directory
    allow_transfer: bool | None = None  # head: load it for a target it was not trained for
    aux_layers: list[int] | None = None  # head (EAGLE-3): the target blocks it reads, overriding its config
    aux_convention: str | None = None  # head (EAGLE-3): how its config's layer ids count, "vllm" or "sglang"

    def __post_init__(self):
        kind = self.kind.replace("-", "_")
        object.__setattr__(self, "kind", kind)
        name, _ = lookup(kind, self.arguments())
        if name == "prompt_lookup":
            PromptLookup(**self.arguments())  # value checks (e.g. min_ngram <= max_ngram) now, not mid-run

    def arguments(self) -> dict:
        """The arguments that were set, nested specs as mappings: what make_drafter takes."""
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name != "kind" and value is not None:
                out[field.name] = value.mapping() if isinstance(value, DrafterSpec) else value
        return out

    def mapping(self) -> dict:
        return {"kind": self.kind, **self.arguments()}


DraftSpec = str | ModelConfig | DrafterSpec


def parse_draft(value, where: str) -> DraftSpec:
    """`value` as a typed draft spec, or a ValueError that names `where` and what is wrong."""
    if isinstance(value, DraftSpec):
        return value
    if not isinstance(value, dict):
        raise ValueError(
            f"{where}: expected a model name, a ModelConfig mapping or a drafter mapping {{kind: ...}}, got {value!r}"
        )
    try:  # a mapping is a drafter if it names a kind, else a model shape: report that one's error
        return from_dict(DrafterSpec, value, where) if "kind" in value else from_dict(ModelConfig, value, where)
    except ValueError as error:
        message = str(error)
        raise ValueError(
            message if message.startswith(("unknown config key", f"{where}:", f"{where}.")) else f"{where}: {message}"
        ) from None


def describe_spec(spec: DraftSpec | None) -> str:
    """A short human-readable name: the model name, "random weights" or the drafter mapping."""
    if spec is None:
        return "Python object"
    if isinstance(spec, str):
        return spec
    if isinstance(spec, ModelConfig):
        return "random weights"
    parts = [f"kind: {spec.kind}"]
    for field in dataclasses.fields(spec)[1:]:
        value = getattr(spec, field.name)
        if value is not None:
            parts.append(f"{field.name}: {describe_spec(value) if isinstance(value, DraftSpec) else value}")
    return "{" + ", ".join(parts) + "}"


def build_drafter(
    spec: DraftSpec, load: Callable[[str | ModelConfig], Model], target: ModelConfig | None = None
) -> Drafter:
    """The drafter a spec names; `load` resolves model names and ModelConfig shapes. A name
    may also be a trained head (stdlib-medusa, stdlib-eagle, or a head directory)."""
    if isinstance(spec, DrafterSpec):
        return make_drafter(spec.mapping(), load, target)
    if isinstance(spec, str):
        return make_drafter(spec, load, target)
    return DraftModel(load(spec))
