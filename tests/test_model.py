"""The model and its cache: incremental decoding must reproduce one full forward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TARGET_CONFIG, scaled_model
from specjax.models import forward as _forward
from specjax.models import full_forward as _full_forward
from specjax.models import init_cache

import specjax

# Jitted once per config: eager op-by-op dispatch of the model would dominate test time.
forward = jax.jit(_forward, static_argnums=0)
full_forward = jax.jit(_full_forward, static_argnums=0)

CONFIGS = {
    "gqa_untied": TARGET_CONFIG,
    "mha_tied_bias_theta": TARGET_CONFIG.replace(
        num_key_value_heads=4, tie_word_embeddings=True, attention_bias=True, rope_theta=500.0
    ),
    "mqa_head_dim": TARGET_CONFIG.replace(num_key_value_heads=1, head_dim=16),
}


def _random_tokens(batch, length, vocab, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, size=(batch, length)).astype(np.int32)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_incremental_decode_matches_full_forward(name):
    config = CONFIGS[name]
    model = scaled_model(config, seed=0, scale=4.0)
    if config.attention_bias:  # zero-initialised biases would test nothing
        model.params["layers"][0]["attn"]["k_bias"] = jnp.full_like(model.params["layers"][0]["attn"]["k_bias"], 0.5)
    tokens = _random_tokens(3, 12, config.vocab_size)
    full = np.asarray(full_forward(config, model.params, jnp.asarray(tokens)))

    # Prefill 5 tokens, then a width-3 chunk, then single tokens: every width the
    # generation loops use, each writing its own slots of one preallocated cache.
    cache = init_cache(config, batch_size=3, max_length=32)
    pieces = []
    for start, stop in [(0, 5), (5, 8), *((t, t + 1) for t in range(8, 12))]:
        positions = jnp.broadcast_to(jnp.arange(start, stop, dtype=jnp.int32), (3, stop - start))
        logits, cache = forward(config, model.params, jnp.asarray(tokens[:, start:stop]), positions, cache)
        pieces.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=2e-5, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(cache.lengths), [12, 12, 12])


def test_stale_slots_beyond_the_query_are_invisible(target):
    """Rollback is a length change: garbage written past a position must not change its logits."""
    config = target.config
    tokens = _random_tokens(2, 10, config.vocab_size, seed=1)
    reference = np.asarray(full_forward(config, target.params, jnp.asarray(tokens)))

    cache = init_cache(config, batch_size=2, max_length=16)
    positions = jnp.broadcast_to(jnp.arange(10, dtype=jnp.int32), (2, 10))
    garbage = _random_tokens(2, 10, config.vocab_size, seed=2)
    _, cache = forward(config, target.params, jnp.asarray(garbage), positions, cache)  # a rejected "draft"
    # Re-feed the real sequence one position at a time over the stale slots.
    for t in range(10):
        logits, cache = forward(
            config, target.params, jnp.asarray(tokens[:, t : t + 1]), positions[:, t : t + 1], cache
        )
        np.testing.assert_allclose(np.asarray(logits[:, 0]), reference[:, t], atol=2e-5, rtol=1e-5)


def test_per_row_positions_in_one_batch(target):
    """Rows of a batch may sit at different positions (ragged prompts)."""
    config = target.config
    tokens = _random_tokens(2, 9, config.vocab_size, seed=4)
    reference = np.asarray(full_forward(config, target.params, jnp.asarray(tokens)))
    cache = init_cache(config, batch_size=2, max_length=16)
    # Row 0 prefills 4 tokens, row 1 prefills 7; both then decode 2 more from their own offsets.
    prefill = np.zeros((2, 7), np.int32)
    prefill[0, :4], prefill[1, :7] = tokens[0, :4], tokens[1, :7]
    positions = jnp.broadcast_to(jnp.arange(7, dtype=jnp.int32), (2, 7))
    _, cache = forward(config, target.params, jnp.asarray(prefill), positions, cache)
    offsets = np.array([4, 7])
    for step in range(2):
        pos = offsets + step
        step_tokens = tokens[np.arange(2), pos][:, None]
        logits, cache = forward(config, target.params, jnp.asarray(step_tokens), jnp.asarray(pos[:, None]), cache)
        np.testing.assert_allclose(np.asarray(logits[:, 0]), reference[np.arange(2), pos], atol=2e-5, rtol=1e-5)


def test_logits_api_and_parameter_count(target):
    tokens = _random_tokens(2, 6, target.config.vocab_size)
    out = specjax.io.model.logits(target, tokens)
    assert out.shape == (2, 6, target.config.vocab_size) and out.dtype == np.float32
    assert target.num_parameters == target.config.num_parameters
    with pytest.raises(ValueError, match="token ids must lie in"):
        specjax.io.model.logits(target, [[0, target.config.vocab_size]])
