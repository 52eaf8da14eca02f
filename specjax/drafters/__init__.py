"""Drafters: one file per way of proposing tokens (see base.py for the interface).

    draft_model.py    a separate draft Model
    layer_skip.py     the target's first N layers (self-speculation)
    prompt_lookup.py  n-gram matching in the row's own prompt + output
    fallback.py       one drafter where it found something, another elsewhere
    medusa.py         Medusa heads on the target's own hidden states
    eagle.py          an EAGLE-style head: one layer extrapolating the target's features
    heads.py          saving and loading trained heads, checked against their target
    convert.py        `as_drafter`: a Model wherever a drafter is taken

`make_drafter` builds one from a name or a mapping, as the CLI and bench configs give it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from specjax.drafters.base import DraftContext, Drafter, Proposal, TreeProposal
from specjax.drafters.convert import as_drafter
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.eagle import Eagle
from specjax.drafters.fallback import Fallback
from specjax.drafters.heads import is_head_directory, load_drafter, save_drafter, target_fingerprint
from specjax.drafters.layer_skip import LayerSkip
from specjax.drafters.medusa import Medusa
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.io.embedded import embedded_heads, embedded_names, embedded_path
from specjax.io.model import Model
from specjax.io.presets import RANDOM_PRESETS
from specjax.models import ModelConfig

# kind -> constructor from the keyword arguments of a mapping spec.
KINDS: dict[str, Callable[..., Drafter]] = {
    "prompt_lookup": PromptLookup,
    "layer_skip": LayerSkip,
}


# Kinds make_drafter builds itself: they name models or heads, or nest other specs.
_BUILT_HERE = ("draft_model", "fallback", "head")


def _spellings() -> str:
    """Every drafter spelling, for an unknown one's error (one line)."""
    heads = ", ".join(embedded_heads()) or "none installed"
    models = ", ".join([*sorted(RANDOM_PRESETS), *embedded_names()])
    kinds = ", ".join(sorted([*KINDS, *_BUILT_HERE]))
    return (
        f"prompt-lookup, layer-skip, layer-skip:N, a trained head ({heads}), a model ({models}), a local Hugging "
        f"Face model directory or head directory, or a mapping {{kind: ...}} with kind one of {kinds}"
    )


def make_drafter(
    spec: str | Mapping[str, Any], load: Callable[[str], Model], target: ModelConfig | Model | None = None
) -> Drafter:
    """A drafter from a CLI/config spec; `load(name)` resolves model names.

    spec: "prompt-lookup" / "prompt_lookup", "layer-skip" (half of `target`'s layers),
    "layer-skip:N", a trained head (an embedded name such as stdlib-medusa, or a directory
    written by `save_drafter`), a model name (embedded, random preset or HF directory), or
    a mapping {kind: ..., **arguments}:
        {kind: prompt_lookup, max_ngram: 3, min_ngram: 1, prefer: latest}
        {kind: layer_skip, layers: 2}
        {kind: draft_model, model: stdlib-draft}
        {kind: fallback, first: {...}, then: {...}}
        {kind: head, path: stdlib-medusa}                        a head by name or directory
        {kind: head, path: DIR, allow_transfer: true}            ...on a target it was not trained for
    A head is checked against `target` (load_drafter): one trained for another target is
    refused unless allow_transfer (shapes must match even then). Given a Model, its weights
    are checked too; given a ModelConfig, its config only. An unknown name is a ValueError
    listing every spelling.
    """
    target_config = getattr(target, "config", target)
    if isinstance(spec, str):
        kind = spec.replace("-", "_")
        if kind == "prompt_lookup":
            return PromptLookup()
        if kind == "layer_skip":
            if target_config is None:
                raise ValueError("layer skip needs a layer count: {kind: layer_skip, layers: N} (CLI: layer-skip:N)")
            return LayerSkip(layers=max(1, target_config.num_hidden_layers // 2))
        if kind.startswith("layer_skip:"):
            count = kind.split(":", 1)[1]
            if not count.isdigit():
                raise ValueError(f"layer-skip:N needs an integer N, got {spec!r}")
            return LayerSkip(layers=int(count))
        if is_head_directory(embedded_path(spec) or Path(spec).expanduser()):
            return load_drafter(spec, target)  # as given: its errors name the head as the user wrote it
        if spec not in RANDOM_PRESETS and spec not in embedded_names() and not Path(spec).expanduser().exists():
            raise ValueError(f"unknown drafter {spec!r}: a drafter is {_spellings()}")
        return DraftModel(load(spec))
    if not isinstance(spec, Mapping) or "kind" not in spec:
        raise ValueError(f"a drafter spec is a name or a mapping with a 'kind' key, got {spec!r}")
    args = {k: v for k, v in spec.items() if k != "kind"}
    kind = str(spec["kind"]).replace("-", "_")
    if kind == "draft_model":
        if set(args) != {"model"}:
            raise ValueError(f"{{kind: draft_model}} takes exactly one key, 'model', got {sorted(args)}")
        return DraftModel(load(args["model"]))
    if kind == "fallback":
        if set(args) != {"first", "then"}:
            raise ValueError(f"{{kind: fallback}} takes exactly 'first' and 'then', got {sorted(args)}")
        return Fallback(make_drafter(args["first"], load, target), make_drafter(args["then"], load, target))
    if kind == "head":
        if "path" not in args or not set(args) <= {"path", "allow_transfer"}:
            raise ValueError(f"{{kind: head}} takes 'path' and optionally 'allow_transfer', got {sorted(args)}")
        if not isinstance(args.get("allow_transfer", False), bool):
            raise ValueError(f"{{kind: head}}'s allow_transfer is true or false, got {args['allow_transfer']!r}")
        return load_drafter(str(args["path"]), target, allow_transfer=args.get("allow_transfer", False))
    if kind not in KINDS:
        known = ", ".join(sorted([*KINDS, *_BUILT_HERE]))
        raise ValueError(f"unknown drafter kind {spec['kind']!r}; known kinds: {known}")
    try:
        return KINDS[kind](**args)
    except TypeError as e:
        raise ValueError(f"bad arguments for drafter kind {kind!r}: {e}") from e


__all__ = [
    "KINDS",
    "DraftContext",
    "DraftModel",
    "Drafter",
    "Eagle",
    "Fallback",
    "LayerSkip",
    "Medusa",
    "PromptLookup",
    "Proposal",
    "TreeProposal",
    "as_drafter",
    "load_drafter",
    "make_drafter",
    "save_drafter",
    "target_fingerprint",
]
