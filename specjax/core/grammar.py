"""The grammar on the device (compiled by specjax/constraints/table.py): the loop state's
part, and the jittable steps rounds take.

Masks are gathers from the table (constraints/table.py): state s allows token v iff next_state[s, v]
>= 0, and a token moves a row's state by one more gather. Shapes are static, so every
round kind masks and advances the same way:

- a plain step masks the target's logits at the row's state;
- a chain round masks position i at the state after drafts d_1..d_i (`states_along`); a
  forbidden draft gets p = 0 there and is rejected, and the positions after it (never
  reached) keep its last valid state so their distributions stay well formed;
- a tree round masks node i at the state after the path to it (`states_in_tree`);
- `finish_round` moves each row along the tokens it committed (`after_commit`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


@struct.dataclass
class GrammarState:
    """LoopState.grammar: the table every row runs on and where each row is."""

    next_state: jax.Array  # [S, V] int16/int32: the state after token v in state s; -1 forbidden
    states: jax.Array  # [B] int32: each row's state after its committed tokens


def init_grammar(next_state: np.ndarray, starts: np.ndarray) -> GrammarState:
    """The device form of a table and per-row start states ([B] int32)."""
    return GrammarState(next_state=jax.device_put(next_state), states=jax.device_put(starts.astype(np.int32)))


def allowed(next_state: jax.Array, states: jax.Array) -> jax.Array:
    """states [...] -> [..., V] bool: the tokens each state allows."""
    return next_state[states] >= 0


def mask_logits(logits: jax.Array, next_state: jax.Array, states: jax.Array) -> jax.Array:
    """logits [..., V] with -inf where the state (states [...]) forbids the token. Applied
    before `probabilities`, so temperature and the filters act on the constrained
    distribution, and greedy takes the argmax over the allowed tokens."""
    return jnp.where(allowed(next_state, states), logits, -jnp.inf)


def step(next_state: jax.Array, states: jax.Array, tokens: jax.Array) -> jax.Array:
    """states [B], tokens [B] -> [B]: the state after each token, or the same state where the
    token is forbidden (a rejected draft: what follows it is never committed)."""
    after = next_state[states, tokens].astype(jnp.int32)
    return jnp.where(after >= 0, after, states)


def states_along(next_state: jax.Array, states: jax.Array, tokens: jax.Array) -> jax.Array:
    """states [B], tokens [B, W] -> [B, W + 1]: the state before each token and after the last."""
    out = [states]
    for i in range(tokens.shape[1]):  # W is small and static (K + 1, a tree's depth + 1)
        out.append(step(next_state, out[-1], tokens[:, i]))
    return jnp.stack(out, axis=1)


def states_in_tree(next_state: jax.Array, states: jax.Array, nodes: jax.Array, parents) -> jax.Array:
    """states [B], nodes [B, N], parents [N + 1] (a Tree's; parents precede children) ->
    [B, N + 1]: the state at the root (states) and after the path to each node."""
    out = [states]
    for i in range(1, nodes.shape[1] + 1):
        out.append(step(next_state, out[int(parents[i])], nodes[:, i - 1]))
    return jnp.stack(out, axis=1)


def after_commit(grammar: GrammarState, candidates: jax.Array, count: jax.Array) -> GrammarState:
    """The rows' states after committing the first count [B] of candidates [B, W]."""
    along = states_along(grammar.next_state, grammar.states, candidates)  # [B, W + 1]
    states = jnp.take_along_axis(along, count[:, None], axis=1)[:, 0]
    return grammar.replace(states=states)
