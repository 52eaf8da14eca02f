"""The entry points before GenerationConfig stay for one release: each warns and gives exactly
what the new API gives for the same settings."""

from __future__ import annotations

import pytest
from conftest import RAGGED_PROMPTS

import specjax

NEW = 12


def test_old_entry_points_warn_and_match_the_new_api(target, noisy_draft):
    config = specjax.GenerationConfig(max_new_tokens=NEW, seed=3, eos_token_id=5)
    spec = specjax.SpeculativeConfig(num_speculative_tokens=3)
    plain = specjax.generate(target, RAGGED_PROMPTS, config)
    speculative = specjax.generate(target, RAGGED_PROMPTS, config, draft=noisy_draft, speculative=spec)
    old = dict(max_new_tokens=NEW, seed=3, eos_token_id=5)
    with pytest.warns(DeprecationWarning, match=r"use generate\(model, prompts, specjax.GenerationConfig"):
        assert specjax.generate(target, RAGGED_PROMPTS, **old).tokens == plain.tokens
    with pytest.warns(DeprecationWarning, match="generate"):
        assert specjax.generate(target, RAGGED_PROMPTS, NEW, seed=3, eos_token_id=5).tokens == plain.tokens
    with pytest.warns(DeprecationWarning, match="prepare_generate"):
        assert specjax.prepare_generate(target, RAGGED_PROMPTS, **old).run().tokens == plain.tokens
    with pytest.warns(DeprecationWarning, match="speculative_generate"):
        out = specjax.speculative_generate(target, noisy_draft, RAGGED_PROMPTS, 3, **old)
    assert out.tokens == speculative.tokens and out.stats == speculative.stats
    with pytest.warns(DeprecationWarning, match="prepare_speculative_generate"):
        prepared = specjax.prepare_speculative_generate(
            target, noisy_draft, RAGGED_PROMPTS, num_speculative_tokens=3, **old
        )
    assert prepared.run().tokens == speculative.tokens
    with pytest.warns(DeprecationWarning, match="init_speculative_state"):
        state = specjax.init_speculative_state(target, noisy_draft, RAGGED_PROMPTS, 3, **old)
    while not state.done.all():
        with pytest.warns(DeprecationWarning, match="speculative_step"):
            state = specjax.speculative_step(target, noisy_draft, state)
    assert specjax.state_output(state).tokens == speculative.tokens
    # The old temperature convention: 0 is greedy, > 0 samples (as GenerationConfig.at_temperature).
    sampled = specjax.generate(target, RAGGED_PROMPTS, specjax.GenerationConfig.at_temperature(1.0, max_new_tokens=NEW))
    with pytest.warns(DeprecationWarning):
        assert specjax.generate(target, RAGGED_PROMPTS, max_new_tokens=NEW, temperature=1.0).tokens == sampled.tokens
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_tokens'"):
        specjax.generate(target, RAGGED_PROMPTS, max_tokens=NEW)
