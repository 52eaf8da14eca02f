"""One drafter spec (specjax.SpeculativeConfig) for the API, the CLI and bench configs, and
every shipped drafter by name: its own files say what kind it is."""

from __future__ import annotations

import json

import pytest

import specjax
from specjax.bench.drafter_spec import parse_draft
from specjax.cli import main
from specjax.config import SpeculativeConfig
from specjax.drafters import (
    BlockHead,
    DFlash2,
    DraftModel,
    DSpark,
    Eagle,
    Fallback,
    LayerSkip,
    Medusa,
    ParallelDraft,
    PromptLookup,
)
from specjax.drafters.registry import ALIASES, REGISTRY, resolve_method
from specjax.io.embedded import embedded_heads


@pytest.fixture(scope="module")
def target_config():
    return specjax.load_model("stdlib-target").config


def test_method_is_the_registry_key_and_vllm_names_are_aliases():
    for alias, key in ALIASES.items():
        assert key in REGISTRY and SpeculativeConfig(method=alias, model="x" if key == "head" else None).method == key
    assert SpeculativeConfig(method="prompt-lookup").method == "prompt_lookup"
    with pytest.raises(ValueError, match=r"unknown speculative method 'eagle4'; choose one of .*parallel_draft"):
        SpeculativeConfig(method="eagle4")


@pytest.mark.parametrize(
    "value, expected",
    [
        ("prompt-lookup", SpeculativeConfig(method="prompt_lookup")),
        ("ngram", SpeculativeConfig(method="prompt_lookup")),
        ("layer-skip:3", SpeculativeConfig(method="layer_skip", layers=3)),
        ("stdlib-pard-draft", SpeculativeConfig(model="stdlib-pard-draft")),
        (
            {"kind": "prompt_lookup", "max_ngram": 4, "min_ngram": 2},  # the spelling of earlier releases
            SpeculativeConfig(method="prompt_lookup", prompt_lookup_max=4, prompt_lookup_min=2),
        ),
        (
            {"method": "fallback", "first": "prompt-lookup", "then": {"model": "stdlib-draft"}},
            SpeculativeConfig(
                method="fallback",
                first=SpeculativeConfig(method="prompt_lookup"),
                then=SpeculativeConfig(model="stdlib-draft"),
            ),
        ),
    ],
)
def test_names_and_mappings_parse_to_one_spec_everywhere(value, expected):
    assert SpeculativeConfig.parse(value) == expected
    assert parse_draft(value, "draft") == expected  # a bench config's `draft:`


@pytest.mark.parametrize(
    "mapping, message",
    [
        ({"method": "ngram", "layers": 2}, r"method 'prompt_lookup' does not take layers \(it takes prompt_lookup_max"),
        ({"method": "parallel_draft"}, r"method 'parallel_draft' needs model"),
        ({"method": "fallback", "first": "prompt-lookup"}, r"method 'fallback' needs then"),
        ({"method": "head", "model": "x", "max_ngram": 3}, r"does not take prompt_lookup_max"),
        ({"method": "ngram", "path": "x", "model": "y"}, r"'model' and another spelling of 'model' are both given"),
        ({"methd": "ngram"}, r"unknown key 'methd'; valid keys: "),
    ],
)
def test_a_spec_a_method_cannot_run_is_a_one_line_error(mapping, message):
    with pytest.raises(ValueError, match=message) as error:
        SpeculativeConfig.from_mapping(mapping)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "name, kind",
    [
        ("stdlib-draft", DraftModel),
        ("stdlib-draft-pretrained", DraftModel),
        ("stdlib-pard-draft", ParallelDraft),  # ran as an autoregressive draft before its config was read
        ("stdlib-medusa", Medusa),
        ("stdlib-eagle", Eagle),
        ("stdlib-eagle3", Eagle),
        ("stdlib-eagle3-published", Eagle),
        ("stdlib-block-head", BlockHead),
        ("stdlib-dspark-head", DSpark),
        ("stdlib-dflash2-head", DFlash2),
        ("prompt-lookup", PromptLookup),
        ("layer-skip:2", LayerSkip),
    ],
)
def test_every_shipped_drafter_loads_by_name_alone(name, kind, target_config):
    assert type(specjax.load_drafter(name, target_config)) is kind


def test_every_shipped_head_is_named_and_smollm2_s_say_what_they_are():
    """Every shipped head resolves as a head by name; SmolLM2's drafters (when installed)
    resolve without loading SmolLM2 (heads) or by their recorded mask token (PARD)."""
    refuse = lambda name: pytest.fail(f"{name} was loaded to tell a head")  # noqa: E731
    for name in embedded_heads():
        assert resolve_method(name, refuse) == "head"


def test_a_name_that_is_both_shipped_and_a_local_directory_is_ambiguous(tmp_path, monkeypatch, target_config):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "stdlib-draft").mkdir()
    with pytest.raises(ValueError, match=r"drafter 'stdlib-draft' is ambiguous: .* write ./stdlib-draft"):
        specjax.load_drafter("stdlib-draft", target_config)


def test_fallback_and_overrides_through_load_drafter(target_config):
    drafter = specjax.load_drafter({"method": "fallback", "first": "ngram", "then": "stdlib-draft"}, target_config)
    assert isinstance(drafter, Fallback)
    lookup = specjax.load_drafter("prompt-lookup", target_config, prompt_lookup_max=5)
    assert lookup == PromptLookup(max_ngram=5)


def test_the_cli_s_drafter_flag_reads_the_same_spec(capsys):
    """--drafter NAME runs the drafter the name is (a PARD draft here), --draft is the same
    flag, and a mapping's num_speculative_tokens is K unless -k is given."""
    args = ["generate", "--prompt", "def parse_args(", "--max-new-tokens", "6", "--json"]
    assert main([*args, "--drafter", "stdlib-pard-draft"]) == 0
    pard = json.loads(capsys.readouterr().out)
    assert pard["settings"]["drafter_kind"] == "parallel_draft"
    assert main([*args, "--draft", "stdlib-pard-draft"]) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["drafter_kind"] == "parallel_draft"
    assert main([*args, "--drafter", "{method: ngram, num_speculative_tokens: 3}"]) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["num_speculative_tokens"] == 3
    assert main([*args, "--drafter", "{method: ngram, layers: 2}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specjax: error: ") and "does not take layers" in err and err.count("\n") == 1
