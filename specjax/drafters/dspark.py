"""DSpark (DeepSeek 2026, arXiv 2607.05147): a block head whose outputs also read the draft
before them, and say how likely each draft is to survive.

The network is models/dspark_net.py: BlockHead's one non-causal pass (drafters/block_head.py:
the same context cache, the same block [anchor, MASK x K]) gives a state h_i per output; then,
for i = 0 .. K - 1 in turn,

    z_i = h_i + up(down(emb(d_{i-1})))    (no term at i = 0: the block reads the anchor)
    d_i ~ softmax(lm_head(norm(z_i)))     (argmax when greedy)
    c_i = sigmoid(w . norm(z_i) + b)      Proposal.confidence[:, i]

so only the rank-r term, a norm and the LM head run K times; the layers run once. q[:, i] is
the distribution d_i was drawn from, conditioned on the d_{i-1} actually drawn, so
speculative sampling stays exact. c_i estimates P(d_i survives | d_<i survived); a verify
schedule may read it to decide how much of the block to verify, never what is accepted.

Trees: the Markov term is kept. One pass gives every depth's h; a node at depth d + 1 takes
its candidates from output d conditioned on its own parent's token (expand_tree's `grow`,
one [B, F, V] LM head per level), so siblings under different parents differ, and q is
recorded at each parent (exact for sampled candidates as for chains). Trees report no
confidence (TreeProposal has no field for it). `block_logits` stays BlockHead's (the plain
outputs, no Markov term): what drafters/block_trees.py records of a block drafter.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.core.grammar import mask_logits
from specjax.core.grammar import step as grammar_step
from specjax.core.loop import gather_tokens
from specjax.core.sampling import SamplingConfig
from specjax.drafters.base import DraftContext, Proposal, TreeProposal
from specjax.drafters.block_head import BlockHead, BlockHeadState
from specjax.drafters.proposing import candidate_scores, draw, expand_tree, samples_candidates
from specjax.models import ModelConfig
from specjax.models.dspark_net import dspark_outputs, markov_state


def markov_chain(
    config: ModelConfig, params: dict, target_params, hidden, anchor, key, sampling: SamplingConfig, grammar=None
) -> Proposal:
    """K drafts from the block's states hidden [B, K, D], each drawn after the one before it
    (anchor [B]: the token before output 0, which takes no Markov term); with a grammar (the
    round's GrammarState) each from its logits masked at the state after the drafts before it.

    Returns Proposal(tokens [B, K] int32, q [B, K, V] float32 or None when greedy,
    confidence [B, K] float32): q[:, i] and confidence[:, i] are those of output i given
    the d_{i-1} drawn."""
    k = hidden.shape[1]

    def step(carry, xs):
        previous, states = carry  # [B], [B] (or None)
        h, step_key, use = xs  # [B, D], a key, bool
        z = markov_state(params, target_params, h, previous, use)  # [B, D]
        logits, confidence = dspark_outputs(config, params, target_params, z)  # [B, V], [B]
        if grammar is not None:
            logits = mask_logits(logits, grammar.next_state, states)
        token, q = draw(step_key, logits, sampling)
        if grammar is not None:
            states = grammar_step(grammar.next_state, states, token)
        return (token, states), (token, q, confidence)

    xs = (jnp.swapaxes(hidden, 0, 1), jax.random.split(key, k), jnp.arange(k) >= 1)
    start = (anchor.astype(jnp.int32), None if grammar is None else grammar.states)
    _, (tokens, q, confidence) = jax.lax.scan(step, start, xs)
    return Proposal(
        tokens=tokens.T,  # [B, K]
        q=None if q is None else jnp.swapaxes(q, 0, 1),  # [B, K, V]
        confidence=confidence.T,  # [B, K]
    )


@dataclasses.dataclass(frozen=True)
class DSpark(BlockHead):
    """A DSpark head: a BlockHead (its fields, its checks, its context cache) whose params also
    hold "markov" {"down" [D, r], "up" [r, D]} and "confidence" {"w" [D], "b" [1]}
    (models/dspark_net.py). Trained by `specjax train-head` with kind: dspark
    (training/dspark_objective.py); saved and loaded as kind "dspark" (formats/native.py)."""

    name = "dspark"
    supports_trees = True

    def _check_target(self, target_config: ModelConfig) -> None:
        super()._check_target(target_config)
        if self.params is None:
            return
        missing = [k for k in ("markov", "confidence") if k not in self.params]
        if missing:
            raise ValueError(
                f"a DSpark head's params need {' and '.join(missing)} (models/dspark_net.py init_dspark_extras); "
                "these look like a plain block head's: use BlockHead"
            )
        down = self.params["markov"]["down"]
        if down.shape[0] != self.config.hidden_size:
            raise ValueError(
                f"this DSpark head's Markov head reads embeddings of size {down.shape[0]}, "
                f"the target's are {self.config.hidden_size}"
            )

    def _anchor(self, ctx: DraftContext):
        return gather_tokens(ctx.tokens, jnp.maximum(ctx.lengths - 1, 0)[:, None])[:, 0]  # [B]

    def propose(self, weights, state, ctx: DraftContext, key) -> tuple[Proposal, BlockHeadState]:
        hidden, state = self.block_states(weights, state, ctx, ctx.num_speculative_tokens)  # [B, K, D]
        anchor = self._anchor(ctx)
        proposal = markov_chain(self.config, weights, ctx.target_params, hidden, anchor, key, ctx.sampling, ctx.grammar)
        return proposal, state

    def propose_tree(self, weights, state, ctx: DraftContext, key) -> tuple[TreeProposal, BlockHeadState]:
        tree = ctx.tree
        hidden, state = self.block_states(weights, state, ctx, tree.depth)  # [B, depth, D]

        def scores(output: int, previous, use: bool):  # previous [B, F] -> [B, F, V]
            h = jnp.broadcast_to(hidden[:, output, None], (*previous.shape, hidden.shape[-1]))
            z = markov_state(weights, ctx.target_params, h, previous, use)
            logits, _ = dspark_outputs(self.config, weights, ctx.target_params, z)
            return candidate_scores(logits, ctx.sampling)

        def grow(depth, parents, tokens, carry):  # the children of depth's nodes: output `depth`
            return scores(depth, tokens[:, parents], True), carry

        root = scores(0, self._anchor(ctx)[:, None], False)  # [B, 1, V]
        sampled = samples_candidates(ctx.sampling, self.tree_candidates)
        proposal, _ = expand_tree(tree, root, key, sampled, grow, grammar=ctx.grammar)
        return proposal, state
