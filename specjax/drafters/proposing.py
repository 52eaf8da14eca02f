"""From a drafter's distributions to its proposal: the drawing every drafter shares.

Drafters differ in how they get a distribution for a position (a draft model's forward,
a head on the target's states, a block of masks); how tokens are then chosen from it is
the same everywhere, and exactness depends on it (q must be what the token was really
drawn from). So it is written once, here:

  draw / candidate_scores       one position's token (and q), or a tree level's scores
  draft_chain                   K tokens, each fed back to get the next distribution
                                (DraftModel, LayerSkip, Eagle)
  block_proposal / block_tree   K tokens from K distributions of one pass, none conditioned
                                on another (ParallelDraft, BlockHead, Medusa)
  expand_tree                   a token tree, level by level; `tree_feed` is where a level's
                                nodes sit, `cartesian_tree` the tree of one-pass drafters

Shapes: B rows, V the vocabulary, K drafts, N tree nodes (node 0, the root, excluded
from TreeProposal.tokens), F the nodes of one level that have children.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core.grammar import allowed, mask_logits
from specjax.core.grammar import step as grammar_step
from specjax.core.sampling import SamplingConfig, probabilities, sample
from specjax.drafters.base import Proposal, TreeProposal
from specjax.models import TreeMask


def draw(key: jax.Array, logits: jax.Array, sampling: SamplingConfig) -> tuple[jax.Array, jax.Array | None]:
    """Draft token [B] and the probabilities [B, V] it was drawn from (None when greedy): logits [B, V]."""
    if sampling.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), None
    q = probabilities(logits, sampling)
    return sample(key, q), q


def candidate_scores(logits: jax.Array, sampling: SamplingConfig) -> jax.Array:
    """What tree candidates are ranked or drawn by: the logits (greedy) or the processed
    probabilities [.., V] (the distribution a sampled candidate comes from)."""
    return logits if sampling.greedy else probabilities(logits, sampling)


def samples_candidates(sampling: SamplingConfig, tree_candidates: str) -> bool:
    """Whether a node's children are i.i.d. draws ("sample" under sampling) rather than the
    top-ranked tokens (greedy, or "top")."""
    return not sampling.greedy and tree_candidates == "sample"


def draft_chain(
    advance: Callable[[Any, jax.Array], tuple[jax.Array, Any]],
    carry: Any,
    logits: jax.Array,
    key: jax.Array,
    k: int,
    sampling: SamplingConfig,
    grammar: Any = None,
) -> tuple[Proposal, Any]:
    """K tokens drawn one after another: `logits` [B, V] give the first; `advance(carry,
    token [B]) -> (logits [B, V], carry)` feeds a drawn token and gives the next. The K-th
    token is drawn but not fed (the next round's catch-up feeds it if it is accepted).

    grammar: the round's GrammarState (DraftContext.grammar) or None. With one, each draft is
    drawn from the draft's logits masked at the grammar state after the drafts before it,
    so it proposes only what the constraint allows; q is then that masked distribution,
    the one it really drew from, and verification stays exact.

    Returns (Proposal(tokens [B, K], q [B, K, V] or None when greedy), carry).
    """

    def constrained(logits, states):
        return logits if grammar is None else mask_logits(logits, grammar.next_state, states)

    def step(state, step_key):
        carry, logits, states = state
        token, q = draw(step_key, constrained(logits, states), sampling)
        if grammar is not None:
            states = grammar_step(grammar.next_state, states, token)
        logits, carry = advance(carry, token)
        return (carry, logits, states), (token, q)

    keys = jax.random.split(key, k)
    states = None if grammar is None else grammar.states
    (carry, logits, states), (tokens, qs) = jax.lax.scan(step, (carry, logits, states), keys[:-1])
    last_token, last_q = draw(keys[-1], constrained(logits, states), sampling)
    drafts = jnp.concatenate([tokens.T, last_token[:, None]], axis=1)  # [B, K]
    q = None if last_q is None else jnp.concatenate([qs.transpose(1, 0, 2), last_q[:, None]], axis=1)
    return Proposal(tokens=drafts, q=q), carry


def block_proposal(logits: jax.Array, key: jax.Array, sampling: SamplingConfig, grammar=None) -> Proposal:
    """K proposals from K distributions of one pass, logits [B, K, V]: proposal i is drawn
    from output i alone, so q[:, i] is exactly its distribution. With a grammar (the round's
    GrammarState), output i is masked at the state after proposals 0..i-1 first, and q[:, i]
    is that masked distribution."""
    if grammar is not None:
        states, tokens, qs = grammar.states, [], []
        for i, step_key in enumerate(jax.random.split(key, logits.shape[1])):  # K: small and static
            token, q = draw(step_key, mask_logits(logits[:, i], grammar.next_state, states), sampling)
            states = grammar_step(grammar.next_state, states, token)
            tokens.append(token)
            qs.append(q)
        return Proposal(tokens=jnp.stack(tokens, axis=1), q=None if sampling.greedy else jnp.stack(qs, axis=1))
    if sampling.greedy:
        return Proposal(tokens=jnp.argmax(logits, axis=-1).astype(jnp.int32), q=None)
    q = probabilities(logits, sampling)  # [B, K, V]
    return Proposal(tokens=sample(key, q), q=q)


def block_tree(
    logits: jax.Array, tree, key: jax.Array, sampling: SamplingConfig, tree_candidates: str, grammar=None
) -> TreeProposal:
    """The Cartesian tree of one pass's distributions, logits [B, depth, V] (`cartesian_tree`)."""
    scores = candidate_scores(logits, sampling)
    return cartesian_tree(tree, scores, key, samples_candidates(sampling, tree_candidates), grammar)


# The next level's scores: (depth, parents [F], tokens [B, N + 1] so far, carry) ->
# (scores [B, F, V], or [B, 1, V] when every parent has the same, carry).
Grow = Callable[[int, np.ndarray, jax.Array, Any], tuple[jax.Array, Any]]


def expand_tree(
    tree, scores: jax.Array, key: jax.Array, sampled: bool, grow: Grow | None = None, carry: Any = None, grammar=None
):
    """Expand `tree` level by level. scores [B, 1, V]: the root's (`candidate_scores`);
    after choosing the tokens of depth d, `grow` gives the scores of that level's nodes that
    have children (a drafter's forward over them, `tree_feed`). The rank-r child of a node
    is its r-th top-ranked token, or with `sampled` its own r-th i.i.d. draw from its
    distribution (recorded in q at the node).

    grammar: the round's GrammarState (DraftContext.grammar) or None. With one, a node's
    children come from its scores masked at the grammar state after the path to it (node
    states tracked level by level, as the verify's `states_in_tree`), so the tree proposes
    only what the constraint allows; a sampled node's q is that masked distribution.

    Returns (TreeProposal(tokens [B, N], q [B, N + 1, V] or None), carry).
    """
    b, vocab = scores.shape[0], scores.shape[-1]
    tokens = jnp.zeros((b, tree.num_nodes + 1), jnp.int32)  # node 0 (the root) unused
    q_all = jnp.zeros((b, tree.num_nodes + 1, vocab), jnp.float32) if sampled else None
    parents = np.array([0])  # [P]: the nodes `scores` belong to
    # [B, N + 1]: the grammar state after the path to each node (the root: the row's state)
    node_states = None
    if grammar is not None:
        node_states = jnp.zeros((b, tree.num_nodes + 1), jnp.int32).at[:, 0].set(grammar.states)
    keys = jax.random.split(key, tree.depth)
    for depth in range(1, tree.depth + 1):
        nodes = tree.level(depth)  # [M]
        local = np.searchsorted(parents, tree.parents[nodes])  # each node's parent within `parents`
        ranks = tree.ranks[nodes]
        if grammar is not None:
            scores = _constrained_scores(scores, grammar.next_state, node_states[:, parents], sampled)  # [B, P, V]
        if sampled:
            q_all = q_all.at[:, parents].set(scores)
            shape = (int(ranks.max()) + 1, b, parents.size)
            draws = jax.random.categorical(keys[depth - 1], jnp.log(scores), axis=-1, shape=shape)
            chosen = draws[ranks, :, local].T  # [B, M]: each parent's own i.i.d. draws
        else:
            rows = np.minimum(local, scores.shape[1] - 1)  # one row of scores: every parent's
            chosen = jax.lax.top_k(scores, int(ranks.max()) + 1)[1][:, rows, ranks]  # [B, M]
        tokens = tokens.at[:, nodes].set(chosen.astype(jnp.int32))
        if grammar is not None:
            after = grammar_step(grammar.next_state, node_states[:, tree.parents[nodes]], chosen)  # [B, M]
            node_states = node_states.at[:, nodes].set(after)
        parents = tree.internal(depth)
        if depth == tree.depth or parents.size == 0:
            break
        scores, carry = grow(depth, parents, tokens, carry)
    return TreeProposal(tokens=tokens[:, 1:], q=q_all), carry


def _constrained_scores(scores: jax.Array, next_state: jax.Array, states: jax.Array, sampled: bool) -> jax.Array:
    """scores [B, 1 or P, V] of the parents at grammar states [B, P] -> [B, P, V] allowing only
    what each parent's state allows: ranked scores (logits, or "top" candidates'
    probabilities) get -inf where forbidden; a sampled node's probabilities are renormalised
    over the allowed tokens (uniform over them where the draft gave them no mass, e.g. all
    filtered out by top-k), the distribution its children are then really drawn from."""
    ok = allowed(next_state, states)  # [B, P, V]
    scores = jnp.broadcast_to(scores, ok.shape)
    if not sampled:
        return jnp.where(ok, scores, -jnp.inf)
    kept = jnp.where(ok, scores, 0.0)
    total = jnp.sum(kept, axis=-1, keepdims=True)
    uniform = ok / jnp.sum(ok, axis=-1, keepdims=True)
    return jnp.where(total > 0, kept / jnp.where(total > 0, total, 1.0), uniform)


def tree_feed(tree, start: jax.Array, depth: int, parents: np.ndarray) -> tuple[jax.Array, TreeMask]:
    """Where the level's nodes `parents` [F] at `depth` are fed: positions [B, F] = start +
    depth, tree slots start + i (start [B]: the root's slot and position, lengths - 1), each
    seeing the prefix and its ancestors (the TreeMask)."""
    slots = start[:, None] + parents  # [B, F]
    positions = jnp.broadcast_to(start[:, None] + depth, slots.shape)
    return positions, TreeMask(start=start, slots=slots, visible=jnp.asarray(tree.ancestors)[parents])


def cartesian_tree(tree, scores: jax.Array, key: jax.Array, sampled: bool, grammar=None) -> TreeProposal:
    """A Cartesian-product tree from one distribution per depth, whatever the parent.

    scores [B, D, V]: depth d's logits (greedy) or processed probabilities, d = 1..D, for
    drafters whose depth-d guess does not read the tokens above it (Medusa heads, parallel
    drafting, a block head). A node's rank-r child is the r-th top-ranked token of its
    depth, or with `sampled` its own r-th i.i.d. draw from that depth's distribution
    (recorded in q at the parent); with a grammar, masked per node (`expand_tree`).
    Returns TreeProposal(tokens [B, N], q [B, N + 1, V] or None).
    """

    def next_depth(depth, parents, tokens, carry):
        return scores[:, depth : depth + 1], carry  # [B, 1, V]: the same for every parent

    return expand_tree(tree, scores[:, :1], key, sampled, next_depth, grammar=grammar)[0]
