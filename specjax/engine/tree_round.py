"""One tree round: draft a token tree, verify it in one target forward, commit the best path.

The tree counterpart of `chain_round` (rounds.py), over the same LoopState and ending in the
same `finish_round`, so both run in the same compiled while loop. With N nodes the target forward has width N + 1:
the root (the last committed token, at slot and position L - 1) and node i at slot L - 1 + i
and position L - 1 + depth(i). Siblings share a position, so they cannot share the slot
= position layout: a TreeMask lets each node see the committed prefix and its ancestors.
After the rule picks a root path, its nodes' K/V move to the slots of their positions
(`KVCache.move`) in the target cache and, through the drafter, in any draft cache, so the
next round sees a plain prefix.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.core.grammar import mask_logits, states_in_tree
from specjax.core.loop import gather_tokens
from specjax.core.sampling import probabilities
from specjax.core.state import LoopState, finish_round
from specjax.engine.rounds import draft_context
from specjax.models import PathLayout, TreeMask, forward


def tree_round(target_params, draft_weights, state: LoopState) -> LoopState:
    """One tree round as a pure function of the parameters and the loop state."""
    plan = state.plan
    tree = plan.tree
    rng, draft_key, accept_key = jax.random.split(state.rng, 3)
    lengths = state.lengths
    ctx = draft_context(state, target_params)
    proposal, draft_state = plan.drafter.propose_tree(draft_weights, state.draft_state, ctx, draft_key)
    nodes = proposal.tokens  # [B, N]

    # Verify the whole tree at once: window slots L-1..L-1+N, positions L-1+depth.
    start = lengths - 1  # [B]
    slots = start[:, None] + jnp.arange(tree.num_nodes + 1)  # [B, N+1]
    positions = start[:, None] + jnp.asarray(tree.depths)  # [B, N+1]
    verify_tokens = jnp.concatenate([gather_tokens(state.tokens, start[:, None]), nodes], axis=1)
    # The layout lays the nodes at their positions for the bfloat16 / int8 formats' sums (read
    # only there, models/tree_layout.py): what keeps their greedy output plain greedy output.
    layout = PathLayout.of(tree.parents)
    mask = TreeMask(start=start, slots=slots, visible=jnp.asarray(tree.ancestors), layout=layout)
    wants = plan.wants_features
    out = forward(plan.target, target_params, verify_tokens, positions, state.target_cache, mask, features=wants)
    logits, target_cache = out[:2]
    if state.grammar is not None:  # node i is masked at the state after the path to it
        grammar = state.grammar
        along = states_in_tree(grammar.next_state, grammar.states, nodes, tree.parents)  # [B, N+1]
        logits = mask_logits(logits, grammar.next_state, along)
    p = probabilities(logits, plan.sampling)  # [B, N+1, V]; greedy: the one-hot on each argmax
    path, num_accepted, next_token = plan.rule(accept_key, tree, nodes, p, proposal.q)  # [B, D], [B], [B]

    # Candidates [path tokens.., next, ...]: the first num_accepted + 1 count.
    depth = tree.depth
    j = jnp.arange(depth + 1)[None, :]
    path_tokens = jnp.take_along_axis(verify_tokens, path, axis=1)  # [B, D]
    padded = jnp.concatenate([path_tokens, jnp.zeros_like(path_tokens[:, :1])], axis=1)
    candidates = jnp.where(j == num_accepted[:, None], next_token[:, None], padded)
    # Compaction: accepted node path[j] (slot L-1+path[j]) belongs at slot L+j. A row that
    # accepted fewer nodes, or is done, points the rest past the cache end (dropped).
    live = ~state.done
    keep = (j[:, :depth] < num_accepted[:, None]) & live[:, None]
    src = start[:, None] + path  # [B, D]
    dst = jnp.where(keep, lengths[:, None] + j[:, :depth], target_cache.max_length)
    # Features of the root and the accepted path, in path order: [B, D+1, hidden].
    features = None
    if wants:
        order = jnp.concatenate([jnp.zeros_like(path[:, :1]), path], axis=1)  # [B, D+1]
        features = jnp.take_along_axis(out[2], order[:, :, None], axis=1)

    def update(tokens, new_lengths, done):
        after = ctx.replace(tokens=tokens, lengths=new_lengths, done=done, features=features)
        return plan.drafter.update_tree(draft_weights, draft_state, after, src, dst, num_accepted)

    return finish_round(state, candidates, num_accepted, target_cache.move(src, dst), rng, update)
