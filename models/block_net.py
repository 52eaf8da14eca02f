"""A DFlash-style block head (Chen et al. 2026, "DFlash: Block Diffusion for Flash
Speculative Decoding"), as pure functions: K tokens from one non-causal forward.

The head is a few decoder layers (the same Block every model here uses) that never see the
committed tokens themselves. What they see of the past is the target's own hidden states:
the outputs of target blocks i, j, k concatenated, h [.., n * D], fused once into a context
feature c = hidden_norm(fc(h)) [.., D]. In every layer, each committed position's key and
value are that layer's projections of c (`Attention.keys_values`: no input norm, as DFlash),
so the context costs two small matmuls per layer and position, and no MLP.

The block: the last committed token (the anchor, whose target state does not exist yet)
followed by K mask tokens, at positions L - 1 .. L + K - 1, embedded with the target's
embedding and run through the layers with bidirectional attention inside the block (a
`BlockMask`) and the context below it. The outputs at the mask positions, through the final
norm and the target's LM head (or the head's own, over a draft vocabulary as EAGLE-3's),
are the K proposals. The anchor's own output is not used.

In training (training/block_objective.py) the same function runs many blocks of one row at
once: the context at slots 0..T-1 and each block in its own slots, with a per-row
`TreeMask` saying that a block sees the context before its anchor and itself.

Like the rest of models/, this file imports only jax, flax, numpy and its siblings.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from . import graphdef, init_params
from .attention import BlockMask, TreeMask, write_kv
from .config import ModelConfig
from .heads import _rms_norm, target_embedding, target_logits, to_target_vocab


def init_block_head_params(
    config: ModelConfig,
    num_features: int,
    seed: int = 0,
    target_params: dict | None = None,
    draft_vocab_size: int = 0,
) -> dict:
    """fc [n * D, D], hidden_norm, `config.num_hidden_layers` fresh layers and a final norm
    (the target's copy, when given: the LM head then starts reading what it reads), plus with
    a draft vocabulary lm_head [D, Vd] (the target's rows are the caller's to copy in)."""
    full = init_params(config, seed)
    d, dtype = config.hidden_size, jnp.dtype(config.dtype)
    # About unit-size c from block outputs of any scale: hidden_norm normalises it anyway.
    fc = jax.random.normal(jax.random.key(seed + 1), (num_features * d, d), dtype) / np.sqrt(num_features * d)
    norm = full["final_norm"]
    if target_params is not None and jax.tree.structure(target_params.get("final_norm")) == jax.tree.structure(norm):
        norm = jax.tree.map(jnp.array, target_params["final_norm"])  # a copy: trained, and donated
    params = {"fc": fc, "hidden_norm": {"scale": jnp.ones((d,), dtype)}, "layers": full["layers"], "final_norm": norm}
    if draft_vocab_size:
        params["lm_head"] = 0.02 * jax.random.normal(jax.random.key(seed + 2), (d, draft_vocab_size), dtype)
    return params


def write_context(config: ModelConfig, params: dict, target_params: dict, states, positions, cache):
    """Every layer's K/V of the context -> cache: states [B, C, n * D] (the target's block
    outputs) at positions [B, C], written at slot = position (past the cache end: dropped).
    c = hidden_norm(fc(h)) [B, C, D] goes through each layer's key and value projections.
    cache.lengths is left to the caller."""
    c = jnp.einsum("bce,ed->bcd", states, params["fc"].astype(states.dtype))
    c = _rms_norm(c, params["hidden_norm"]["scale"], config.rms_norm_eps)  # [B, C, D]
    for layer, block in enumerate(_module(config, params, target_params).layers):
        k, v = block.attn.keys_values(c, positions, layer)  # [B, C, n_kv, d_head]
        cache = write_kv(cache, layer, positions, k, v)
    return cache


def _module(config: ModelConfig, params: dict, target_params: dict):
    """The head's layers and final norm as the shared Llama module, with the target's
    embedding and LM head (read at run time, never copied)."""
    merged = {"embed": target_params["embed"], "layers": params["layers"], "final_norm": params["final_norm"]}
    if not config.tie_word_embeddings:
        merged["lm_head"] = target_params["lm_head"]
    return nnx.merge(graphdef(config), merged)


def block_head_states(
    config: ModelConfig,
    params: dict,
    target_params: dict,
    states,
    context_positions,
    tokens,
    positions,
    cache,
    mask: BlockMask | TreeMask,
):
    """One pass of the head's layers -> (h [B, T, D] before the final norm, cache); the
    logits are `block_logits_of(h)` (DSpark adds its Markov term to h first).

    states [B, C, n * D]: the target's block outputs at context_positions [B, C], whose K/V
    every layer writes at slot = position (slots past the cache end are dropped) before its
    block attends; tokens, positions [B, T]: the block(s), attending by `mask`.
    """
    # The context first: a block query of every layer reads the context's K/V of that layer.
    cache = write_context(config, params, target_params, states, context_positions, cache)
    module = _module(config, params, target_params)
    x = target_embedding(target_params, tokens, states.dtype)  # [B, T, D]
    for layer, block in enumerate(module.layers):
        h, cache = block.attn(block.input_norm(x), positions, cache, layer, mask)
        x = x + h
        x = x + block.mlp(block.post_attention_norm(x))
    return x, cache


def final_state(config: ModelConfig, params: dict, target_params: dict, hidden):
    """The head's final norm on states [.., D] (what its LM head reads)."""
    return _module(config, params, target_params).final_norm(hidden)


def head_logits(config: ModelConfig, params: dict, target_params: dict, normed):
    """The head's LM head on normed states [.., D] -> float32 logits [.., V] over the target
    vocabulary (a draft vocabulary's scattered in, -inf elsewhere, with params["d2t"])."""
    if "lm_head" in params:
        logits = jnp.einsum("...d,dv->...v", normed, params["lm_head"].astype(normed.dtype)).astype(jnp.float32)
        return to_target_vocab(logits, params.get("d2t"), config.vocab_size)
    return target_logits(config, target_params, normed)


def block_logits_of(config: ModelConfig, params: dict, target_params: dict, hidden):
    """The block head's logits [.., V] of its states hidden [.., D] (block_head_states')."""
    return head_logits(config, params, target_params, final_state(config, params, target_params, hidden))


def block_head_forward(
    config: ModelConfig,
    params: dict,
    target_params: dict,
    states,
    context_positions,
    tokens,
    positions,
    cache,
    mask: BlockMask | TreeMask,
):
    """`block_head_states` then the final norm and LM head -> (logits [B, T, V], cache)."""
    args = (states, context_positions, tokens, positions, cache, mask)
    hidden, cache = block_head_states(config, params, target_params, *args)
    return block_logits_of(config, params, target_params, hidden), cache
