"""DFlash 2 (z-lab / Inco 2026): a block head whose outputs mix with their neighbour through
a two-tap dynamic convolution, and whose proposal is chosen among the block's top paths.

The network is models/dflash2_net.py: BlockHead's one non-causal pass (drafters/block_head.py:
the same context cache, the same block [anchor, MASK x K]) gives states h [B, K, D]; the
convolution gives z and the logits; a beam search keeps the P best paths by summed
log-probability (each position extended by its top `branch` tokens); the selector scores
each path (the beam's sum plus a low-rank pairwise term over adjacent tokens) and one is
proposed as the chain:

  greedy     the best-scoring path, q = None (a deterministic proposal; greedy == plain
             holds for any proposal);
  sampling   a path drawn from softmax(scores) over the P paths, the unary part from the
             processed probabilities (temperature, top-k/p). The proposal's joint law is
             Q(d) = sum of pi over the paths equal to d, and q[:, i] is its conditional given
             the drawn prefix, q_i(x | d_<i) = sum pi_p [path p starts with d_<i, x] /
             sum pi_p [path p starts with d_<i]: exactly the distribution d_i was drawn from
             given d_<i, which is all speculative sampling needs to stay exact.

Why a draw and not the engines' argmax with q = None at T > 0: a drawn path keeps the
selector working under sampling and accepts min(1, p/q) rather than p(d) per token, and it
is no less exact (tests/test_dflash2.py: the T = 1 distribution test, with a variant that
reports the block's own q for the selected tokens failing it).

Trees: the Cartesian tree of the convolved outputs (BlockProposals.propose_tree on this
block_logits): a tree already verifies many paths, so the selector is not used there.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.core.loop import gather_tokens
from specjax.core.sampling import SamplingConfig, probabilities
from specjax.drafters.base import DraftContext, Proposal
from specjax.drafters.block_head import BlockHead, BlockHeadState
from specjax.models import ModelConfig
from specjax.models.dflash2_net import dflash2_outputs, path_candidates


def unary_log_probs(logits, sampling: SamplingConfig):
    """What the beam ranks and the path law weighs: log_softmax(logits) when greedy, else
    the log of the processed probabilities (-inf where filtered). logits [.., V] -> [.., V]."""
    if sampling.greedy:
        return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.log(probabilities(logits, sampling))


def select_path(tokens, scores, key, sampling: SamplingConfig, vocab_size: int) -> Proposal:
    """The proposal from candidate paths tokens [B, P, K] and their scores [B, P]: the best
    (greedy, q None) or one drawn from softmax(scores) with q [B, K, V] its conditionals
    given the drawn prefix (the module docstring)."""
    b, _, k = tokens.shape
    rows = jnp.arange(b)
    if sampling.greedy:
        return Proposal(tokens=tokens[rows, jnp.argmax(scores, axis=-1)], q=None)
    chosen = tokens[rows, jax.random.categorical(key, scores, axis=-1)]  # [B, K]
    weight = jax.nn.softmax(scores, axis=-1)  # [B, P]: pi
    same = (tokens == chosen[:, None, :]).astype(jnp.float32)  # [B, P, K]
    # Path p shares the drawn prefix d_<i: the exclusive running product of `same`.
    shares = jnp.cumprod(jnp.concatenate([jnp.ones_like(same[..., :1]), same[..., :-1]], axis=-1), axis=-1)
    w = weight[:, :, None] * shares  # [B, P, K]
    positions = jnp.broadcast_to(jnp.arange(k), tokens.shape)
    q = jnp.zeros((b, k, vocab_size), jnp.float32).at[rows[:, None, None], positions, tokens].add(w)
    q = q / jnp.sum(w, axis=1)[..., None]  # the drawn path shares its own prefix: never 0
    return Proposal(tokens=chosen, q=q)


def selected_proposal(
    config: ModelConfig,
    params: dict,
    target_params,
    hidden,
    anchor,
    key,
    sampling: SamplingConfig,
    paths: int,
    branch: int,
) -> Proposal:
    """The round's proposal from the block's states hidden [B, K, D] (anchor [B]: the token
    before output 0): convolution, LM head, top paths, selector, `select_path`."""
    logits, normed = dflash2_outputs(config, params, target_params, hidden)  # [B, K, V], [B, K, D]
    lp = unary_log_probs(logits, sampling)
    tokens, scores = path_candidates(params, target_params, lp, normed, anchor, paths, branch)
    return select_path(tokens, scores, key, sampling, logits.shape[-1])


@dataclasses.dataclass(frozen=True)
class DFlash2(BlockHead):
    """A DFlash 2 head: a BlockHead (its fields, its checks, its context cache) whose params
    also hold "conv" {"kernel" [D, 2G], "bias" [2G], "gamma" [D]} and "selector" {"prev",
    "context", "next" [D, r]} (models/dflash2_net.py); paths: the candidates the selector
    chooses among (DFlash 2: 16); branch: the top tokens per position the beam extends by.
    Trained by `specjax train-head` with kind: dflash2 (training/dflash2_objective.py);
    saved and loaded as kind "dflash2" (formats/native.py)."""

    paths: int = 16
    branch: int = 4
    name = "dflash2"
    supports_trees = True

    def __post_init__(self):
        super().__post_init__()
        for field in ("paths", "branch"):
            if getattr(self, field) < 1:
                raise ValueError(f"DFlash2.{field} must be >= 1, got {getattr(self, field)}")

    def _check_target(self, target_config: ModelConfig) -> None:
        super()._check_target(target_config)
        if self.params is None:
            return
        missing = [k for k in ("conv", "selector") if k not in self.params]
        if missing:
            raise ValueError(
                f"a DFlash 2 head's params need {' and '.join(missing)} (models/dflash2_net.py "
                "init_dflash2_extras); these look like a plain block head's: use BlockHead"
            )
        width = self.params["conv"]["kernel"].shape[0]
        if width != self.config.hidden_size:
            raise ValueError(
                f"this DFlash 2 head's convolution reads states of size {width}, "
                f"the target's are {self.config.hidden_size}"
            )

    def block_logits(self, weights, state: BlockHeadState, ctx: DraftContext, drafts: int):
        """The convolved outputs (logits [B, drafts, V], state): what trees and DDTree read."""
        hidden, state = self.block_states(weights, state, ctx, drafts)
        return dflash2_outputs(self.config, weights, ctx.target_params, hidden)[0], state

    def propose(self, weights, state, ctx: DraftContext, key) -> tuple[Proposal, BlockHeadState]:
        hidden, state = self.block_states(weights, state, ctx, ctx.num_speculative_tokens)  # [B, K, D]
        anchor = gather_tokens(ctx.tokens, jnp.maximum(ctx.lengths - 1, 0)[:, None])[:, 0]  # [B]
        args = (key, ctx.sampling, self.paths, self.branch)
        return selected_proposal(self.config, weights, ctx.target_params, hidden, anchor, *args), state
