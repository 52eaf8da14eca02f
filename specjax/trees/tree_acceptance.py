"""Acceptance rules for a token tree: the longest root path the target agrees with.

A tree rule decides one tree round for every row of a batch:

    rule(key, tree, tokens [B, N], p [B, N + 1, V], q [B, N + 1, V] | None)
        -> (path [B, D], num_accepted [B], next_token [B])

tokens are the drafted nodes 1..N (canonical order, see tree.py). p[:, i] is the target's
distribution after node i (node 0 = the root, the last committed token), processed by
`probabilities`: under greedy sampling the one-hot on the argmax, of which the greedy rule
reads only the argmax and on which the rejection rule decides the same. q[:, i] is the
draft distribution node i's children were drawn from (i.i.d.), or q is None when the
candidates are deterministic and distinct (top-k, prompt-lookup matches). path[:, j] is the node accepted at depth j + 1
(0 past num_accepted); next_token closes the round as in a chain.

Exactness under sampling (SpecInfer, Miao et al. 2024; SpecTr, Sun et al. 2023): at a node
with target distribution p and children c_1..c_m drawn i.i.d. from q, try them in order:
accept c_j with probability min(1, r_j(c_j) / q(c_j)), where r_1 = p and, after a rejection,
r_{j+1} = norm(max(0, r_j - q)); if all are rejected, emit a draw from r_{m+1}. Each step is
one chain round's rejection sampling with target r_j, so the token leaving the node (an
accepted child or the final draw) is distributed as r_j's mixture min(r_j, q) + (r_j - q)_+
= r_j, i.e. by induction as p; below an accepted child the argument repeats with that
child's p. With deterministic distinct candidates (q one-hot on c_j) the same recursion
reads: accept c_j with probability r_j(c_j), and on rejection remove c_j from r_j and
renormalise (recursive rejection sampling without replacement, Jeon et al. 2024).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specjax.core.sampling import SamplingConfig, sample


def _rows(x: jax.Array, index: jax.Array) -> jax.Array:
    """x[b, index[b]] for x [B, M, ...], index [B] -> [B, ...]."""
    return jnp.take_along_axis(x, index.reshape(-1, *([1] * (x.ndim - 1))), axis=1)[:, 0]


def _normalise(r: jax.Array, fallback: jax.Array) -> jax.Array:
    """r / sum(r) per row; rows with no mass (r == 0: p equalled q) fall back to `fallback`."""
    mass = jnp.sum(r, axis=-1, keepdims=True)
    return jnp.where(mass > 0, r / jnp.where(mass > 0, mass, 1.0), fallback)


def _walk(key, tree, tokens, p, q, greedy: bool, update_residual: bool):
    """Descend the tree one depth at a time; see the module docstring for the rule."""
    b = tokens.shape[0]
    node_tokens = jnp.concatenate([jnp.zeros_like(tokens[:, :1]), tokens], axis=1)  # [B, N+1]
    children = jnp.asarray(tree.children)  # [N+1, C], -1 padded
    cur = jnp.zeros((b,), jnp.int32)  # the last accepted node (the root to start)
    searching = jnp.ones((b,), bool)
    path = jnp.zeros((b, tree.depth), jnp.int32)
    final = jnp.zeros_like(p[:, 0])  # [B, V]: what the closing token is drawn from
    keys = None if greedy else jax.random.split(key, tree.depth * children.shape[1] + 1)
    for depth in range(tree.depth):
        kids = children[cur]  # [B, C]
        kid_tokens = jnp.take_along_axis(node_tokens, jnp.maximum(kids, 0), axis=1)  # [B, C]
        r = _rows(p, cur)  # [B, V]
        found = jnp.zeros((b,), bool)
        chosen = jnp.zeros((b,), jnp.int32)
        if greedy:
            match = (kids >= 0) & (kid_tokens == jnp.argmax(r, axis=-1)[:, None])
            found, chosen = jnp.any(match, axis=1), _rows(kids, jnp.argmax(match, axis=1))
        else:
            q_node = None if q is None else _rows(q, cur)  # [B, V]
            original = r
            for j in range(children.shape[1]):
                trying = (kids[:, j] >= 0) & ~found
                token = kid_tokens[:, j]
                target = r if update_residual else original
                p_tok = jnp.take_along_axis(target, token[:, None], axis=1)[:, 0]
                u = jax.random.uniform(keys[depth * children.shape[1] + j], (b,))
                if q_node is None:
                    accept = u < p_tok
                    residual = target * (jnp.arange(r.shape[-1])[None, :] != token[:, None])
                else:
                    q_tok = jnp.take_along_axis(q_node, token[:, None], axis=1)[:, 0]
                    accept = u * q_tok < p_tok  # u < p/q without dividing by q
                    residual = jnp.maximum(target - q_node, 0.0)
                residual = _normalise(residual, target)
                rejected = trying & ~accept
                r = jnp.where(rejected[:, None], residual, r)
                chosen = jnp.where(trying & accept, kids[:, j], chosen)
                found = found | (trying & accept)
        advance = searching & found
        stop = searching & ~found
        final = jnp.where(stop[:, None], r, final)
        path = path.at[:, depth].set(jnp.where(advance, chosen, 0))
        cur = jnp.where(advance, chosen, cur)
        searching = advance
    # Rows that accepted a node at the deepest level close with the target's bonus token.
    final = jnp.where(searching[:, None], _rows(p, cur), final)
    num_accepted = jnp.sum(path > 0, axis=1).astype(jnp.int32)
    next_token = jnp.argmax(final, axis=-1).astype(jnp.int32) if greedy else sample(keys[-1], final)
    return path, num_accepted, next_token


def tree_greedy_rule(key, tree, tokens, p, q):
    """Accept the root path whose every token is the target's argmax at its parent."""
    return _walk(key, tree, tokens, p, q, greedy=True, update_residual=True)


def tree_rejection_rule(key, tree, tokens, p, q):
    """Exact multi-candidate speculative sampling (recursive rejection; module docstring)."""
    return _walk(key, tree, tokens, p, q, greedy=False, update_residual=True)


def tree_no_residual_rule(key, tree, tokens, p, q):
    """Wrong on purpose: tries every sibling against the original p, never the residual.

    With one candidate per node it is the chain rule and exact; with siblings it
    over-accepts the later ones. The negative control of the tree distribution tests.
    """
    return _walk(key, tree, tokens, p, q, greedy=False, update_residual=False)


@functools.cache
def default_tree_rule(sampling: SamplingConfig):
    return tree_greedy_rule if sampling.greedy else tree_rejection_rule
