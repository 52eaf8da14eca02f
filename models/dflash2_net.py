"""DFlash 2 (z-lab / Inco 2026): a DFlash-style block head (models/block_net.py) plus a short
dynamic convolution across block positions and a selector over the block's top paths, as
pure functions.

What is published of DFlash 2 is its outline ("top-16 path selector + two-tap dynamic conv",
+14-25% acceptance length over DFlash at 1-2% of a cycle); the shapes below are this
project's choices, each the smallest that fits the outline.

Local convolution. The block head's one pass gives a state h_i [.., D] per output i (before
the final norm). A causal two-tap dynamic convolution (Wu et al. 2019: the kernel is
predicted from the state itself, softmax-normalised over its taps, shared within each of G
channel groups) mixes each output with the one before it:

    k_i  = softmax_taps(rms(h_i) @ kernel + bias)          [.., G, 2]
    z_i  = h_i + gamma * (k_i0 * h_{i-1} + k_i1 * h_i)      h_{-1} = 0 (the causal pad)
    logits_i = lm_head(final_norm(z_i))

gamma [D] starts at zero, so an untrained convolution changes nothing: the head is then the
block head exactly (as DSpark's `up`).

Path selector. From the K outputs' log-probabilities, a beam search keeps the P paths of
highest sum (each position extended by its top `branch` tokens): path 0 is the per-position
argmax, the block head's own proposal. A selector rescores them with a low-rank pairwise
term, what the block's independent outputs cannot express (which token fits after which):

    s(path) = sum_i lp_i(d_i) + sum_i (u(d_{i-1}) + c(z_i)) . v(d_i)     d_{-1} = the anchor
    u(a) = rms(emb(a)) @ prev,  c(z) = final_norm(z) @ context,  v(b) = rms(emb(b)) @ next

with prev, context, next [D, r]; `next` starts at zero (s is then the beam's own score and
path 0 wins, the block head's proposal). emb is the target's embedding, the one the block
already borrows.

Like the rest of models/, this file imports only jax, numpy and its siblings.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .block_net import final_state, head_logits, init_block_head_params
from .config import ModelConfig
from .heads import target_embedding
from .vocab_top_k import top_k

_EPS = 1e-6


def init_dflash2_extras(config: ModelConfig, rank: int, groups: int, seed: int = 0) -> dict:
    """{"conv": {"kernel" [D, 2G], "bias" [2G] zeros, "gamma" [D] zeros}, "selector": {"prev",
    "context" [D, r], "next" [D, r] zeros}}: what DFlash 2 adds to a block head's params."""
    d, dtype = config.hidden_size, jnp.dtype(config.dtype)
    if rank < 1:
        raise ValueError(f"the selector's rank must be >= 1, got {rank}")
    if groups < 1 or d % groups:
        raise ValueError(f"the convolution's groups must divide the hidden size {d}, got {groups}")
    keys = jax.random.split(jax.random.key(seed + 5), 3)
    # Unit-size normalised inputs map to O(1) kernel logits and r-vectors; gamma = 0 and
    # next = 0 keep the untrained head the block head (their partners train once they move).
    return {
        "conv": {
            "kernel": jax.random.normal(keys[0], (d, 2 * groups), dtype) / np.sqrt(d),
            "bias": jnp.zeros((2 * groups,), dtype),
            "gamma": jnp.zeros((d,), dtype),
        },
        "selector": {
            "prev": jax.random.normal(keys[1], (d, rank), dtype) / np.sqrt(d),
            "context": jax.random.normal(keys[2], (d, rank), dtype) / np.sqrt(d),
            "next": jnp.zeros((d, rank), dtype),
        },
    }


def init_dflash2_params(
    config: ModelConfig,
    num_features: int,
    rank: int,
    groups: int,
    seed: int = 0,
    target_params: dict | None = None,
    draft_vocab_size: int = 0,
) -> dict:
    """A block head's params (`init_block_head_params`) plus `init_dflash2_extras`."""
    params = init_block_head_params(config, num_features, seed, target_params, draft_vocab_size)
    return {**params, **init_dflash2_extras(config, rank, groups, seed)}


def _rms(x):
    x32 = x.astype(jnp.float32)
    return x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + _EPS)


def local_conv(params: dict, hidden):
    """z [.., K, D] of the block's states hidden [.., K, D]: the two-tap dynamic convolution
    over the K axis, output 0's earlier tap reading zeros. In hidden's dtype."""
    c = params["conv"]
    groups = c["bias"].shape[0] // 2
    *lead, k, d = hidden.shape
    logits = jnp.einsum("...d,dt->...t", _rms(hidden), c["kernel"].astype(jnp.float32)) + c["bias"].astype(jnp.float32)
    taps = jax.nn.softmax(logits.reshape(*lead, k, groups, 2), axis=-1)  # [.., K, G, 2]
    previous = jnp.concatenate([jnp.zeros_like(hidden[..., :1, :]), hidden[..., :-1, :]], axis=-2)  # [.., K, D]
    grouped = hidden.astype(jnp.float32).reshape(*lead, k, groups, d // groups)
    before = previous.astype(jnp.float32).reshape(*lead, k, groups, d // groups)
    mixed = (taps[..., :1] * before + taps[..., 1:] * grouped).reshape(*lead, k, d)
    return hidden + (c["gamma"].astype(jnp.float32) * mixed).astype(hidden.dtype)


def dflash2_outputs(config: ModelConfig, params: dict, target_params: dict, hidden):
    """(logits [.., K, V] float32, normed [.., K, D]) of the block's states hidden [.., K, D]:
    the convolution, the final norm and the LM head."""
    normed = final_state(config, params, target_params, local_conv(params, hidden))
    return head_logits(config, params, target_params, normed), normed


def top_paths(lp, paths: int, branch: int):
    """The `paths` highest-scoring paths of per-position log-probabilities lp [.., K, V] by a
    beam search that extends each by its position's top `branch` tokens -> (tokens [.., P, K]
    int32, scores [.., P] float32), best first; P = min(paths, branch ** K). Path 0 is the
    per-position argmax (up to ties)."""
    *lead, k, v = lp.shape
    m = min(branch, v)
    top_lp, top_tok = top_k(lp.astype(jnp.float32), m)  # [.., K, m]: kept out of the beam's fusion
    scores, tokens = top_lp[..., 0, :], top_tok[..., 0, :, None]  # [.., m], [.., m, 1]
    for i in range(1, k):
        width = scores.shape[-1]
        extended = (scores[..., :, None] + top_lp[..., i, None, :]).reshape(*lead, width * m)
        scores, index = jax.lax.top_k(extended, min(paths, width * m))  # [.., P']
        parent, choice = index // m, index % m
        tokens = jnp.take_along_axis(tokens, parent[..., None], axis=-2)  # [.., P', i]
        chosen = jnp.take_along_axis(top_tok[..., i, :], choice, axis=-1)  # [.., P']
        tokens = jnp.concatenate([tokens, chosen[..., None]], axis=-1)
    if scores.shape[-1] > paths:  # K = 1 with branch > paths
        scores, tokens = scores[..., :paths], tokens[..., :paths, :]
    return tokens.astype(jnp.int32), scores


def pair_scores(params: dict, target_params: dict, normed, tokens, anchor):
    """The selector's pairwise term per path -> [.., P] float32: normed [.., K, D] (the final
    norm's output of each position), tokens [.., P, K] the paths, anchor [..] the token before
    position 0."""
    s = params["selector"]
    before = jnp.concatenate([jnp.broadcast_to(anchor[..., None, None], (*tokens.shape[:-1], 1)), tokens[..., :-1]], -1)
    emb_prev = _rms(target_embedding(target_params, before, jnp.float32))  # [.., P, K, D]
    emb_next = _rms(target_embedding(target_params, tokens, jnp.float32))
    u = jnp.einsum("...d,dr->...r", emb_prev, s["prev"].astype(jnp.float32))  # [.., P, K, r]
    c = jnp.einsum("...kd,dr->...kr", normed.astype(jnp.float32), s["context"].astype(jnp.float32))  # [.., K, r]
    v = jnp.einsum("...d,dr->...r", emb_next, s["next"].astype(jnp.float32))  # [.., P, K, r]
    return jnp.sum((u + c[..., None, :, :]) * v, axis=(-2, -1))


def path_candidates(params: dict, target_params: dict, lp, normed, anchor, paths: int, branch: int):
    """(tokens [.., P, K] int32, scores [.., P] float32): the beam's top paths of lp [.., K, V]
    and the selector's score of each (the beam's sum plus `pair_scores`)."""
    tokens, unary = top_paths(lp, paths, branch)
    return tokens, unary + pair_scores(params, target_params, normed, tokens, anchor)
