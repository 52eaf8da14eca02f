"""The block heads' kind of feature store (kind block, dspark, dflash2; the store itself,
its shards, atomic writes and resume: training/feature_store.py).

A block step reads two things of the frozen target over a window (training/block_objective.py
block_batch): the outputs of the head's feature layers, which build the context the blocks
attend to, and the target's distribution at every guessed position, the teacher. Per window
[L] the store holds:

  tokens        int32 [N, L]        the window
  mask          uint8 [N, L]        its loss mask aligned with the tokens (all ones for the corpus)
  states        dtype [N, L, n * D] the feature layers' outputs concatenated (full_forward's states)
  top_logprobs  dtype [N, L, k]     the target's k largest log-probabilities (log_softmax over
                                    all V, in float32), in decreasing order
  top_ids       int32 [N, L, k]     their token ids; top_ids[..., 0] is the target's argmax

k is features.top_k. The full distribution is V numbers per position (SmolLM2: 49,152, 98 kB
per position in bfloat16 against 3.5 kB for three layers' states), so only its top k are kept.

The teacher read from a store is the top-k distribution renormalised: p_topk(i) =
exp(lp_i) / sum_j exp(lp_j) over the k stored ids, and the loss is KL(p_topk || q_head),
q_head the head's softmax over its whole vocabulary (not renormalised to the k ids: the head
is still taught to put no mass outside them). This is the live KL(p_target || q_head) with
the target's tail (the mass outside its top k) dropped and the rest scaled up to one; with
k = V it is the live loss exactly (tests/test_block_store.py), and the smaller k, the more
the tail's share of the gradient is lost. Its minimum is at q_head = p_topk, so a head equal
to the target scores -log Z, Z the top k's mass, not 0 (the logged KL has that floor: on a
peaked target at k = 64 Z is near 1; on tests' flat random byte target, top 64 of 259, the
loss of a random head rose from 0.45 live to 1.69). Not chosen: keeping the tail as one (k + 1)-th
bucket, whose q the head would have to sum over V - k logits it has no ids for in the
store's layout. Whatever else the objectives read of the target is its argmax at each
guessed position (agreement, DSpark's confidence labels, DFlash 2's greedy labels): top_ids
[..., 0], exact (jax.lax.top_k breaks ties to the lower index, as argmax does).

Provenance (manifest["provenance"]): the kind ("block", one store serves the three block
kinds: they read the same side), the target's fingerprint, the windows, the feature layers,
top_k and the dtype; opening with another is a ValueError naming each field that differs.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafters.formats.native import target_fingerprint
from specjax.io.model import Model
from specjax.models import ModelConfig, full_forward
from specjax.training.feature_windows import Windows

STORED = ("tokens", "states", "top_logprobs", "top_ids")  # a stored block batch's arrays (the loss's input)


def block_provenance(target: Model, windows: Windows, layers: tuple[int, ...], top_k: int, dtype: str) -> dict:
    """What a block store was computed from (module docstring); JSON-ready."""
    return {
        "objective": "block",
        "target": target_fingerprint(target),
        "windows": windows.record,
        "layers": list(layers),
        "top_k": top_k,
        "dtype": dtype,
    }


def block_target_side(target_config: ModelConfig, target_params, tokens, layers: tuple[int, ...], top_k: int) -> dict:
    """tokens int32 [B, L] -> {"states" [B, L, n * D], "top_logprobs" float32 [B, L, k],
    "top_ids" int32 [B, L, k]}: what a block store holds of the frozen target (no gradient)."""
    logits, states = jax.lax.stop_gradient(full_forward(target_config, target_params, tokens, layers))
    top, ids = jax.lax.top_k(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), top_k)  # [B, L, k] each
    return {"states": states, "top_logprobs": top, "top_ids": ids.astype(jnp.int32)}


# Module level: one compiled forward per (target config, layers, k, shapes) in a process.
_target_side = jax.jit(block_target_side, static_argnums=(0, 3, 4))


def block_compute(target: Model, layers: tuple[int, ...], top_k: int) -> Callable:
    """tokens int32 [B, L] -> `block_target_side`'s arrays as numpy (a shard's, but tokens and mask)."""
    vocab = target.config.vocab_size
    if not 1 <= top_k <= vocab:
        raise ValueError(f"features.top_k must be in [1, {vocab}] (the target's vocabulary), got {top_k}")

    def compute(tokens: np.ndarray) -> dict:
        out = _target_side(target.config, target.params, tokens, tuple(layers), top_k)
        return {name: np.asarray(value) for name, value in out.items()}

    return compute


def stored_teacher(batch: dict, at):
    """The teacher at positions at [B, P] of a stored batch -> (log p_topk [B, P, k] float32,
    renormalised over the k ids; ids int32 [B, P, k])."""
    index = at[:, :, None]
    logprobs = jnp.take_along_axis(batch["top_logprobs"].astype(jnp.float32), index, axis=1)
    ids = jnp.take_along_axis(batch["top_ids"].astype(jnp.int32), index, axis=1)
    return logprobs - jax.nn.logsumexp(logprobs, axis=-1, keepdims=True), ids


def topk_kl(teacher, ids, logits):
    """KL(p_topk || softmax(logits)) -> [..]: teacher [.., k] log-probabilities over the ids
    [.., k], logits [.., V] the student's; a draft vocabulary's -inf logits count as -1e9."""
    student = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), ids, axis=-1)  # [.., k]
    return jnp.sum(jnp.exp(teacher) * (teacher - jnp.where(jnp.isfinite(student), student, -1e9)), axis=-1)
