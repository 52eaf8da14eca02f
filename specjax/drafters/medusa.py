"""Medusa heads (Cai et al. 2024): K small heads on the target's own last hidden state.

Head k (k = 1..K) maps the hidden state h_t at position t to a guess for the token at
t + 1 + k through one residual SiLU block, h_t + SiLU(h_t W_k + b_k), and the target's own
LM head (shared, never copied). The target's LM head itself supplies t + 1: that is the
correction/bonus token every round ends with. So a round starting at length L (tokens up
to L - 1 committed) proposes positions L..L+K-1 from h at L - 2, the last position the
previous verify pass computed, and drafting costs one tiny matmul per head and no extra
target pass: the verify pass's hidden states come free (forward(..., features=True)).
The heads' network (init, `medusa_hidden`, `medusa_logits`) lives in specjax/models/heads.py.
Published Medusa-1 heads also carry a trained LM head each (params["lm_head"] [H, D, V]),
and some several residual blocks per head (w [H, L, D, D]); drafters/head_formats.py reads them.

With a tree, depth d takes head d's candidates (the top-ranked tokens, or i.i.d. draws
under sampling), whatever the parent: Medusa's Cartesian-product trees.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.core.sampling import probabilities, sample
from specjax.drafters.base import DraftContext, Drafter, Proposal, TreeProposal
from specjax.models import ModelConfig
from specjax.models.heads import medusa_logits


@struct.dataclass
class MedusaState:
    feature: jax.Array  # [B, D]: the target's hidden state at position lengths - 2


@dataclasses.dataclass(frozen=True)
class Medusa(Drafter):
    """Medusa heads for one target: `params` {"w": [H, D, D], "b": [H, D]}, or with L blocks per
    head {"w": [H, L, D, D], "b": [H, L, D]}; optional "lm_head" [H, D, V], each head's own LM head.
    num_heads, hidden_size, num_layers and lm_heads are read from the params when given."""

    params: dict | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)
    num_heads: int = 4
    hidden_size: int = 0
    vocab_size: int = 0
    tree_candidates: str = "sample"  # as DraftModel.tree_candidates
    num_layers: int = 1  # residual blocks per head
    lm_heads: bool = False  # each head has its own LM head (Medusa-1), not the target's
    name = "medusa"
    needs_features = True
    supports_trees = True

    def __post_init__(self):
        if self.params is not None:
            shape = np.shape(self.params["w"])  # [H, D, D] or [H, L, D, D]
            object.__setattr__(self, "num_heads", int(shape[0]))
            object.__setattr__(self, "hidden_size", int(shape[-1]))
            object.__setattr__(self, "num_layers", int(shape[1]) if len(shape) == 4 else 1)
            object.__setattr__(self, "lm_heads", "lm_head" in self.params)
        if self.tree_candidates not in ("sample", "top"):
            raise ValueError(f"Medusa.tree_candidates must be 'sample' or 'top', got {self.tree_candidates!r}")

    def weights(self) -> Any:
        if self.params is None:
            raise ValueError("this Medusa holds no weights (it is the static part of one)")
        return self.params

    def without_weights(self) -> Medusa:
        return dataclasses.replace(self, params=None)

    def check(self, target_config: ModelConfig, num_speculative_tokens: int) -> None:
        self._check_target(target_config)
        if num_speculative_tokens > self.num_heads:
            raise ValueError(
                f"Medusa has {self.num_heads} heads, so it drafts at most {self.num_heads} tokens per round; "
                f"got num_speculative_tokens={num_speculative_tokens}"
            )

    def check_tree(self, target_config: ModelConfig, tree) -> None:
        self._check_target(target_config)
        if tree.depth > self.num_heads:
            raise ValueError(f"Medusa has {self.num_heads} heads, so a tree may be at most that deep, got {tree.depth}")

    def _check_target(self, target_config: ModelConfig) -> None:
        if self.hidden_size != target_config.hidden_size:
            raise ValueError(
                f"these Medusa heads read hidden size {self.hidden_size}, but the target's is "
                f"{target_config.hidden_size}: they were trained for another target"
            )
        if self.vocab_size and self.vocab_size != target_config.vocab_size:
            raise ValueError(
                f"these Medusa heads were trained for a vocabulary of {self.vocab_size}, "
                f"the target's is {target_config.vocab_size}"
            )

    def init(self, weights, ctx: DraftContext, prompt, cache_length: int) -> MedusaState:
        at = jnp.maximum(ctx.lengths - 2, 0)  # [B]
        return MedusaState(feature=jnp.take_along_axis(ctx.features, at[:, None, None], axis=1)[:, 0])

    def _head_scores(self, weights, state: MedusaState, ctx: DraftContext, heads: int):
        """Logits (greedy) or processed probabilities of the first `heads` heads: [B, heads, V]."""
        logits = medusa_logits(jax.tree.map(lambda x: x[:heads], weights), state.feature, ctx.target, ctx.target_params)
        return logits if ctx.sampling.greedy else probabilities(logits, ctx.sampling)

    def propose(self, weights, state: MedusaState, ctx: DraftContext, key):
        k = ctx.num_speculative_tokens
        scores = self._head_scores(weights, state, ctx, k)  # [B, K, V]
        if ctx.sampling.greedy:
            return Proposal(tokens=jnp.argmax(scores, axis=-1).astype(jnp.int32), q=None), state
        return Proposal(tokens=sample(key, scores), q=scores), state

    def propose_tree(self, weights, state: MedusaState, ctx: DraftContext, key):
        scores = self._head_scores(weights, state, ctx, ctx.tree.depth)  # [B, D, V]
        sampled = not ctx.sampling.greedy and self.tree_candidates == "sample"
        return cartesian_tree(ctx.tree, scores, key, sampled), state

    def update(self, weights, state: MedusaState, ctx: DraftContext, num_accepted):
        # The last verified position is L_prev - 1 + num_accepted = (new length) - 2.
        feature = jnp.take_along_axis(ctx.features, num_accepted[:, None, None], axis=1)[:, 0]
        return MedusaState(feature=feature.astype(state.feature.dtype))


def cartesian_tree(tree, scores: jax.Array, key: jax.Array, sampled: bool) -> TreeProposal:
    """A Cartesian-product tree from one distribution per depth, whatever the parent.

    scores [B, D, V]: depth d's logits (greedy) or processed probabilities, d = 1..D, for
    drafters whose depth-d guess does not read the tokens above it (Medusa heads, parallel
    drafting). A node's rank-r child is the r-th top-ranked token of its depth, or with
    `sampled` its own r-th i.i.d. draw from that depth's distribution (recorded in q at
    the parent). Returns TreeProposal(tokens [B, N], q [B, N + 1, V] or None).
    """
    b = scores.shape[0]
    tokens = jnp.zeros((b, tree.num_nodes + 1), jnp.int32)
    q_all = jnp.zeros((b, tree.num_nodes + 1, scores.shape[-1]), jnp.float32) if sampled else None
    keys = jax.random.split(key, tree.depth)
    for depth in range(1, tree.depth + 1):
        nodes, head = tree.level(depth), scores[:, depth - 1]  # head [B, V]
        parents = np.unique(tree.parents[nodes])
        local = np.searchsorted(parents, tree.parents[nodes])
        ranks = tree.ranks[nodes]
        if sampled:
            q_all = q_all.at[:, parents].set(head[:, None, :])
            shape = (int(ranks.max()) + 1, b, parents.size)
            draws = jax.random.categorical(keys[depth - 1], jnp.log(head)[:, None, :], axis=-1, shape=shape)
            chosen = draws[ranks, :, local].T  # [B, M]: each parent's own i.i.d. draws
        else:
            chosen = jax.lax.top_k(head, int(ranks.max()) + 1)[1][:, ranks]  # [B, M]
        tokens = tokens.at[:, nodes].set(chosen.astype(jnp.int32))
    return TreeProposal(tokens=tokens[:, 1:], q=q_all)
