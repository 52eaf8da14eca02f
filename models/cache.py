"""The preallocated key/value cache shared by every model in specjax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


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

    @property
    def max_length(self) -> int:
        return self.k.shape[2]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def num_bytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


def init_cache(config, batch_size: int, max_length: int) -> KVCache:
    """An empty cache for `config` (a ModelConfig): `max_length` slots per row."""
    shape = (
        config.num_hidden_layers,
        batch_size,
        max_length,
        config.num_key_value_heads,
        config.resolved_head_dim,
    )
    dtype = jnp.dtype(config.dtype)
    return KVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        lengths=jnp.zeros((batch_size,), jnp.int32),
    )
