"""E7's statistical test: does speculative sampling emit the target's distribution?

The exact distributions are computable for the first two generated tokens: the first is
p(x1 | prompt), the second's marginal is sum_x1 p(x1) p(x2 | prompt, x1), one batched
forward over every x1. Many independent two-token continuations are drawn with
speculative sampling and compared with a chi-square test; the same test run with
`always_accept_rule` (a deliberately wrong verifier) must fail, or the test has no power.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from scipy import stats as scipy_stats

from specjax.api import generate
from specjax.config import GenerationConfig, SpeculativeConfig
from specjax.core.acceptance import always_accept_rule
from specjax.core.sampling import SamplingConfig, probabilities
from specjax.io.model import Model, logits


def chi_square_p_value(samples: np.ndarray, expected: np.ndarray) -> float:
    """Pearson chi-square of integer samples against probabilities over their support.

    Cells with expected count < 5 are pooled into one so the test stays valid; a sample
    the distribution gives zero probability fails outright.
    """
    observed = np.bincount(samples, minlength=expected.size).astype(np.float64)
    expected = np.asarray(expected, np.float64) * len(samples)
    if observed[expected == 0].sum() > 0:
        return 0.0
    small = (expected < 5) & (expected > 0)
    observed = np.append(observed[expected >= 5], observed[small].sum())
    expected = np.append(expected[expected >= 5], expected[small].sum())
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    return float(scipy_stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue)


def exact_first_two(target: Model, prompt: list[int], sampling: SamplingConfig) -> tuple[np.ndarray, np.ndarray]:
    """The target's distributions of generated tokens 1 and 2 (marginal): ([V], [V])."""
    vocab = target.config.vocab_size
    p1 = np.asarray(probabilities(jnp.asarray(logits(target, [prompt])[0, -1]), sampling), np.float64)
    extended = np.concatenate([np.tile(prompt, (vocab, 1)), np.arange(vocab)[:, None]], axis=1)  # [V, T+1]
    p2_given_1 = np.asarray(probabilities(jnp.asarray(logits(target, extended)[:, -1]), sampling), np.float64)
    return p1, p1 @ p2_given_1


def _tv(samples: np.ndarray, expected: np.ndarray) -> float:
    observed = np.bincount(samples, minlength=expected.size) / len(samples)
    return float(0.5 * np.abs(observed - expected).sum())


def distribution_test(
    target: Model, draft: Model, prompt: list[int], k: int, temperature: float, samples: int, seed: int = 0
) -> list[dict]:
    """Chi-square p-values and TV distances for the exact rule and the negative control."""
    sampling = SamplingConfig(temperature)
    p1, p2 = exact_first_two(target, prompt, sampling)
    rows = []
    for name, rule in (("rejection_sampling", None), ("always_accept (negative control)", always_accept_rule)):
        config = GenerationConfig.at_temperature(temperature, max_new_tokens=2, seed=seed, ignore_eos=True)
        speculative = SpeculativeConfig(num_speculative_tokens=k, rule=rule)
        out = generate(target, [prompt] * samples, config, draft=draft, speculative=speculative)
        tokens = np.asarray(out.tokens)  # [samples, 2]
        rows.append(
            {
                "rule": name,
                "num_speculative_tokens": k,
                "temperature": temperature,
                "samples": samples,
                "p_value_token_1": chi_square_p_value(tokens[:, 0], p1),
                "p_value_token_2": chi_square_p_value(tokens[:, 1], p2),
                "tv_token_1": _tv(tokens[:, 0], p1),
                "tv_token_2": _tv(tokens[:, 1], p2),
            }
        )
    return rows
