"""The public face of `specjax`: a narrow top level, and no name that silently vanished.

The top level (`specjax.__all__`) holds what generating needs; every other name the package
exported before it was narrowed is reached through its module, and asking the top level
for it fails with the import to write instead. The deprecated entry points still answer from
the top level, with their warning, for one release.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import specjax

ROOT = Path(__file__).resolve().parents[1]

# specjax.__all__ before it was narrowed (58 names): each must still be reachable.
BEFORE = """
AcceptanceRule AdaptiveConfig BlockHead CacheConfig DecodeState DraftContext DraftModel Drafter
Eagle Fallback GenerationConfig GenerationOutput GenerationStats KVCache LayerSkip LoopState
Medusa Model ModelConfig ParallelDraft Plan PreparedGeneration PromptLookup Proposal
SamplingConfig SpecPlan SpecState SpeculativeConfig Tree build_drafter distributed generate
greedy_rule init_cache init_model init_speculative_state init_state load_drafter load_model
logits make_drafter make_mesh measure_acceptance prepare prepare_generate
prepare_speculative_generate probabilities rejection_sampling_rule save_drafter save_model
save_model_sharing shard_model speculative_generate speculative_step state_output step
target_fingerprint tune_tree
""".split()  # noqa: SIM905 (a word list reads better than 58 quoted lines)

# Names added to the top level since it was narrowed (each a config a user passes to generate).
ADDED = {"VerifySchedule", "Constraint"}

DEPRECATED = (
    "init_speculative_state",
    "prepare_generate",
    "prepare_speculative_generate",
    "speculative_generate",
    "speculative_step",
)
SUBMODULES = ("distributed",)  # an attribute of the package, reached as a namespace


def test_the_top_level_is_narrow_and_every_name_imports():
    names = specjax.__all__
    assert len(names) <= 23
    assert len(set(names)) == len(names)
    namespace: dict = {}
    exec("from specjax import *", namespace)
    for name in names:
        assert getattr(specjax, name) is namespace[name], name
    for core in ("generate", "prepare", "init_state", "step", "state_output", "GenerationConfig",
                 "SpeculativeConfig", "GenerationOutput", "load_model", "Model", "load_drafter"):  # fmt: skip
        assert core in names


def test_no_name_vanished():
    """Every name exported before is kept, deprecated, a submodule, or moved."""
    moved = specjax._MOVED
    for name in BEFORE:
        kept = name in specjax.__all__
        replaced = name in specjax._REPLACED
        assert kept + (name in DEPRECATED) + (name in SUBMODULES) + (name in moved) + replaced == 1, name
    assert set(specjax.__all__) <= set(BEFORE) | ADDED
    assert set(moved) <= set(BEFORE)


@pytest.mark.parametrize("name", sorted(specjax._REPLACED))
def test_a_replaced_name_fails_with_what_to_call_instead(name):
    with pytest.raises(AttributeError, match=re.escape(specjax._REPLACED[name])):
        getattr(specjax, name)


@pytest.mark.parametrize("name", sorted(specjax._MOVED))
def test_a_moved_name_fails_with_the_import_to_write(name):
    module = specjax._MOVED[name]
    assert getattr(importlib.import_module(module), name) is not None  # the import it names works
    with pytest.raises(AttributeError, match=re.escape(f"from {module} import {name}")):
        getattr(specjax, name)
    assert not hasattr(specjax, name)
    assert name not in specjax.__all__


def test_unknown_names_are_plain_attribute_errors():
    with pytest.raises(AttributeError, match="module 'specjax' has no attribute 'no_such_name'"):
        specjax.no_such_name  # noqa: B018


@pytest.mark.parametrize("name", DEPRECATED)
def test_deprecated_entry_points_answer_from_the_top_level_and_warn(name):
    """They warn before they look at their arguments (tests/test_legacy.py runs them for real)."""
    assert name not in specjax.__all__
    args = (None, [[1]]) if name == "prepare_generate" else (None, None, [[1]])
    with pytest.warns(DeprecationWarning, match=name), pytest.raises((TypeError, ValueError, AttributeError)):
        getattr(specjax, name)(*args)


def test_docs_name_no_moved_top_level_name():
    """README.md, docs/ and the model cards write `specjax.drafters.Medusa`, never `specjax.Medusa`:
    prose is not run by the doc tests, so a stale name there would go unnoticed."""
    stale = re.compile(r"\bspecjax\.(" + "|".join(specjax._MOVED) + r")\b")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("models/pretrained/*/*.md"))]
    found = [f"{page.relative_to(ROOT)}: {m.group(0)}" for page in pages for m in stale.finditer(page.read_text())]
    assert not found
