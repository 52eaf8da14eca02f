"""Bad input fails early (before any compilation) with a message that names the problem."""

from __future__ import annotations

import pytest
from conftest import TARGET_CONFIG, scaled_model

import specjax

PROMPTS = [[1, 2, 3]]


def _spec(target, draft, prompts=PROMPTS, num_speculative_tokens=2, max_new_tokens=4, temperature=0.0, **sampling):
    """Builds the settings here, inside the caller's pytest.raises: K, max_new_tokens, temperature, top_k and
    top_p are checked by SpeculativeConfig / GenerationConfig themselves, prompts and models by generate."""
    config = specjax.GenerationConfig.at_temperature(temperature, max_new_tokens=max_new_tokens, **sampling)
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=num_speculative_tokens)
    return specjax.generate(target, prompts, config, draft=draft, speculative=speculative)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_speculative_tokens=0), "num_speculative_tokens must be an integer >= 1"),
        (dict(num_speculative_tokens=2.5), "num_speculative_tokens must be an integer >= 1"),
        (dict(temperature=-0.1), "temperature must be >= 0"),
        (dict(temperature=float("nan")), "temperature must be >= 0"),
        (dict(temperature=1.0, top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(temperature=1.0, top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(temperature=1.0, top_k=0), "top_k must be >= 1"),
        (dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
        (dict(prompts=[]), "prompts is empty"),
        (dict(prompts=[[1, 2], []]), "prompt 1 is empty"),
        (dict(prompts=[1, 2, 3]), "prompt 0 must be a flat list of token ids"),
        (dict(prompts="hello"), "text prompts need a model with a tokenizer"),
        (dict(prompts=b"hello"), "prompts must be a list of token-id lists"),
        (dict(prompts=[[1, 48]]), r"token ids must lie in \[0, 48\)"),
        (dict(prompts=[[-1, 2]]), r"token ids must lie in \[0, 48\)"),
        (dict(prompts=[[1] * 200], max_new_tokens=60), "exceeds max_position_embeddings"),
    ],
)
def test_speculative_generate_rejects(target, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _spec(target, target, **kwargs)


def test_prompt_plus_headroom_counts_k(target):
    # 200 + 50 = 250 fits 256 for plain decoding, but not with K + 1 = 7 slots of headroom.
    specjax.generate(target, [[1] * 200], specjax.GenerationConfig(max_new_tokens=50))
    with pytest.raises(ValueError, match=r"headroom \(7\)"):
        _spec(target, target, prompts=[[1] * 200], max_new_tokens=50, num_speculative_tokens=6)


def test_vocab_mismatch(target):
    other = scaled_model(TARGET_CONFIG.replace(vocab_size=50), seed=1)
    with pytest.raises(ValueError, match="draft vocab_size 50 != target vocab_size 48"):
        _spec(target, other)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(temperature=-1.0), "temperature must be >= 0"),
        (dict(top_k=-3, temperature=1.0), "top_k must be >= 1"),
        (dict(max_new_tokens=-5), "max_new_tokens must be an integer >= 1"),
    ],
)
def test_generate_rejects(target, kwargs, message):
    with pytest.raises(ValueError, match=message):
        specjax.generate(target, PROMPTS, specjax.GenerationConfig.at_temperature(**kwargs))


def test_cache_none_means_the_default_layout():
    """HF reads None as "no preference": GenerationConfig(cache=None) is the default layout,
    not a None that the prefill meets first (a tree test once died there)."""
    assert specjax.GenerationConfig(cache=None).cache == specjax.CacheConfig()
    assert specjax.GenerationConfig(cache={"block_size": 4}).cache == specjax.CacheConfig(block_size=4)
    with pytest.raises(ValueError, match="cache must be a CacheConfig"):
        specjax.GenerationConfig(cache="bf16")


def test_bad_model_configs():
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        TARGET_CONFIG.replace(num_key_value_heads=3)
    with pytest.raises(ValueError, match="vocab_size must be >= 1"):
        TARGET_CONFIG.replace(vocab_size=0)
