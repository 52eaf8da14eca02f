"""The embedded pair ships with the package and works offline with no arguments."""

from __future__ import annotations

import pytest

import specjax
from specjax.io.embedded import default_pair, embedded_names
from specjax.io.tokenizer import ByteTokenizer
from specjax.training.data import held_out_prompts


@pytest.fixture(scope="module")
def pair():
    return specjax.load_model("stdlib-target"), specjax.load_model("stdlib-draft")


def test_default_pair_is_the_embedded_one(pair):
    target, draft = pair
    assert {"stdlib-target", "stdlib-draft"} <= set(embedded_names())
    assert default_pair() == ("stdlib-target", "stdlib-draft")
    assert isinstance(target.tokenizer, ByteTokenizer) and isinstance(draft.tokenizer, ByteTokenizer)
    assert 5_000_000 <= target.num_parameters <= 20_000_000
    assert draft.num_parameters <= target.num_parameters / 10


def test_trained_pair_agrees_on_held_out_code(pair):
    """A trained draft tracks its target: far above the ~1.0 of an unrelated random pair."""
    target, draft = pair
    prompts = held_out_prompts("code", 4)
    config = specjax.GenerationConfig(max_new_tokens=32)
    out = specjax.generate(
        target, prompts, config, draft=draft, speculative=specjax.SpeculativeConfig(num_speculative_tokens=4)
    )
    assert out.stats.mean_acceptance_length > 2.0
    assert out.tokens == specjax.generate(target, prompts, config).tokens
