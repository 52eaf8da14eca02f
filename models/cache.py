"""The preallocated key/value cache shared by every model in specjax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

# Chosen by measurement (scripts/attention_blocks.py, results/attention_blocks): large enough
# that the per-block loop overhead vanishes, small enough that a short fill reads little
# beyond it. 256 until 2026-12-07, measured then on the 5M embedded target; on SmolLM2-135M
# a 256-slot block read 256 slots at a fill of 100, and 128 decoded 10-20% faster at batch 1
# (float32, int8), 44% at batch 8 (int8), and as fast or faster at fills to 3,000.
DEFAULT_BLOCK_SIZE = 128


@struct.dataclass
class KVCache:
    """Keys and values of every layer, written in place by slot = absolute position.

    A forward pass writes the K/V of its tokens at their positions, then each query at
    position p attends to slots 0..p. Everything at a slot > p is therefore invisible,
    which is why stale entries never need clearing: after a rejected draft, the rollback
    is `replace(lengths=...)` and the stale slots are overwritten by the next forward
    before any query can reach them.
    """

    k: jax.Array  # [layers, B, S, n_kv, d_head] in the storage dtype (see `dtype`)
    v: jax.Array  # [layers, B, S, n_kv, d_head]
    lengths: jax.Array  # [B] int32: slots 0..lengths-1 hold K/V of the committed sequence
    # Attention reads the cache in blocks of this many slots, and only the blocks below the
    # highest query position (models/attention.py): cost follows the fill, not S.
    block_size: int = struct.field(pytree_node=False, default=DEFAULT_BLOCK_SIZE)
    # The K/V element dtype. 16-bit floats are stored as their uint16 bit patterns: XLA:CPU
    # has no native bfloat16 scatter and rewrites the whole buffer through float32 on every
    # write (1.8 ms per step for 6 layers x 8192 slots, against 2 us in place), while an
    # integer scatter updates in place. The bitcast is free on every backend.
    dtype: str = struct.field(pytree_node=False, default="float32")

    @property
    def storage_bits(self) -> bool:
        return self.k.dtype == jnp.uint16

    def encode(self, x: jax.Array) -> jax.Array:
        """Values -> storage: cast to `dtype`, then to its bit pattern if 16-bit."""
        x = x.astype(self.dtype)
        return jax.lax.bitcast_convert_type(x, jnp.uint16) if self.storage_bits else x

    def decode(self, x: jax.Array) -> jax.Array:
        """Storage -> values in `dtype` (a slice of k or v)."""
        return jax.lax.bitcast_convert_type(x, jnp.dtype(self.dtype)) if self.storage_bits else x

    def move(self, src: jax.Array, dst: jax.Array) -> KVCache:
        """Copy the K/V of slots src [B, n] to slots dst [B, n] in every layer.

        How a tree round commits: the accepted nodes' K/V move from their tree slots to the
        slots of their positions, so the next round sees a plain prefix. Destinations past
        the cache end are dropped (a row that accepted fewer than n nodes points the rest
        there). All sources are read before any destination is written.
        """
        rows = jnp.arange(self.k.shape[1])[:, None]  # [B, 1]
        moved_k = self.k[:, rows, src]  # [layers, B, n, n_kv, d_head]
        moved_v = self.v[:, rows, src]
        return self.replace(
            k=self.k.at[:, rows, dst].set(moved_k, mode="drop"),
            v=self.v.at[:, rows, dst].set(moved_v, mode="drop"),
        )

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
    """An empty cache for `config` (a ModelConfig): `max_length` slots per row (rounded up
    to whole blocks in the bfloat16 and int8 weight formats).

    dtype: the K/V storage dtype (default: the params' dtype). A narrower cache (bfloat16
    for float32 params) halves the bytes attention reads; K/V are cast on write and read.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if getattr(config, "weights", "float32") != "float32":
        # The bfloat16 and int8 formats attend blockwise over whole blocks only (attention.py),
        # so that a row's attention does not depend on the cache length either: plain decoding
        # and a verify, whose caches differ by K + 1 slots, then sum the same blocks in the
        # same order. Up to block_size - 1 slots more per row.
        max_length = -(-max_length // block_size) * block_size
    shape = (
        config.num_hidden_layers,
        batch_size,
        max_length,
        config.num_key_value_heads,
        config.resolved_head_dim,
    )
    dtype = jnp.dtype(config.dtype if dtype is None else dtype)
    storage = jnp.uint16 if dtype.itemsize == 2 else dtype
    return KVCache(
        k=jnp.zeros(shape, storage),
        v=jnp.zeros(shape, storage),
        lengths=jnp.zeros((batch_size,), jnp.int32),
        block_size=block_size,
        dtype=dtype.name,
    )
