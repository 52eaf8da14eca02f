"""Pieces shared by the plain and the speculative generation loops."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models import KVCache, ModelConfig, feature_width, forward, init_cache
from specjax.models.cache import DEFAULT_BLOCK_SIZE


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """How a generation lays out and fills its KV caches (static: part of the jit key).

    dtype: K/V storage dtype, e.g. "bfloat16" for float32 params (half the bytes attention
      reads); None stores each model's params dtype.
    block_size: attention reads the cache in blocks of this many slots, and only the
      blocks below the highest position of a forward (models/attention.py).
    prefill_chunk: prompts longer than this are prefilled in chunks of this many tokens,
      one compiled chunk reused, so memory stays bounded for any prompt length.
    """

    dtype: str | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    prefill_chunk: int = 512

    def __post_init__(self):
        if self.dtype is not None and self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"CacheConfig.dtype must be float32, bfloat16, float16 or None, got {self.dtype!r}")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"CacheConfig.block_size must be an integer >= 1, got {self.block_size!r}")
        if not isinstance(self.prefill_chunk, int) or self.prefill_chunk < 1:
            raise ValueError(f"CacheConfig.prefill_chunk must be an integer >= 1, got {self.prefill_chunk!r}")


DEFAULT_CACHE = CacheConfig()


def prefill(
    config: ModelConfig,
    params,
    prompt,
    prompt_lengths,
    cache_length: int,
    cache: CacheConfig = DEFAULT_CACHE,
    features: bool | tuple[int, ...] = False,
    kv: KVCache | None = None,
) -> KVCache | tuple[KVCache, jax.Array]:
    """Write the K/V of right-padded prompts [B, T_bucket] into a fresh cache (`kv`: one made
    by `empty_cache` and donated to the caller's program; None: one made here).

    Padding slots (>= a row's prompt length) receive garbage K/V; they lie beyond every
    query of the next forward and are overwritten before any query can see them. The
    logits are not needed (XLA drops the LM head): each step re-feeds the last committed
    token, so the first step's forward yields the first next-token distribution.

    A prompt longer than `cache.prefill_chunk` is fed in chunks of that width, in a
    `fori_loop` over the chunks below the longest prompt: each chunk attends to the cache
    written so far plus itself, so memory is O(chunk x block), not O(T x S). When the
    chunk does not divide T the last one starts at T - chunk and rewrites a few slots
    with the K/V they already hold.

    Returns the cache, or with `features` (cache, hidden states [B, T_bucket, D] of every
    prompt position: what a feature-conditioned draft head starts from; [B, T_bucket, n * D]
    for a tuple of n layer indices, as `forward` takes them).
    """
    b, t = prompt.shape
    if kv is None:
        kv = init_cache(config, b, cache_length, dtype=cache.dtype, block_size=cache.block_size)
    if t <= cache.prefill_chunk:
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        out = forward(config, params, prompt, positions, kv, features=features)
        kv = out[1].replace(lengths=prompt_lengths)
        return (kv, out[2]) if features else kv
    chunk = cache.prefill_chunk

    def body_fn(i, carry):
        kv, hidden = carry
        start = jnp.minimum(i * chunk, t - chunk)
        tokens = jax.lax.dynamic_slice_in_dim(prompt, start, chunk, axis=1)  # [B, chunk]
        positions = jnp.broadcast_to(start + jnp.arange(chunk, dtype=jnp.int32), (b, chunk))
        out = forward(config, params, tokens, positions, kv, features=features)
        if features:
            hidden = jax.lax.dynamic_update_slice_in_dim(hidden, out[2].astype(hidden.dtype), start, axis=1)
        return out[1], hidden

    hidden = jnp.zeros((b, t, feature_width(config, features)), jnp.dtype(config.dtype)) if features else None
    num_chunks = (jnp.max(prompt_lengths) + chunk - 1) // chunk
    kv, hidden = jax.lax.fori_loop(0, num_chunks, body_fn, (kv, hidden))
    kv = kv.replace(lengths=prompt_lengths)
    return (kv, hidden) if features else kv


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def empty_cache(config: ModelConfig, batch: int, cache_length: int, cache: CacheConfig = DEFAULT_CACHE) -> KVCache:
    """A zeroed cache made by a program of its own, for a prefill that receives it donated.

    Why not zeros inside the prefill's program: XLA:CPU then writes each layer's K/V into the
    zero-filled buffer out of place, a pass over the whole cache per write (60 writes into a
    377 MB SmolLM2 cache of 8,128 slots cost 0.77 s, against 8 ms into a donated buffer;
    scripts/cache_capacity.py), so a long cache cost in proportion to its capacity.
    """
    return init_cache(config, batch, cache_length, dtype=cache.dtype, block_size=cache.block_size)


def token_buffer(prompt, cache_length: int):
    """[B, T_bucket] prompt -> [B, cache_length] buffer holding prompt + generated tokens."""
    return jnp.pad(prompt, ((0, 0), (0, cache_length - prompt.shape[1])))


def gather_tokens(tokens, positions):
    """tokens [B, S], positions [B, W] -> [B, W]."""
    return jnp.take_along_axis(tokens, positions, axis=1)


def eos_ids(eos_token_id) -> np.ndarray:
    """[E] int32 stop tokens from None, an id or a list of ids; [-1] (matches nothing) for none."""
    ids = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int | np.integer) else eos_token_id
    return np.asarray(list(ids) or [-1], np.int32)


def commit(tokens, lengths, prompt_lengths, done, candidates, num_new, max_new_tokens, eos_token_ids):
    """Append the first `num_new` of `candidates` to every live row.

    tokens [B, S]; lengths, prompt_lengths, num_new [B]; done [B] bool; candidates [B, W];
    eos_token_ids [E] (-1 entries match nothing). The appended run is cut after the first
    stop token (kept) and at max_new_tokens; finished rows append nothing. Returns
    (tokens, lengths, done).
    """
    width = candidates.shape[1]
    j = jnp.arange(width)[None, :]  # [1, W]
    remaining = max_new_tokens - (lengths - prompt_lengths)
    count = jnp.where(done, 0, jnp.minimum(num_new, remaining))  # [B]
    stops = jnp.any(candidates[:, :, None] == eos_token_ids[None, None, :], axis=-1)  # [B, W]
    is_eos = stops & (j < count[:, None])
    hit_eos = jnp.any(is_eos, axis=1)
    count = jnp.where(hit_eos, jnp.argmax(is_eos, axis=1) + 1, count)
    # Slots of tokens that do not count point past the end and are dropped by the scatter.
    slots = jnp.where(j < count[:, None], lengths[:, None] + j, tokens.shape[1])
    rows = jnp.arange(tokens.shape[0])[:, None]
    tokens = tokens.at[rows, slots].set(candidates, mode="drop")
    lengths = lengths + count
    done = done | hit_eos | (lengths - prompt_lengths >= max_new_tokens)
    return tokens, lengths, done
