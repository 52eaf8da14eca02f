"""Turning logits into tokens: temperature, top-k, top-p, and the acceptance rules of a round.

The same `probabilities` is applied to the draft's and the target's logits. That matters:
speculative sampling is exact only if p and q are the *processed* distributions the two
models would actually sample from (a known bug class when one side skips top-p).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How a distribution is drawn from logits. temperature 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        if not self.temperature >= 0.0:  # also rejects NaN
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probabilities(logits: jax.Array, sampling: SamplingConfig) -> jax.Array:
    """logits [..., V] -> float32 probabilities [..., V] after temperature, top-k, top-p."""
    logits = logits.astype(jnp.float32) / (sampling.temperature if not sampling.greedy else 1.0)
    if sampling.top_k is not None and sampling.top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, sampling.top_k)[0][..., -1:]  # [..., 1]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    probs = jax.nn.softmax(logits, axis=-1)
    if sampling.top_p is not None and sampling.top_p < 1.0:
        # Keep the smallest prefix of the sorted distribution whose mass reaches top_p:
        # a token is kept if the mass strictly before it is < top_p (the top one always is).
        sorted_probs = -jnp.sort(-probs, axis=-1)
        mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
        kept = jnp.where(mass_before < sampling.top_p, sorted_probs, jnp.inf)
        threshold = jnp.min(kept, axis=-1, keepdims=True)
        probs = jnp.where(probs >= threshold, probs, 0.0)
        probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
    return probs


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
    """One categorical draw per row: probs [..., V] -> int32 tokens [...]."""
    return jax.random.categorical(key, jnp.log(probs), axis=-1).astype(jnp.int32)


def select(key: jax.Array, logits: jax.Array, sampling: SamplingConfig) -> jax.Array:
    """Next token from logits [..., V]: argmax when greedy, else a sample. -> [...] int32."""
    if sampling.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return sample(key, probabilities(logits, sampling))


# An acceptance rule decides one speculative round for every row of a batch:
#   rule(key, draft_tokens [B, K], p [B, K+1, V], q [B, K, V]) -> (num_accepted [B], next_token [B])
# p holds the target's distributions at the K+1 verified positions (raw logits when greedy),
# q the draft's distributions its tokens were sampled from. next_token is the correction
# (num_accepted < K) or bonus (num_accepted == K) token that closes the round.
AcceptanceRule = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def _at(x: jax.Array, index: jax.Array) -> jax.Array:
    """x[b, index[b]] for x [B, N, ...] and index [B] already within [0, N)."""
    return jnp.take_along_axis(x, index.reshape(-1, *([1] * (x.ndim - 1))), axis=1)[:, 0]


def _prefix_length(ok: jax.Array) -> jax.Array:
    """Length of the all-True prefix of ok [B, K] -> [B] int32, without data-dependent shapes."""
    return jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)


def greedy_rule(key, draft_tokens, p, q):
    """Accept while the draft token equals the target argmax; close with the target argmax."""
    del key, q
    target_choice = jnp.argmax(p, axis=-1).astype(jnp.int32)  # [B, K+1]
    n = _prefix_length(draft_tokens == target_choice[:, :-1])
    return n, _at(target_choice, n)


def rejection_sampling_rule(key, draft_tokens, p, q):
    """Exact speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    Accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection draw
    from norm(max(0, p_i - q_i)); after K acceptances draw the bonus from p_{K+1}. Because
    min(p, q) + (p - q)_+ = p, every emitted token is distributed exactly as the target.
    """
    accept_key, residual_key = jax.random.split(key)
    k = draft_tokens.shape[1]
    p_draft = jnp.take_along_axis(p[:, :k], draft_tokens[..., None], axis=-1)[..., 0]  # [B, K]
    q_draft = jnp.take_along_axis(q, draft_tokens[..., None], axis=-1)[..., 0]  # [B, K]
    u = jax.random.uniform(accept_key, q_draft.shape)
    n = _prefix_length(u * q_draft < p_draft)  # u < p/q without dividing by q
    # A zero q row after the K-th position turns the residual at n == K into p_{K+1}.
    q_padded = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)  # [B, K+1, V]
    p_n = _at(p, n)  # [B, V]
    residual = jnp.maximum(p_n - _at(q_padded, n), 0.0)
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
