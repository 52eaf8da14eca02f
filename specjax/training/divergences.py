"""Divergences between a target distribution p and a draft distribution q, from logits.

All take logits [..., V] and return the per-position divergence [...] in nats (TV is a
probability mass). The quantity that sets speculative acceptance is total variation:
per-position acceptance alpha = sum_x min(p, q) = 1 - TV(p, q) (Leviathan et al.), which
is why DistillSpec (Zhou et al. 2024) treats the choice of divergence as a design knob.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

Divergence = Callable[[jax.Array, jax.Array], jax.Array]


def _log_probs(logits, temperature: float):
    return jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)


def forward_kl(target_logits, draft_logits, temperature: float = 1.0):
    """KL(p || q) = sum p (log p - log q): mass-covering, the usual distillation loss."""
    log_p, log_q = _log_probs(target_logits, temperature), _log_probs(draft_logits, temperature)
    return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)


def reverse_kl(target_logits, draft_logits, temperature: float = 1.0):
    """KL(q || p) = sum q (log q - log p): mode-seeking."""
    log_p, log_q = _log_probs(target_logits, temperature), _log_probs(draft_logits, temperature)
    return jnp.sum(jnp.exp(log_q) * (log_q - log_p), axis=-1)


def generalized_jsd(target_logits, draft_logits, temperature: float = 1.0, beta: float = 0.5):
    """beta KL(p || m) + (1 - beta) KL(q || m) with m = beta p + (1 - beta) q.

    beta -> 0 behaves like forward KL scaled by beta, beta -> 1 like reverse KL; 0.5 is
    the symmetric Jensen-Shannon divergence (bounded by log 2).
    """
    log_p, log_q = _log_probs(target_logits, temperature), _log_probs(draft_logits, temperature)
    log_m = jnp.logaddexp(jnp.log(beta) + log_p, jnp.log1p(-beta) + log_q)
    kl_pm = jnp.sum(jnp.exp(log_p) * (log_p - log_m), axis=-1)
    kl_qm = jnp.sum(jnp.exp(log_q) * (log_q - log_m), axis=-1)
    return beta * kl_pm + (1.0 - beta) * kl_qm


def total_variation(target_logits, draft_logits, temperature: float = 1.0):
    """TV(p, q) = 1/2 sum |p - q| = 1 - sum min(p, q): one minus the acceptance probability."""
    p = jnp.exp(_log_probs(target_logits, temperature))
    q = jnp.exp(_log_probs(draft_logits, temperature))
    return 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)


DIVERGENCES: dict[str, Callable] = {
    "forward_kl": forward_kl,
    "reverse_kl": reverse_kl,
    "jsd": generalized_jsd,
    "tv": total_variation,
}


def get_divergence(name: str, temperature: float = 1.0, beta: float = 0.5) -> Divergence:
    """The divergence `name` with its temperature (and beta for "jsd") bound."""
    if name not in DIVERGENCES:
        raise ValueError(f"unknown divergence {name!r}; choose one of {', '.join(DIVERGENCES)}")
    if not temperature > 0:
        raise ValueError(f"distillation temperature must be > 0, got {temperature}")
    if name == "jsd":
        if not 0.0 < beta < 1.0:
            raise ValueError(f"jsd beta must be in (0, 1), got {beta}")
        return lambda p, q: generalized_jsd(p, q, temperature, beta)
    fn = DIVERGENCES[name]
    return lambda p, q: fn(p, q, temperature)
