"""Attention over the filled cache only (blockwise, online softmax) and chunked prefill must
compute what full attention and a one-shot prefill compute."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TARGET_CONFIG, scaled_model
from specjax.models import forward as _forward
from specjax.models import full_forward as _full_forward
from specjax.models import init_cache
from specjax.models.attention import attend

import specjax
from specjax.core.loop import prefill

forward = jax.jit(_forward, static_argnums=0)
full_forward = jax.jit(_full_forward, static_argnums=0)
LONG = TARGET_CONFIG.replace(max_position_embeddings=8192)


def _random(shape, seed):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


@pytest.mark.parametrize("block", [1, 7, 16, 100])
@pytest.mark.parametrize("width", [1, 5, 40])
def test_blockwise_attend_equals_full(block, width):
    """Random q/k/v, ragged rows whose positions straddle block edges (S = 100 is not a
    multiple of 7 or 16, so the last block is read overlapping and partly masked)."""
    b, s, h, n_kv, hd = 3, 100, 4, 2, 8
    cache = init_cache(TARGET_CONFIG.replace(num_key_value_heads=n_kv, head_dim=hd), b, s)
    cache = cache.replace(k=_random(cache.k.shape, 1), v=_random(cache.v.shape, 2))
    starts = np.array([0, 15, 100 - width])  # a row at slot 0, one across a 16-block edge, one at the end
    positions = jnp.asarray(starts[:, None] + np.arange(width)[None, :], jnp.int32)
    q, k, v = _random((b, width, h, hd), 3), _random((b, width, n_kv, hd), 4), _random((b, width, n_kv, hd), 5)
    full_out, full_cache = jax.jit(attend, static_argnums=5)(q, k, v, positions, cache.replace(block_size=10**6), 1)
    out, blocked_cache = jax.jit(attend, static_argnums=5)(q, k, v, positions, cache.replace(block_size=block), 1)
    np.testing.assert_allclose(np.asarray(out), np.asarray(full_out), atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(blocked_cache.k), np.asarray(full_cache.k))


def test_blockwise_logits_equal_full_forward_at_every_width():
    model = scaled_model(LONG, seed=0, scale=4.0)
    tokens = np.random.default_rng(0).integers(0, LONG.vocab_size, size=(2, 70)).astype(np.int32)
    reference = np.asarray(full_forward(LONG, model.params, jnp.asarray(tokens)))  # one block of 70 < 256
    cache = init_cache(LONG, batch_size=2, max_length=96, block_size=8)
    pieces = []
    for start, stop in [(0, 29), (29, 33), *((t, t + 1) for t in range(33, 70))]:
        positions = jnp.broadcast_to(jnp.arange(start, stop, dtype=jnp.int32), (2, stop - start))
        logits, cache = forward(LONG, model.params, jnp.asarray(tokens[:, start:stop]), positions, cache)
        pieces.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block", [8, 256])
def test_bfloat16_cache_logits_are_float32_logits_with_rounded_kv(block):
    model = scaled_model(LONG, seed=4, scale=4.0)
    tokens = jnp.asarray(np.random.default_rng(5).integers(0, LONG.vocab_size, size=(2, 40)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(40, dtype=jnp.int32), (2, 40))
    wide, _ = forward(LONG, model.params, tokens, positions, init_cache(LONG, 2, 64, block_size=block))
    narrow, cache = forward(LONG, model.params, tokens, positions, init_cache(LONG, 2, 64, "bfloat16", block))
    assert cache.k.dtype == jnp.uint16
    wide, narrow = np.asarray(wide), np.asarray(narrow)
    assert 0 < np.abs(narrow - wide).max() < 0.05 * np.abs(wide).max()


@pytest.mark.parametrize("chunk", [8, 24, 64])
def test_chunked_prefill_equals_one_shot(chunk):
    model = scaled_model(LONG, seed=1, scale=4.0)
    prompt = np.random.default_rng(2).integers(0, LONG.vocab_size, size=(3, 64)).astype(np.int32)
    lengths = jnp.asarray([64, 30, 1], jnp.int32)
    one_shot = prefill(LONG, model.params, jnp.asarray(prompt), lengths, 128, specjax.CacheConfig(prefill_chunk=64))
    chunked = jax.jit(prefill, static_argnums=(0, 4, 5))(
        LONG, model.params, jnp.asarray(prompt), lengths, 128, specjax.CacheConfig(prefill_chunk=chunk, block_size=16)
    )
    for row, length in enumerate([64, 30, 1]):  # only slots below each row's length matter
        for got, want in ((chunked.k, one_shot.k), (chunked.v, one_shot.v)):
            np.testing.assert_allclose(
                np.asarray(got[:, row, :length]), np.asarray(want[:, row, :length]), atol=1e-5, rtol=1e-5
            )


@pytest.mark.parametrize("layout", [dict(block_size=8, prefill_chunk=16), dict(block_size=5, prefill_chunk=7)])
def test_generation_is_unchanged_by_blocks_and_chunks(target, noisy_draft, layout):
    prompts = [list(range(1, 40)), [4, 5, 6], [7] * 20]
    cache_config = specjax.CacheConfig(**layout)
    plain = specjax.generate(target, prompts, specjax.GenerationConfig(max_new_tokens=30))
    assert (
        specjax.generate(target, prompts, specjax.GenerationConfig(max_new_tokens=30, cache=cache_config)).tokens
        == plain.tokens
    )
    out = specjax.generate(
        target,
        prompts,
        specjax.GenerationConfig(max_new_tokens=30, cache=cache_config),
        draft=noisy_draft,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=3),
    )
    assert out.tokens == plain.tokens


def test_long_prompt_prefills_in_bounded_chunks():
    """A 6000-token prompt, prefilled 256 at a time, generates what a one-shot prefill does."""
    model = scaled_model(LONG, seed=2, scale=4.0)
    prompt = [list(np.random.default_rng(3).integers(0, LONG.vocab_size, size=6000))]
    chunked = specjax.generate(
        model, prompt, specjax.GenerationConfig(max_new_tokens=8, cache=specjax.CacheConfig(prefill_chunk=256))
    )
    one_shot = specjax.generate(
        model, prompt, specjax.GenerationConfig(max_new_tokens=8, cache=specjax.CacheConfig(prefill_chunk=8192))
    )
    assert chunked.tokens == one_shot.tokens and len(chunked.tokens[0]) == 8


def test_bfloat16_cache_for_float32_params(target):
    prompts = [[1, 2, 3, 4], [5, 6]]
    out = specjax.generate(
        target, prompts, specjax.GenerationConfig(max_new_tokens=12, cache=specjax.CacheConfig(dtype="bfloat16"))
    )
    state = specjax.init_state(
        target,
        prompts,
        specjax.GenerationConfig(cache=specjax.CacheConfig(dtype="bfloat16")),
        draft=target,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=2),
    )
    assert state.target_cache.dtype == "bfloat16" and state.draft_state.cache.dtype == "bfloat16"
    # Stored as bit patterns (an in-place integer scatter on CPU), read back as bfloat16.
    assert state.target_cache.k.dtype == jnp.uint16 and state.target_cache.num_bytes * 2 == (
        init_cache(target.config, 2, state.tokens.shape[1]).num_bytes
    )
    assert [len(t) for t in out.tokens] == [12, 12]
    with pytest.raises(ValueError, match=r"CacheConfig\.dtype must be"):
        specjax.CacheConfig(dtype="int8")
    with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
        specjax.CacheConfig(block_size=0)


def test_a_path_layout_gives_every_query_one_root_to_leaf_path_through_it():
    """models/tree_layout.py: each of a call's queries reads exactly one path, which runs
    from the root through that query's node to a leaf in depth order; the grouped order
    and its inverse put results back; parents after their children are refused."""
    from specjax.models import PathLayout

    parents = [-1, 0, 0, 1, 1, 2, 3]  # leaves 4, 5, 6
    layout = PathLayout.of(parents)
    assert sorted(t for g in layout.groups for t in g) == list(range(7))
    for path, group in zip(layout.paths, layout.groups, strict=True):
        assert path[0] == 0 and all(parents[path[d + 1]] == path[d] for d in range(len(path) - 1))
        assert all(t in path for t in group)
    assert len(layout.paths) == 3
    assert list(layout.order[layout.inverse]) == list(range(7))
    assert [b - a for a, b in layout.bounds] == [len(g) for g in layout.groups]
    level = PathLayout.of(parents, nodes=[3, 4])  # a call that feeds only nodes 3 and 4
    assert level.groups == ((0,), (1,)) and level.paths == ((0, 1, 3, 6), (0, 1, 4))
    with pytest.raises(ValueError, match="parents must come before their children"):
        PathLayout.of([-1, 2, 0])
