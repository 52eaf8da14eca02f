"""The preallocated key/value cache shared by every model in specjax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

# Chosen by measurement (scripts/attention_blocks.py, README "Attention over the filled
# cache"): large enough that the per-block loop overhead vanishes, small enough that a
# short fill in a long cache reads little beyond it.
DEFAULT_BLOCK_SIZE = 256


@struct.dataclass
class KVCache:
    """Keys and values of every layer, written in place by slot = absolute position.

    A forward pass writes the K/V of its tokens at their positions, then each query at
    position p attends to slots 0..p. Everything at a slot > p is therefore invisible,
    which is why stale entries never need clearing: after a rejected draft, the rollback
    is `replace(lengths=...)` and the stale slots are overwritten by the next forward
    before any query can reach them.
    """

    k: jax.Array  # [layers, B, S, n_kv, d_head]
    v: jax.Array  # [layers, B, S, n_kv, d_head]
    lengths: jax.Array  # [B] int32: slots 0..lengths-1 hold K/V of the committed sequence
    # Attention reads the cache in blocks of this many slots, and only the blocks below the
    # highest query position (models/attention.py): cost follows the fill, not S.
    block_size: int = struct.field(pytree_node=False, default=DEFAULT_BLOCK_SIZE)

    @property
    def max_length(self) -> int:
        return self.k.shape[2]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def num_bytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


def init_cache(config, batch_size: int, max_length: int, dtype=None, block_size: int = DEFAULT_BLOCK_SIZE) -> KVCache:
    """An empty cache for `config` (a ModelConfig): `max_length` slots per row.

    dtype: the K/V storage dtype (default: the params' dtype). A narrower cache (bfloat16
    for float32 params) halves the bytes attention reads; K/V are cast on write and read.
    """
    shape = (
        config.num_hidden_layers,
        batch_size,
        max_length,
        config.num_key_value_heads,
        config.resolved_head_dim,
    )
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    dtype = jnp.dtype(config.dtype if dtype is None else dtype)
    return KVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        lengths=jnp.zeros((batch_size,), jnp.int32),
        block_size=block_size,
    )
