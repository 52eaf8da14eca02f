"""Divergences: hand-checkable values and gradients on tiny distributions."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.training.divergences import get_divergence

P = np.array([0.5, 0.3, 0.2])
Q = np.array([0.2, 0.2, 0.6])
LOGITS_P, LOGITS_Q = jnp.log(jnp.asarray(P)), jnp.log(jnp.asarray(Q))


def _kl(a, b):
    return float(np.sum(a * np.log(a / b)))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("forward_kl", _kl(P, Q)),
        ("reverse_kl", _kl(Q, P)),
        ("jsd", 0.5 * _kl(P, (P + Q) / 2) + 0.5 * _kl(Q, (P + Q) / 2)),
        ("tv", 0.5 * np.abs(P - Q).sum()),
    ],
)
def test_closed_forms(name, expected):
    value = float(get_divergence(name)(LOGITS_P, LOGITS_Q))
    assert value == pytest.approx(expected, rel=1e-5)


def test_tv_is_one_minus_acceptance():
    assert float(get_divergence("tv")(LOGITS_P, LOGITS_Q)) == pytest.approx(1 - np.minimum(P, Q).sum(), rel=1e-6)


def test_jsd_beta_weights_and_bound():
    beta = 0.2
    m = beta * P + (1 - beta) * Q
    expected = beta * _kl(P, m) + (1 - beta) * _kl(Q, m)
    assert float(get_divergence("jsd", beta=beta)(LOGITS_P, LOGITS_Q)) == pytest.approx(expected, rel=1e-5)
    disjoint_p, disjoint_q = jnp.array([0.0, -50.0]), jnp.array([-50.0, 0.0])
    assert float(get_divergence("jsd")(disjoint_p, disjoint_q)) == pytest.approx(math.log(2), rel=1e-4)


@pytest.mark.parametrize("name", ["forward_kl", "reverse_kl", "jsd", "tv"])
def test_zero_with_zero_gradient_when_equal(name):
    logits = jnp.asarray([1.0, -0.5, 0.3, 2.0])
    divergence = get_divergence(name)
    assert float(divergence(logits, logits)) == pytest.approx(0.0, abs=1e-6)
    if name != "tv":  # |p - q| has a kink at p == q; its subgradient there is not unique
        grad = jax.grad(lambda q: divergence(logits, q))(logits)
        np.testing.assert_allclose(np.asarray(grad), 0.0, atol=1e-6)


def test_forward_kl_gradient_is_q_minus_p():
    """d KL(p || softmax(z)) / dz = q - p: the textbook distillation gradient."""
    grad = jax.grad(lambda z: get_divergence("forward_kl")(LOGITS_P, z))(LOGITS_Q)
    np.testing.assert_allclose(np.asarray(grad), Q - P, atol=1e-6)


def test_temperature_flattens_both_sides():
    hot = float(get_divergence("forward_kl", temperature=4.0)(LOGITS_P, LOGITS_Q))
    assert 0 < hot < float(get_divergence("forward_kl")(LOGITS_P, LOGITS_Q))


def test_descent_on_tv_reduces_it():
    divergence = get_divergence("tv")
    z = LOGITS_Q
    for _ in range(50):
        z = z - 0.5 * jax.grad(lambda q: divergence(LOGITS_P, q))(z)
    assert float(divergence(LOGITS_P, z)) < 0.05


def test_errors():
    with pytest.raises(ValueError, match="unknown divergence"):
        get_divergence("kl")
    with pytest.raises(ValueError, match="temperature must be > 0"):
        get_divergence("tv", temperature=0.0)
    with pytest.raises(ValueError, match=r"beta must be in \(0, 1\)"):
        get_divergence("jsd", beta=1.0)
