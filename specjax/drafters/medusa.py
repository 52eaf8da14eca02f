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
and some several residual blocks per head (w [H, L, D, D]); drafters/formats/published.py reads them.

With a tree, depth d takes head d's candidates (the top-ranked tokens, or i.i.d. draws
under sampling), whatever the parent: Medusa's Cartesian-product trees.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.drafters.base import DraftContext
from specjax.drafters.common import BlockProposals, HoldsWeights, check_tree_candidates
from specjax.models import ModelConfig
from specjax.models.heads import medusa_logits


@struct.dataclass
class MedusaState:
    feature: jax.Array  # [B, D]: the target's hidden state at position lengths - 2


@dataclasses.dataclass(frozen=True)
class Medusa(HoldsWeights, BlockProposals):
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
        check_tree_candidates("Medusa", self.tree_candidates)

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

    def block_logits(self, weights, state: MedusaState, ctx: DraftContext, drafts: int):
        """The first `drafts` heads' logits [B, drafts, V] (head k guesses position lengths + k - 1);
        `propose` and `propose_tree` follow (BlockProposals)."""
        heads = jax.tree.map(lambda x: x[:drafts], weights)
        return medusa_logits(heads, state.feature, ctx.target, ctx.target_params), state

    def update(self, weights, state: MedusaState, ctx: DraftContext, num_accepted):
        # The last verified position is L_prev - 1 + num_accepted = (new length) - 2.
        feature = jnp.take_along_axis(ctx.features, num_accepted[:, None, None], axis=1)[:, 0]
        return MedusaState(feature=feature.astype(state.feature.dtype))
