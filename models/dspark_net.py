"""DSpark (DeepSeek 2026, arXiv 2607.05147): a DFlash-style block head (models/block_net.py)
plus a low-rank Markov head and a confidence head, as pure functions.

The block head's one pass gives, for each block output i, a state h_i [.., D] (the output
before the final norm). DSpark lets output i (i >= 1) also read the token drafted at i - 1:

    z_i      = h_i + (emb(d_{i-1}) @ down) @ up          down [D, r], up [r, D], r small
    logits_i = lm_head(final_norm(z_i))                   the block head's own tail
    c_i      = sigmoid(final_norm(z_i) . w + b)           P(d_i survives | d_<i survived)

Output 0 has no Markov term: the token before it is the anchor, which the block already
reads. `up` starts at zero, so an untrained Markov term changes nothing (the head is then
the block head exactly); `w` and `b` start at zero (c = 1/2). emb is the target's
embedding, the one the block already borrows: the Markov head adds 2 D r parameters.

Drafting is then sequential over the K outputs, but only through this rank-r term, a norm
and the LM head: the block's layers still run once (drafters/dspark.py).

Like the rest of models/, this file imports only jax, numpy and its siblings.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .block_net import final_state, head_logits, init_block_head_params
from .config import ModelConfig
from .heads import target_embedding


def init_dspark_extras(config: ModelConfig, rank: int, seed: int = 0) -> dict:
    """{"markov": {"down": [D, r], "up": [r, D] zeros}, "confidence": {"w": [D] zeros, "b": [1]
    zeros}}: the two heads DSpark adds to a block head's params."""
    if rank < 1:
        raise ValueError(f"the Markov head's rank must be >= 1, got {rank}")
    d, dtype = config.hidden_size, jnp.dtype(config.dtype)
    # down scaled so that an embedding row of any scale maps to an O(1) r-vector; up = 0
    # keeps the untrained head the block head (and gives down no gradient until up moves,
    # as LoRA's B = 0).
    down = jax.random.normal(jax.random.key(seed + 3), (d, rank), dtype) / np.sqrt(d)
    return {
        "markov": {"down": down, "up": jnp.zeros((rank, d), dtype)},
        "confidence": {"w": jnp.zeros((d,), dtype), "b": jnp.zeros((1,), dtype)},
    }


def init_dspark_params(
    config: ModelConfig,
    num_features: int,
    rank: int,
    seed: int = 0,
    target_params: dict | None = None,
    draft_vocab_size: int = 0,
) -> dict:
    """A block head's params (`init_block_head_params`) plus `init_dspark_extras`."""
    params = init_block_head_params(config, num_features, seed, target_params, draft_vocab_size)
    return {**params, **init_dspark_extras(config, rank, seed)}


def markov_rank(params: dict) -> int:
    """r: the Markov head's rank."""
    return int(np.shape(params["markov"]["down"])[-1])


def markov_state(params: dict, target_params: dict, hidden, previous, use):
    """z = h + (emb(previous) @ down) @ up where `use`, else h: hidden [.., D], previous [..]
    int32 (the token drafted at the output before), use: a bool broadcasting to previous's
    shape (False at output 0). -> [.., D] in hidden's dtype."""
    e = target_embedding(target_params, previous, hidden.dtype)  # [.., D]
    m = params["markov"]
    low = jnp.einsum("...d,dr->...r", e, m["down"].astype(hidden.dtype))  # [.., r]
    term = jnp.einsum("...r,rd->...d", low, m["up"].astype(hidden.dtype))  # [.., D]
    return jnp.where(jnp.asarray(use)[..., None], hidden + term, hidden)


def confidence_logit(params: dict, normed):
    """The confidence head before its sigmoid: normed [.., D] -> float32 [..]."""
    c = params["confidence"]
    x = normed.astype(jnp.float32)
    return jnp.einsum("...d,d->...", x, c["w"].astype(jnp.float32)) + c["b"].astype(jnp.float32)[0]


def dspark_outputs(config: ModelConfig, params: dict, target_params: dict, z):
    """(logits [.., V] float32, confidence [..] float32 in (0, 1)) of states z [.., D] (after
    `markov_state`)."""
    normed = final_state(config, params, target_params, z)
    return head_logits(config, params, target_params, normed), jax.nn.sigmoid(confidence_logit(params, normed))
