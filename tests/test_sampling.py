"""Speculative sampling must emit exactly the target's distribution.

Each distribution test has a negative control: an "always accept" rule (which emits the
draft's distribution) must fail the very same test, proving the test can fail.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import RAGGED_PROMPTS, TARGET_CONFIG, scaled_model

import specjax
from specjax.bench.distribution import chi_square_p_value
from specjax.core.acceptance import always_accept_rule, greedy_rule, rejection_sampling_rule
from specjax.core.sampling import SamplingConfig, probabilities, sample
from specjax.trees import Tree, tree_greedy_rule, tree_rejection_rule

SAMPLES = 6000
P_VALUE_PASS = 1e-3  # a correct sampler fails this one run in a thousand
P_VALUE_FAIL = 1e-8


# --- The acceptance rule alone, on fixed hand-made distributions ---------------------------


def _fixed_distributions(batch, k, vocab, seed):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(vocab) * 0.5, size=k + 1)  # [K+1, V]
    q = rng.dirichlet(np.ones(vocab) * 0.5, size=k)  # [K, V]
    return (
        jnp.broadcast_to(jnp.asarray(p, jnp.float32), (batch, k + 1, vocab)),
        jnp.broadcast_to(jnp.asarray(q, jnp.float32), (batch, k, vocab)),
    )


@pytest.mark.parametrize("rule_name", ["exact", "always_accept"])
def test_rule_first_token_follows_target(rule_name):
    batch, k, vocab = 20000, 3, 6
    p, q = _fixed_distributions(batch, k, vocab, seed=0)
    draft_key, rule_key = jax.random.split(jax.random.key(0))
    # The draft samples each d_i from q_i (independent of earlier d's: fixed distributions).
    drafts = sample(draft_key, q)  # [B, K]
    rule = rejection_sampling_rule if rule_name == "exact" else always_accept_rule
    n, next_token = jax.jit(rule)(rule_key, drafts, p, q)
    first = np.where(np.asarray(n) > 0, np.asarray(drafts[:, 0]), np.asarray(next_token))
    p_value = chi_square_p_value(first, np.asarray(p[0, 0]))
    if rule_name == "exact":
        assert p_value > P_VALUE_PASS
        # Acceptance of position 1 is sum_x min(p, q) = 1 - TV(p, q).
        expected_alpha = float(jnp.minimum(p[0, 0], q[0, 0]).sum())
        assert abs(float(np.mean(np.asarray(n) > 0)) - expected_alpha) < 0.02
    else:
        assert p_value < P_VALUE_FAIL


def test_greedy_rule_exact_cases():
    """vLLM-style exact cases: draft [1, 2, 3] against target argmaxes."""
    vocab = 6

    def one_hot_logits(ids):
        return jax.nn.one_hot(jnp.asarray(ids), vocab)[None]  # [1, K+1, V]

    drafts = jnp.asarray([[1, 2, 3]])
    n, nxt = greedy_rule(None, drafts, one_hot_logits([1, 2, 3, 4]), None)
    assert (int(n[0]), int(nxt[0])) == (3, 4)  # all accepted + bonus
    n, nxt = greedy_rule(None, drafts, one_hot_logits([1, 5, 3, 4]), None)
    assert (int(n[0]), int(nxt[0])) == (1, 5)  # rejected at 2, corrected; the later match is waste
    n, nxt = greedy_rule(None, drafts, one_hot_logits([0, 2, 3, 4]), None)
    assert (int(n[0]), int(nxt[0])) == (0, 0)


# --- Greedy is the temperature -> 0 limit: p is a distribution under every config ----------


def _untied_logits(shape, seed):
    """Random logits [..., V] whose top two differ in every row, and the smallest such gap."""
    logits = np.random.default_rng(seed).normal(scale=3.0, size=shape).astype(np.float32)
    top2 = -np.sort(-logits, axis=-1)[..., :2]
    gap = float(np.min(top2[..., 0] - top2[..., 1]))
    assert gap > 0
    return jnp.asarray(logits), gap


@pytest.mark.parametrize("filters", [{}, dict(top_k=3, top_p=0.5, min_p=0.2)])
def test_greedy_probabilities_are_the_one_hot_limit(filters):
    """probabilities() at temperature 0 is the limit of temperature -> 0: the one-hot on the
    argmax (filters keep the top token, so they change nothing), the first one on ties."""
    logits, gap = _untied_logits((4, 3, 64), seed=0)
    greedy = np.asarray(probabilities(logits, SamplingConfig(0.0, **filters)))  # [4, 3, 64]
    np.testing.assert_array_equal(greedy, np.asarray(jax.nn.one_hot(jnp.argmax(logits, axis=-1), 64)))
    # A temperature far below the smallest top-two gap leaves < e^-40 off the argmax.
    cold = np.asarray(probabilities(logits, SamplingConfig(gap / 40, **filters)))
    np.testing.assert_allclose(greedy, cold, atol=1e-6)
    ties = jnp.asarray([[0.0, 2.0, 2.0, 1.0]], jnp.bfloat16)  # select() takes the first of a tie
    np.testing.assert_array_equal(np.asarray(probabilities(ties, SamplingConfig(0.0))), [[0, 1, 0, 0]])


def _drafts_near(choice, vocab, seed):
    """Draft tokens equal to `choice` [B, M] with probability 0.7, else uniform: every
    acceptance length occurs."""
    rng = np.random.default_rng(seed)
    lucky = rng.random(choice.shape) < 0.7
    return jnp.asarray(np.where(lucky, choice, rng.integers(0, vocab, choice.shape)), jnp.int32)


@pytest.mark.parametrize("with_q", [False, True])
def test_on_one_hot_p_the_exact_rule_decides_as_the_greedy_rule(with_q):
    """On greedy p (one-hot), rejection sampling accepts the same tokens and closes with the
    same token as the greedy rule, whatever its random draws and the draft's q."""
    batch, k, vocab = 512, 4, 8
    logits, _ = _untied_logits((batch, k + 1, vocab), seed=1)
    p = probabilities(logits, SamplingConfig(0.0))
    drafts = _drafts_near(np.asarray(jnp.argmax(logits, axis=-1))[:, :k], vocab, seed=2)  # [B, K]
    q = jax.nn.softmax(_untied_logits((batch, k, vocab), seed=3)[0]) if with_q else None
    n_greedy, next_greedy = greedy_rule(None, drafts, p, q)
    assert len(set(np.asarray(n_greedy).tolist())) == k + 1  # every count 0..K occurs
    for seed in range(3):
        n, next_token = jax.jit(rejection_sampling_rule)(jax.random.key(seed), drafts, p, q)
        np.testing.assert_array_equal(np.asarray(n), np.asarray(n_greedy))
        np.testing.assert_array_equal(np.asarray(next_token), np.asarray(next_greedy))


@pytest.mark.parametrize("with_q", [False, True])
def test_on_one_hot_p_the_tree_rules_agree(with_q):
    """The tree counterpart: recursive rejection on one-hot p picks the greedy rule's path."""
    tree, batch, vocab = Tree.full(3, 3), 256, 8
    logits, _ = _untied_logits((batch, tree.num_nodes + 1, vocab), seed=4)
    p = probabilities(logits, SamplingConfig(0.0))
    parents_choice = np.asarray(jnp.argmax(logits, axis=-1))[:, np.asarray(tree.parents)[1:]]  # [B, N]
    nodes = _drafts_near(parents_choice, vocab, seed=5)
    q = jax.nn.softmax(_untied_logits(p.shape, seed=6)[0]) if with_q else None
    path, n_greedy, next_greedy = tree_greedy_rule(None, tree, nodes, p, q)
    assert len(set(np.asarray(n_greedy).tolist())) == tree.depth + 1
    for seed in range(3):
        got = jax.jit(tree_rejection_rule, static_argnums=1)(jax.random.key(seed), tree, nodes, p, q)
        for a, b in zip(got, (path, n_greedy, next_greedy), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_exact_rules_under_greedy_sampling_give_plain_greedy(target, noisy_draft):
    """Rounds verify against probabilities() under every config, so an exact rule asked for
    by name under greedy sampling decides on one-hot p and reproduces plain greedy output."""
    config = specjax.GenerationConfig(max_new_tokens=12)
    plain = specjax.generate(target, RAGGED_PROMPTS, config).tokens
    for speculative in (
        specjax.SpeculativeConfig(num_speculative_tokens=3, rule=rejection_sampling_rule),
        specjax.SpeculativeConfig(tree="full:2:2", rule=tree_rejection_rule),
    ):
        out = specjax.generate(target, RAGGED_PROMPTS, config, draft=noisy_draft, speculative=speculative)
        assert out.tokens == plain
        assert 0.0 < out.stats.acceptance_rate < 1.0


# --- The whole engine, on tiny models with a 8-token vocabulary ------------------------------

VOCAB8 = TARGET_CONFIG.replace(vocab_size=8)
PROMPT = [1, 2, 3]


def _exact_joint(target, sampling: SamplingConfig) -> np.ndarray:
    """p(t1, t2 | prompt) under the processed target distribution -> [V * V]."""
    vocab = target.config.vocab_size
    first = probabilities(jnp.asarray(specjax.io.model.logits(target, [PROMPT])[0, -1]), sampling)
    seconds = specjax.io.model.logits(target, [[*PROMPT, t] for t in range(vocab)])[:, -1]  # [V, V]
    second = probabilities(jnp.asarray(seconds), sampling)
    return np.asarray(first[:, None] * second).reshape(-1)


def check_two_tokens(target, draft, speculative, exact: bool, samples: int = 3000) -> None:
    """The first two tokens of `samples` T = 1 rows of PROMPT, drafted by `draft`, against the
    exact joint of the processed target: a correct drafter passes (P_VALUE_PASS, and it both
    accepts and rejects), a deliberately wrong one is caught (P_VALUE_FAIL)."""
    config = specjax.GenerationConfig.at_temperature(1.0, max_new_tokens=2, seed=1)
    expected = _exact_joint(target, config.sampling)  # p(t1, t2 | PROMPT), [V * V]
    out = specjax.generate(target, [PROMPT] * samples, config, draft=draft, speculative=speculative)
    tokens = np.asarray(out.tokens)
    p_value = chi_square_p_value(tokens[:, 0] * target.config.vocab_size + tokens[:, 1], expected)
    if exact:
        assert p_value > P_VALUE_PASS
        assert 0.0 < out.stats.acceptance_rate < 1.0
    else:
        assert p_value < P_VALUE_FAIL


@pytest.fixture(scope="module")
def pair8():
    target = scaled_model(VOCAB8, seed=0, scale=6.0)
    draft = scaled_model(VOCAB8.replace(num_hidden_layers=1), seed=5, scale=6.0)
    return target, draft


SAMPLINGS = {
    "t1": dict(temperature=1.0),
    "t0.7_topk5_topp0.9_minp0.1": dict(temperature=0.7, top_k=5, top_p=0.9, min_p=0.1),
}


@pytest.mark.parametrize("rule_name", ["exact", "always_accept"])
@pytest.mark.parametrize("sampling_name", sorted(SAMPLINGS))
def test_speculative_sampling_joint_of_first_two_tokens(pair8, sampling_name, rule_name):
    target, draft = pair8
    kwargs = SAMPLINGS[sampling_name]
    expected = _exact_joint(target, SamplingConfig(**kwargs))
    draft_joint = _exact_joint(draft, SamplingConfig(**kwargs))
    assert 0.5 * np.abs(expected - draft_joint).sum() > 0.2, "draft too close to target for a negative control"

    rule = None if rule_name == "exact" else always_accept_rule
    config = specjax.GenerationConfig.at_temperature(max_new_tokens=2, seed=1, **kwargs)
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=2, rule=rule)
    out = specjax.generate(target, [PROMPT] * SAMPLES, config, draft=draft, speculative=speculative)
    tokens = np.asarray(out.tokens)
    p_value = chi_square_p_value(tokens[:, 0] * 8 + tokens[:, 1], expected)
    if rule_name == "exact":
        assert p_value > P_VALUE_PASS
        assert 0.0 < out.stats.acceptance_rate < 1.0
    else:
        assert p_value < P_VALUE_FAIL


def test_plain_sampling_joint_of_first_two_tokens(pair8):
    target, _ = pair8
    expected = _exact_joint(target, SamplingConfig(temperature=1.0))
    out = specjax.generate(
        target, [PROMPT] * SAMPLES, specjax.GenerationConfig.at_temperature(1.0, max_new_tokens=2, seed=2)
    )
    tokens = np.asarray(out.tokens)
    assert chi_square_p_value(tokens[:, 0] * 8 + tokens[:, 1], expected) > P_VALUE_PASS


def test_acceptance_differs_between_greedy_and_sampling(pair8):
    target, draft = pair8
    prompts = [PROMPT] * 64
    greedy = specjax.generate(
        target,
        prompts,
        specjax.GenerationConfig(max_new_tokens=16),
        draft=draft,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=3),
    )
    sampled = specjax.generate(
        target,
        prompts,
        specjax.GenerationConfig.at_temperature(1.0, max_new_tokens=16),
        draft=draft,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=3),
    )
    assert greedy.stats.acceptance_rate != sampled.stats.acceptance_rate


# --- Seeds, and the processed distributions ------------------------------------------------


def test_same_seed_same_output_and_seeds_differ(target, noisy_draft):
    prompts = [[1, 2, 3], [4, 5]] * 4

    def run(seed):
        return specjax.generate(
            target,
            prompts,
            specjax.GenerationConfig.at_temperature(1.0, max_new_tokens=16, seed=seed),
            draft=noisy_draft,
            speculative=specjax.SpeculativeConfig(num_speculative_tokens=3),
        ).tokens

    first = run(7)
    assert run(7) == first
    assert run(8) != first
    assert first[0] != first[2], "rows must draw independent randomness"


def test_top_k_and_top_p_truncate_the_distribution():
    logits = jnp.log(jnp.asarray([0.5, 0.2, 0.15, 0.1, 0.05]))
    top2 = np.asarray(probabilities(logits, SamplingConfig(1.0, top_k=2)))
    np.testing.assert_allclose(top2, [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0], rtol=1e-5)
    # top_p 0.8: 0.5 + 0.2 = 0.7 < 0.8, so 0.15 is needed to reach the mass; 0.1 is not.
    nucleus = np.asarray(probabilities(logits, SamplingConfig(1.0, top_p=0.8)))
    np.testing.assert_allclose(nucleus, np.array([0.5, 0.2, 0.15, 0, 0]) / 0.85, rtol=1e-5)
    cold = np.asarray(probabilities(logits, SamplingConfig(0.5)))
    np.testing.assert_allclose(cold, np.array([0.5, 0.2, 0.15, 0.1, 0.05]) ** 2 / 0.325, rtol=1e-5)
    # min_p 0.25: the floor is 0.25 x 0.5 = 0.125, so 0.15 stays and 0.1 goes.
    floor = np.asarray(probabilities(logits, SamplingConfig(1.0, min_p=0.25)))
    np.testing.assert_allclose(floor, np.array([0.5, 0.2, 0.15, 0, 0]) / 0.85, rtol=1e-5)


def test_top_p_keeps_the_sorted_prefix_with_or_without_sorting_the_vocabulary():
    """Over a vocabulary wider than TOP_P_CANDIDATES, top-p reads the prefix from a top_k when
    the head holds top_p of the mass in every row, else it sorts everything: both give the
    nucleus of the full sort, ties included (the cut tokens share the threshold's value)."""
    from specjax.core.sampling import TOP_P_CANDIDATES

    v = 4 * TOP_P_CANDIDATES
    rng = np.random.default_rng(0)
    peaked = rng.normal(size=(3, v)) * 4.0  # the head holds most of the mass
    flat = rng.normal(size=(3, v)) * 0.1  # it does not: the whole vocabulary is sorted
    tied = np.repeat(rng.normal(size=(3, v // 8)) * 3.0, 8, axis=1)  # runs of equal logits
    for logits in (peaked, flat, tied, np.concatenate([peaked[:2], flat[:1]])):
        probs = np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1), np.float64)
        for top_p in (0.3, 0.9):
            order = np.argsort(-probs, axis=-1, kind="stable")
            sorted_probs = np.take_along_axis(probs, order, axis=-1)
            before = np.cumsum(sorted_probs, axis=-1) - sorted_probs
            threshold = np.min(np.where(before < top_p, sorted_probs, np.inf), axis=-1, keepdims=True)
            expected = probs >= threshold - 1e-9
            got = np.asarray(probabilities(jnp.asarray(logits, jnp.float32), SamplingConfig(1.0, top_p=top_p))) > 0
            assert (got == expected).all(), (top_p, int(got.sum()), int(expected.sum()))
            assert 0 < got.sum() < got.size


@pytest.mark.parametrize(
    "settings",
    [dict(temperature=0.7, top_k=20, top_p=0.8, min_p=0.05), dict(temperature=1.3, min_p=0.2), dict(top_p=0.5)],
)
def test_filters_match_transformers_logits_processors(settings):
    """The filter chain equals Hugging Face's sampling processors in HF's order (temperature,
    top-k, top-p, min-p) on random logits: same kept tokens, same renormalised probabilities."""
    import torch
    from transformers import GenerationConfig as HFGenerationConfig
    from transformers.generation.utils import GenerationMixin

    logits = np.random.default_rng(0).normal(scale=3.0, size=(4, 64)).astype(np.float32)
    hf = HFGenerationConfig(do_sample=True, **{"temperature": 1.0, "top_k": 0, **settings})
    processors = GenerationMixin._get_logits_processor(
        GenerationMixin(), hf, input_ids_seq_length=1, encoder_input_ids=None, prefix_allowed_tokens_fn=None,
        logits_processor=[],
    )  # fmt: skip
    scores = processors(torch.zeros((4, 1), dtype=torch.long), torch.from_numpy(logits))
    expected = torch.softmax(scores, dim=-1).numpy()
    ours = specjax.GenerationConfig.at_temperature(**{"temperature": 1.0, **settings}).sampling
    np.testing.assert_allclose(np.asarray(probabilities(jnp.asarray(logits), ours)), expected, atol=1e-6)
