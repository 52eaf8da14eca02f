"""Turning logits into tokens: temperature, top-k, top-p, sampling.

The same `probabilities` is applied to the draft's and the target's logits. That matters:
speculative sampling is exact only if p and q are the *processed* distributions the two
models would actually sample from (a known bug class when one side skips top-p).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.models.vocab_top_k import top_k


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How a distribution is drawn from logits. temperature 0 means greedy (argmax).

    The filters apply in Hugging Face's order: temperature, top_k, top_p, min_p (keep tokens
    whose probability is >= min_p x the most likely one's)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def __post_init__(self):
        if not self.temperature >= 0.0:  # also rejects NaN
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p}")
        if self.min_p is not None and not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1] or None, got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probabilities(logits: jax.Array, sampling: SamplingConfig) -> jax.Array:
    """logits [..., V] -> float32 probabilities [..., V] after temperature, top-k, top-p, min-p.

    Greedy (temperature 0) gives the temperature -> 0 limit: the one-hot on the argmax (the
    first one on ties, as `select` picks it; every filter keeps the top token, so they do
    not change it). So p means one thing under every sampling config, and the exact rules
    on a one-hot p decide as the greedy ones do (tests/test_sampling.py checks both).
    """
    if sampling.greedy:
        return jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
    logits = logits.astype(jnp.float32) / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < logits.shape[-1]:
        kth = top_k(logits, sampling.top_k)[0][..., -1:]  # [..., 1]; not fused into the mask: models/vocab_top_k.py
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    probs = jax.nn.softmax(logits, axis=-1)
    if sampling.top_p is not None and sampling.top_p < 1.0:
        threshold = _top_p_threshold(probs, sampling.top_p)  # [..., 1]
        probs = jnp.where(probs >= threshold, probs, 0.0)
        probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
    if sampling.min_p is not None and sampling.min_p > 0.0:
        floor = sampling.min_p * jnp.max(probs, axis=-1, keepdims=True)  # the top token always stays
        probs = jnp.where(probs >= floor, probs, 0.0)
        probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
    return probs


# How many of the most likely tokens top-p looks at before it sorts the whole vocabulary.
TOP_P_CANDIDATES = 256


def _top_p_threshold(probs: jax.Array, top_p: float) -> jax.Array:
    """probs [..., V] -> [..., 1]: the least probability top-p keeps. The kept tokens are the
    smallest prefix of the sorted distribution whose mass reaches top_p (a token is kept if
    the mass strictly before it is < top_p; the top one always is).

    The prefix is looked for among the TOP_P_CANDIDATES most likely tokens first (a top_k,
    in the order a stable sort gives them), and the whole vocabulary is sorted only when
    their mass falls short of top_p in some row: on XLA:CPU a sort of SmolLM2's 49,152
    probabilities took about 100 ms per call, a top_k of 256 about 1 ms."""

    def threshold(sorted_probs):  # [..., n] descending -> [..., 1]
        mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
        kept = jnp.where(mass_before < top_p, sorted_probs, jnp.inf)
        return jnp.min(kept, axis=-1, keepdims=True)

    if probs.shape[-1] <= TOP_P_CANDIDATES:
        return threshold(-jnp.sort(-probs, axis=-1))
    head = top_k(probs, TOP_P_CANDIDATES)[0]  # [..., n]
    enough = jnp.all(jnp.sum(head, axis=-1) >= top_p)  # every row's prefix lies inside the head
    return jax.lax.cond(enough, threshold, lambda _: threshold(-jnp.sort(-probs, axis=-1)), head)


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
    """One categorical draw per row: probs [..., V] -> int32 tokens [...]."""
    return jax.random.categorical(key, jnp.log(probs), axis=-1).astype(jnp.int32)


def select(key: jax.Array, logits: jax.Array, sampling: SamplingConfig) -> jax.Array:
    """Next token from logits [..., V]: argmax when greedy, else a sample. -> [...] int32."""
    if sampling.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return sample(key, probabilities(logits, sampling))
