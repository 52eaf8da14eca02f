"""Acceptance rules: how one speculative round decides what to keep.

A rule is a pure function of one round's drafts and the two models' distributions, so a
new verification scheme (lossy, typical, tree) is a new function here, passed as
`SpeculativeConfig(rule=...)`; the round itself never changes.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from specjax.core.sampling import SamplingConfig, sample

# An acceptance rule decides one speculative round for every row of a batch:
#   rule(key, draft_tokens [B, K], p [B, K+1, V], q [B, K, V] | None) -> (num_accepted [B], next_token [B])
# p holds the target's distributions at the K+1 verified positions, processed by
# `probabilities` (temperature, top-k, top-p, min-p): under greedy sampling the one-hot on
# the argmax, its temperature -> 0 limit, on which every exact rule decides as greedy_rule.
# q holds the draft's processed probabilities its tokens were sampled from, or is None when
# the proposal is deterministic (prompt lookup, greedy drafting): q is then one-hot on each
# draft token, and rules never build that [B, K, V] one-hot. next_token is the correction
# (num_accepted < K) or bonus (num_accepted == K) token that closes the round.
AcceptanceRule = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def _at(x: jax.Array, index: jax.Array) -> jax.Array:
    """x[b, index[b]] for x [B, N, ...] and index [B] already within [0, N)."""
    return jnp.take_along_axis(x, index.reshape(-1, *([1] * (x.ndim - 1))), axis=1)[:, 0]


def _prefix_length(ok: jax.Array) -> jax.Array:
    """Length of the all-True prefix of ok [B, K] -> [B] int32, without data-dependent shapes."""
    return jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)


def greedy_rule(key, draft_tokens, p, q):
    """Accept while the draft token equals the target argmax; close with the target argmax.

    Reads only argmax(p), so it takes p or the raw logits alike; on a one-hot p it is what
    rejection_sampling_rule decides, without drawing."""
    del key, q
    target_choice = jnp.argmax(p, axis=-1).astype(jnp.int32)  # [B, K+1]
    n = _prefix_length(draft_tokens == target_choice[:, :-1])
    return n, _at(target_choice, n)


def rejection_sampling_rule(key, draft_tokens, p, q):
    """Exact speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    Accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection draw
    from norm(max(0, p_i - q_i)); after K acceptances draw the bonus from p_{K+1}. Because
    min(p, q) + (p - q)_+ = p, every emitted token is distributed exactly as the target.
    With a deterministic proposal (q None, one-hot) this is: accept d_i with probability
    p_i(d_i); on rejection draw from p_i with d_i removed, renormalised (as vLLM does for
    n-gram drafts).
    """
    accept_key, residual_key = jax.random.split(key)
    b, k = draft_tokens.shape
    p_draft = jnp.take_along_axis(p[:, :k], draft_tokens[..., None], axis=-1)[..., 0]  # [B, K]
    u = jax.random.uniform(accept_key, p_draft.shape)
    if q is None:
        n = _prefix_length(u < p_draft)
        # The one-hot q of the rejected token, and a zero row after the K-th position.
        rejected = _at(jnp.concatenate([draft_tokens, jnp.zeros_like(draft_tokens[:, :1])], axis=1), n)  # [B]
        q_n = jax.nn.one_hot(rejected, p.shape[-1], dtype=p.dtype) * (n < k)[:, None]  # [B, V]
    else:
        q_draft = jnp.take_along_axis(q, draft_tokens[..., None], axis=-1)[..., 0]  # [B, K]
        n = _prefix_length(u * q_draft < p_draft)  # u < p/q without dividing by q
        # A zero q row after the K-th position turns the residual at n == K into p_{K+1}.
        q_n = _at(jnp.concatenate([q, jnp.zeros((b, 1, q.shape[-1]), q.dtype)], axis=1), n)  # [B, V]
    p_n = _at(p, n)  # [B, V]
    residual = jnp.maximum(p_n - q_n, 0.0)
    mass = jnp.sum(residual, axis=-1, keepdims=True)
    # p == q numerically leaves no residual mass; p itself is then the right distribution.
    residual = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_n)
    return n, sample(residual_key, residual)


def always_accept_rule(key, draft_tokens, p, q):
    """Wrong on purpose: accepts every draft token, so the output follows the draft.

    The negative control of every distribution test: a test that cannot tell this rule
    from `rejection_sampling_rule` has no power.
    """
    del q
    k = draft_tokens.shape[1]
    return jnp.full(draft_tokens.shape[:1], k, jnp.int32), sample(key, p[:, k])


def default_rule(sampling: SamplingConfig) -> AcceptanceRule:
    return greedy_rule if sampling.greedy else rejection_sampling_rule
