"""Pieces shared by the plain and the speculative generation loops."""

from __future__ import annotations

import jax.numpy as jnp

from specjax.models import KVCache, ModelConfig, forward, init_cache


def prefill(config: ModelConfig, params, prompt, prompt_lengths, cache_length: int) -> KVCache:
    """Write the K/V of right-padded prompts [B, T_bucket] into a fresh cache.

    Padding slots (>= a row's prompt length) receive garbage K/V; they lie beyond every
    query of the next forward and are overwritten before any query can see them. The
    logits are not needed: each step re-feeds the last committed token, so the first
    step's forward yields the first next-token distribution.
    """
    b, t = prompt.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    _, cache = forward(config, params, prompt, positions, init_cache(config, b, cache_length))
    return cache.replace(lengths=prompt_lengths)


def token_buffer(prompt, cache_length: int):
    """[B, T_bucket] prompt -> [B, cache_length] buffer holding prompt + generated tokens."""
    return jnp.pad(prompt, ((0, 0), (0, cache_length - prompt.shape[1])))


def gather_tokens(tokens, positions):
    """tokens [B, S], positions [B, W] -> [B, W]."""
    return jnp.take_along_axis(tokens, positions, axis=1)


def commit(tokens, lengths, prompt_lengths, done, candidates, num_new, max_new_tokens, eos_token_id):
    """Append the first `num_new` of `candidates` to every live row.

    tokens [B, S]; lengths, prompt_lengths, num_new [B]; done [B] bool; candidates [B, W].
    The appended run is cut after the first EOS (kept) and at max_new_tokens; finished
    rows append nothing. Returns (tokens, lengths, done).
    """
    width = candidates.shape[1]
    j = jnp.arange(width)[None, :]  # [1, W]
    remaining = max_new_tokens - (lengths - prompt_lengths)
    count = jnp.where(done, 0, jnp.minimum(num_new, remaining))  # [B]
    is_eos = (candidates == eos_token_id) & (j < count[:, None])  # eos_token_id -1 never matches
    hit_eos = jnp.any(is_eos, axis=1)
    count = jnp.where(hit_eos, jnp.argmax(is_eos, axis=1) + 1, count)
    # Slots of tokens that do not count point past the end and are dropped by the scatter.
    slots = jnp.where(j < count[:, None], lengths[:, None] + j, tokens.shape[1])
    rows = jnp.arange(tokens.shape[0])[:, None]
    tokens = tokens.at[rows, slots].set(candidates, mode="drop")
    lengths = lengths + count
    done = done | hit_eos | (lengths - prompt_lengths >= max_new_tokens)
    return tokens, lengths, done
