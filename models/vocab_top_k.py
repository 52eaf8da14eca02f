"""top_k over a vocabulary axis that XLA:CPU keeps as a top_k.

Fused with the ops that read its result (a mask, a beam over its rows), XLA:CPU lowers a
top_k as a full sort of the axis: on SmolLM2's 49,152 logits that took 40 ms where the
top_k alone takes under 0.5 ms (results/smollm2_e8_block_family). An optimization barrier
on its outputs keeps it out of the fusion; the values and indices are the same.
"""

from __future__ import annotations

import jax


def top_k(x, k: int):
    """(values, indices) [..., k] of x [..., V], as jax.lax.top_k (ties to the lower index)."""
    return jax.lax.optimization_barrier(jax.lax.top_k(x, k))
