"""A packed call (models.Packed) computes only the tokens it admits, a prefix of each row, as
one row of products: at those tokens it must give what the whole call gives, logits,
features and the K/V written to the cache, for every family that runs the shared decoder,
on the full and the blockwise attention paths."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TARGET_CONFIG, scaled_model
from specjax.models import Packed, TreeMask, forward, init_cache

CONFIGS = {
    "llama": TARGET_CONFIG,
    "qwen3_window": TARGET_CONFIG.replace(model_type="qwen3", head_dim=16, sliding_window=6),
    "gemma3": TARGET_CONFIG.replace(
        model_type="gemma3_text",
        query_pre_attn_scalar=8.0,
        rope_local_base_freq=100.0,
        sliding_window=5,
        layer_types=("sliding_attention", "full_attention"),
    ),
    "mixtral": TARGET_CONFIG.replace(model_type="mixtral", num_experts=3, num_experts_per_tok=2),
}
LENGTHS = [9, 5, 7]  # committed tokens per row before the call
WIDTHS = [4, 1, 0]  # tokens admitted per row (the last row is done: none)
T = 4


def _call(config, params, tokens, positions, cache, packed):
    return jax.jit(forward, static_argnums=0, static_argnames="features")(
        config, params, tokens, positions, cache, features=(0, 1), packed=packed
    )


def _packed(bucket: int) -> Packed:
    admitted = [b * T + j for b, w in enumerate(WIDTHS) for j in range(w)]
    index = admitted + [admitted[-1]] * (bucket - len(admitted))  # a bucket filled by repeats
    return Packed(index=jnp.asarray(index, jnp.int32), shape=(len(WIDTHS), T))


@pytest.mark.parametrize("block_size", [256, 4], ids=["full", "blockwise"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_packed_call_gives_the_whole_calls_admitted_tokens(name, block_size):
    config = CONFIGS[name]
    params = scaled_model(config, seed=1, scale=4.0).params
    rng = np.random.default_rng(0)
    b = len(LENGTHS)
    cache = init_cache(config, b, 32, block_size=block_size)
    prefix = jnp.asarray(rng.integers(0, config.vocab_size, (b, max(LENGTHS))), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(max(LENGTHS), dtype=jnp.int32), prefix.shape)
    _, cache = jax.jit(forward, static_argnums=0)(config, params, prefix, positions, cache)
    # The call: T tokens from each row's last committed one, as a verify round feeds them.
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (b, T)), jnp.int32)
    positions = jnp.asarray(LENGTHS)[:, None] - 1 + jnp.arange(T)[None, :]
    want, want_cache, want_features = _call(config, params, tokens, positions, cache, None)
    got, got_cache, got_features = _call(config, params, tokens, positions, cache, _packed(6))
    for row, width in enumerate(WIDTHS):
        np.testing.assert_allclose(got[row, :width], want[row, :width], atol=2e-5, rtol=1e-5)
        np.testing.assert_allclose(got_features[row, :width], want_features[row, :width], atol=2e-5, rtol=1e-5)
        assert not np.any(np.asarray(got[row, width:]))  # the tokens left out: zeros
        slots = np.asarray(positions[row, :width])
        for name_kv in ("k", "v"):
            np.testing.assert_allclose(
                np.asarray(getattr(got_cache, name_kv))[:, row, slots],
                np.asarray(getattr(want_cache, name_kv))[:, row, slots],
                atol=2e-5,
                rtol=1e-5,
            )
    # A token that sees one it should not (a row's admitted tokens not a prefix) would differ:
    # admitting row 0's tokens 1..3 without its first changes what they attend to.
    wrong = Packed(index=jnp.asarray([1, 2, 3], jnp.int32), shape=(b, T))
    bad, _, _ = _call(config, params, tokens, positions, cache, wrong)
    assert np.max(np.abs(np.asarray(bad[0, 1:4]) - np.asarray(want[0, 1:4]))) > 1e-3


def test_a_packed_call_refuses_a_tree_and_gpt2():
    zeros = jnp.zeros((1, 2), jnp.int32)
    gpt2 = TARGET_CONFIG.replace(model_type="gpt2", num_key_value_heads=4)
    with pytest.raises(ValueError, match="packed"):
        forward(gpt2, {}, zeros, zeros, None, packed=_packed(6))
    tree = TreeMask(start=jnp.zeros((1,), jnp.int32), slots=zeros, visible=jnp.ones((2, 2), bool))
    with pytest.raises(ValueError, match="packed"):
        forward(TARGET_CONFIG, {}, zeros, zeros, None, tree=tree, packed=_packed(6))
    with pytest.raises(ValueError, match="Packed says"):  # tokens of another shape than the Packed's
        forward(TARGET_CONFIG, {}, zeros, zeros, None, packed=_packed(6))
