"""Block verification (core/acceptance.py, Sun et al., arXiv 2403.10444) keeps the target's
distribution exactly and never accepts fewer tokens than token verification.

The rule is tested on hand-made prefix-dependent distributions over a 4-token vocabulary,
where the target's joint law of a whole round is known exactly, and end to end on tiny
models. Each distribution test has deliberately wrong variants that must fail it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import scaled_model
from test_sampling import P_VALUE_FAIL, P_VALUE_PASS, PROMPT, VOCAB8, _drafts_near, _exact_joint, _untied_logits

import specjax
from specjax.bench.distribution import chi_square_p_value
from specjax.core.acceptance import (
    RULES,
    _block_verification,
    block_verification_rule,
    greedy_rule,
    rejection_sampling_rule,
)
from specjax.core.sampling import SamplingConfig, probabilities

VOCAB, K = 4, 3
ROUNDS = 60000

# The deliberately wrong variants: each differs from the rule in one respect only.
VARIANTS = {
    "block": block_verification_rule,
    "unscaled_residual": functools.partial(_block_verification, scaled=False),
    "forward_prefix": functools.partial(_block_verification, backward=False),
}


# --- Prefix-dependent distributions and one round of the rule on them ----------------------


def _tables(seed: int, concentration: float = 0.5) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Target and draft conditionals for every prefix: p[L] [V^L, V] for L = 0..K, q[L] for
    L = 0..K-1, row = the prefix read as a base-V number."""
    rng = np.random.default_rng(seed)
    p = [rng.dirichlet(np.full(VOCAB, concentration), size=VOCAB**length) for length in range(K + 1)]
    q = [rng.dirichlet(np.full(VOCAB, concentration), size=VOCAB**length) for length in range(K)]
    return p, q


def _draw(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One token per row of probs [N, V]."""
    cdf = np.cumsum(probs, axis=-1)
    cdf[:, -1] = np.inf  # rounding never lets a draw fall past the last token
    return np.argmax(rng.random((len(probs), 1)) < cdf, axis=-1)


def _target_joint(p) -> np.ndarray:
    """The target's probability of every sequence of K + 1 tokens -> [V^(K+1)]."""
    joint = np.ones(1)
    for length in range(K + 1):
        joint = (joint[:, None] * p[length]).reshape(-1)  # row-major: extends the base-V code
    return joint


def _run(rule, p, q, rounds: int, seed: int, deterministic: bool = False):
    """Draft K tokens per row (sampled from q, or q's argmax with q None), judge them with
    `rule`, and complete the round's output with target draws up to K + 1 tokens.
    -> (codes of the first K + 1 output tokens [N], num_accepted [N])."""
    rng = np.random.default_rng(seed)
    code = np.zeros(rounds, np.int64)
    drafts, p_rows, q_rows = [], [], []
    for length in range(K):
        p_rows.append(p[length][code])
        q_rows.append(q[length][code])
        token = np.argmax(q_rows[-1], axis=-1) if deterministic else _draw(rng, q_rows[-1])
        drafts.append(token)
        code = code * VOCAB + token
    p_rows.append(p[K][code])
    n, next_token = jax.jit(rule)(
        jax.random.key(seed),
        jnp.asarray(np.stack(drafts, axis=1), jnp.int32),  # [N, K]
        jnp.asarray(np.stack(p_rows, axis=1), jnp.float32),  # [N, K+1, V]
        None if deterministic else jnp.asarray(np.stack(q_rows, axis=1), jnp.float32),  # [N, K, V]
    )
    n, next_token = np.asarray(n), np.asarray(next_token)
    out = np.zeros(rounds, np.int64)
    for position in range(K + 1):  # the kept drafts, the closing token, then the target's own draws
        token = np.where(position < n, drafts[min(position, K - 1)], next_token)
        beyond = position > n
        token[beyond] = _draw(rng, p[position][out[beyond]])
        out = out * VOCAB + token
    return out, n


# --- 1. Exactness: the round's output follows the target; the wrong variants do not --------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_round_output_follows_the_target_and_the_wrong_variants_do_not(variant):
    p, q = _tables(seed=0)
    codes, n = _run(VARIANTS[variant], p, q, ROUNDS, seed=1)
    p_value = chi_square_p_value(codes, _target_joint(p))
    if variant == "block":
        assert p_value > P_VALUE_PASS
        assert len(np.unique(n)) == K + 1  # every accepted length 0..K occurred
    else:
        assert p_value < P_VALUE_FAIL


def test_deterministic_proposals_keep_the_target_distribution():
    """q None (greedy drafting, prompt lookup): the rule reads q as one-hot on the drafts."""
    p, q = _tables(seed=2)
    codes, n = _run(block_verification_rule, p, q, ROUNDS, seed=3, deterministic=True)
    assert chi_square_p_value(codes, _target_joint(p)) > P_VALUE_PASS
    assert 0 < n.mean() < K


# --- 2. Acceptance: never below token verification, above it on some instance --------------


def _expected_accepted(p, q) -> tuple[float, float]:
    """Exact E[num_accepted] of (block, token) verification, by enumerating the drafts:
    E = sum_i E_q[P(n >= i | d_1..d_i)], which is w_i for block verification (its
    docstring, (a)) and prod_j min(1, P_j(d_j) / Q_j(d_j)) for token verification."""
    block = token = 0.0
    weight, kept, draft_prob = np.ones(1), np.ones(1), np.ones(1)
    for length in range(K):
        ratio = (p[length] / q[length]).reshape(-1)  # [V^(length+1)]: rows extended by the draft token
        weight = np.minimum(np.repeat(weight, VOCAB) * ratio, 1.0)
        kept = np.repeat(kept, VOCAB) * np.minimum(ratio, 1.0)
        draft_prob = (draft_prob[:, None] * q[length]).reshape(-1)
        block += float(draft_prob @ weight)
        token += float(draft_prob @ kept)
    return block, token


def test_block_accepts_at_least_as_many_as_token_verification():
    measured_gains = []
    for seed in range(4):
        p, q = _tables(seed=10 + seed)
        exact_block, exact_token = _expected_accepted(p, q)
        assert exact_block >= exact_token - 1e-12
        # The rules realise those expectations (the token one is the existing rule) within
        # 4 standard errors, and the measured gain exceeds both errors on some instance.
        _, n_block = _run(block_verification_rule, p, q, ROUNDS, seed=seed)
        _, n_token = _run(rejection_sampling_rule, p, q, ROUNDS, seed=seed)
        errors = [4 * n.std() / np.sqrt(ROUNDS) for n in (n_block, n_token)]
        assert abs(n_block.mean() - exact_block) < errors[0]
        assert abs(n_token.mean() - exact_token) < errors[1]
        measured_gains.append(n_block.mean() - n_token.mean() - sum(errors))
    assert max(measured_gains) > 0


def test_the_papers_two_token_example():
    """Sun et al.'s motivating example: p = (1/3, 2/3), q = (2/3, 1/3) at every position, K = 2:
    token verification accepts 10/9 tokens per round, block verification 11/9."""
    rounds, k = 100000, 2
    p = jnp.broadcast_to(jnp.asarray([1 / 3, 2 / 3], jnp.float32), (rounds, k + 1, 2))
    q = jnp.broadcast_to(jnp.asarray([2 / 3, 1 / 3], jnp.float32), (rounds, k, 2))
    drafts = jax.random.categorical(jax.random.key(0), jnp.log(q))  # [N, K]
    means = {}
    for name, rule in (("block", block_verification_rule), ("token", rejection_sampling_rule)):
        n, _ = jax.jit(rule)(jax.random.key(1), drafts, p, q)
        means[name] = float(jnp.mean(n))
    assert abs(means["token"] - 10 / 9) < 0.01
    assert abs(means["block"] - 11 / 9) < 0.01


# --- 3. K = 1: the same rule as token verification -------------------------------------------


def test_at_k1_block_verification_is_token_verification():
    rows, vocab = 20000, 6
    rng = np.random.default_rng(4)
    p = jnp.broadcast_to(jnp.asarray(rng.dirichlet(np.full(vocab, 0.5), size=2), jnp.float32), (rows, 2, vocab))
    q = jnp.broadcast_to(jnp.asarray(rng.dirichlet(np.full(vocab, 0.5), size=1), jnp.float32), (rows, 1, vocab))
    drafts = jax.random.categorical(jax.random.key(5), jnp.log(q))  # [N, 1]
    got = [np.asarray(x) for x in jax.jit(block_verification_rule)(jax.random.key(6), drafts, p, q)]
    want = [np.asarray(x) for x in jax.jit(rejection_sampling_rule)(jax.random.key(6), drafts, p, q)]
    # The same draws decide the same (a float tie at the threshold may split the two).
    assert np.mean(got[0] != want[0]) < 1e-3 and np.mean(got[1] != want[1]) < 1e-3
    alpha = float(jnp.minimum(p[0, 0], q[0, 0]).sum())  # 1 - TV(p, q)
    assert abs(got[0].mean() - alpha) < 0.02


# --- 4. Greedy: one-hot p decides as greedy_rule; end to end ---------------------------------


@pytest.mark.parametrize("with_q", [False, True])
def test_on_one_hot_p_it_decides_as_the_greedy_rule(with_q):
    batch, k, vocab = 512, 4, 8
    logits, _ = _untied_logits((batch, k + 1, vocab), seed=1)
    p = probabilities(logits, SamplingConfig(0.0))
    drafts = _drafts_near(np.asarray(jnp.argmax(logits, axis=-1))[:, :k], vocab, seed=2)  # [B, K]
    q = jax.nn.softmax(_untied_logits((batch, k, vocab), seed=3)[0]) if with_q else None
    n_greedy, next_greedy = greedy_rule(None, drafts, p, q)
    assert len(set(np.asarray(n_greedy).tolist())) == k + 1
    for seed in range(3):
        n, next_token = jax.jit(block_verification_rule)(jax.random.key(seed), drafts, p, q)
        np.testing.assert_array_equal(np.asarray(n), np.asarray(n_greedy))
        np.testing.assert_array_equal(np.asarray(next_token), np.asarray(next_greedy))


def test_by_name_under_greedy_sampling_it_gives_plain_greedy(target, noisy_draft):
    config, prompts = specjax.GenerationConfig(max_new_tokens=12), [[1, 2, 3], [7], [30, 31, 5, 9]]
    plain = specjax.generate(target, prompts, config).tokens
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=3, rule="block_verification")
    out = specjax.generate(target, prompts, config, draft=noisy_draft, speculative=speculative)
    assert out.tokens == plain
    assert 0.0 < out.stats.acceptance_rate < 1.0


@pytest.fixture(scope="module")
def pair8():
    return scaled_model(VOCAB8, seed=0, scale=6.0), scaled_model(VOCAB8.replace(num_hidden_layers=1), seed=5, scale=6.0)


@pytest.mark.parametrize("variant", ["block", "forward_prefix"])
def test_end_to_end_joint_of_first_two_tokens_at_t1(pair8, variant):
    """As test_sampling.py's test of the default rule (6000 two-token samples at T = 1), with
    the forward-prefix variant as the negative control (always_accept fails there already)."""
    target, draft = pair8
    samples = 6000
    expected = _exact_joint(target, SamplingConfig(temperature=1.0))
    rule = "block_verification" if variant == "block" else VARIANTS[variant]
    config = specjax.GenerationConfig.at_temperature(1.0, max_new_tokens=2, seed=1)
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=2, rule=rule)
    out = specjax.generate(target, [PROMPT] * samples, config, draft=draft, speculative=speculative)
    tokens = np.asarray(out.tokens)
    p_value = chi_square_p_value(tokens[:, 0] * VOCAB8.vocab_size + tokens[:, 1], expected)
    if variant == "block":
        assert p_value > P_VALUE_PASS
        assert 0.0 < out.stats.acceptance_rate < 1.0
    else:
        assert p_value < P_VALUE_FAIL


# --- 5. Names, and trees -------------------------------------------------------------------


def test_rules_are_named_in_configs():
    assert specjax.SpeculativeConfig(rule="block-verification").rule is block_verification_rule
    from_yaml = specjax.SpeculativeConfig.from_mapping({"num_speculative_tokens": 3, "rule": "block_verification"})
    assert from_yaml.rule is block_verification_rule
    assert set(RULES) == {"greedy", "rejection_sampling", "block_verification"}
    with pytest.raises(ValueError, match=r"unknown acceptance rule 'blockwise'.*block_verification"):
        specjax.SpeculativeConfig(rule="blockwise")


@pytest.mark.parametrize("rule", ["block_verification", block_verification_rule, rejection_sampling_rule])
def test_a_chain_rule_with_a_tree_is_a_clear_error(rule):
    with pytest.raises(ValueError, match="verifies chains of drafts, not token trees"):
        specjax.SpeculativeConfig(tree="full:2:2", rule=rule)
    with pytest.raises(ValueError, match="verifies chains of drafts, not token trees"):
        specjax.SpeculativeConfig(rule=rule, adaptive={"trees": ["full:2:2", "chain:3"]})
    chain = specjax.SpeculativeConfig(num_speculative_tokens=3, rule=rule)
    with pytest.raises(ValueError, match="verifies chains of drafts, not token trees"):
        chain.replace(tree="full:2:2")


def test_a_bench_methods_spec_keeps_its_round_settings(monkeypatch, target, noisy_draft):
    """E8's `drafters: [{name: .., draft: {.., rule: block_verification}}]` must verify with that
    rule (and a `verify_schedule` likewise): the bench builds each round's SpeculativeConfig
    itself, and once dropped the rule."""
    from specjax.bench import measure
    from specjax.bench.experiments.e08_methods import round_settings
    from specjax.bench.measure import RunSpec, Workload

    seen = []
    monkeypatch.setattr(measure, "prepare", lambda *args, speculative=None, **kw: seen.append(speculative))
    specs = {
        "blockwise": {"rule": "block_verification"},
        "scheduled": {"verify_schedule": {"widths": [1, 2, 4]}},
        "tokenwise": {},
    }
    settings = {k: round_settings(specjax.SpeculativeConfig.from_mapping(v)) for k, v in specs.items()}
    work = Workload(target, {}, [[1, 2, 3]], ["c"], max_new_tokens=4)
    work = work.with_drafters(dict.fromkeys(specs, noisy_draft), settings)
    for name in specs:
        work.prepare(RunSpec("speculative", 1, 3, 1.0, name), [[1, 2, 3]])
    assert [s.rule for s in seen] == [block_verification_rule, None, None]  # the name, resolved
    assert [s.verify_schedule is not None for s in seen] == [False, True, False]
    assert seen[1].verify_schedule.widths == (1, 2, 4)
    assert all(s.num_speculative_tokens == 3 for s in seen)
