"""Every drafter: greedy output equals plain greedy, batched equals per-row, and exact
sampling survives it (a two-sample test against plain sampling, with a negative control)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import RAGGED_PROMPTS, TARGET_CONFIG, scaled_model
from scipy import stats as scipy_stats

import specjax
from specjax.core.acceptance import always_accept_rule
from specjax.core.sampling import SamplingConfig
from specjax.drafters import DraftContext, DraftModel, Fallback, LayerSkip, PromptLookup

# Prompts with repeats, so prompt lookup has something to find, plus the ragged set.
PROMPTS = [*RAGGED_PROMPTS, [5, 6, 7, 5, 6, 7, 5], [9, 9, 9, 9]]
NEW = 24
GREEDY = specjax.GenerationConfig(max_new_tokens=NEW)


def _k(k: int, **fields) -> specjax.SpeculativeConfig:
    return specjax.SpeculativeConfig(num_speculative_tokens=k, **fields)


def _drafters(noisy_draft, small_draft):
    return {
        "draft_model": DraftModel(noisy_draft),
        "prompt_lookup": PromptLookup(),
        "prompt_lookup_earliest_2": PromptLookup(max_ngram=2, min_ngram=2, prefer="earliest"),
        "layer_skip": LayerSkip(layers=1),
        "lookup_then_model": Fallback(PromptLookup(), DraftModel(small_draft)),
        "lookup_then_layer_skip": Fallback(PromptLookup(max_ngram=2), LayerSkip(layers=1)),
    }


DRAFTER_NAMES = [
    "draft_model",
    "prompt_lookup",
    "prompt_lookup_earliest_2",
    "layer_skip",
    "lookup_then_model",
    "lookup_then_layer_skip",
]


@pytest.fixture(scope="module")
def drafters(noisy_draft, small_draft):
    return _drafters(noisy_draft, small_draft)


@pytest.fixture(scope="module")
def plain(target):
    return specjax.generate(target, PROMPTS, GREEDY)


# K sets shapes only. The base drafters run K = 1, 2, 5 and 8; the variants built from them (an
# n-gram setting, Fallbacks) K = 1, 2 and 5, whose K-dependent work is their parts'.
GREEDY_CASES = [
    (name, k)
    for name in DRAFTER_NAMES
    for k in ([1, 2, 5, 8] if name in ("draft_model", "prompt_lookup", "layer_skip") else [1, 2, 5])
]


@pytest.mark.parametrize("name, k", GREEDY_CASES)
def test_greedy_equals_plain_greedy(target, drafters, plain, name, k):
    out = specjax.generate(target, PROMPTS, GREEDY, draft=drafters[name], speculative=_k(k))
    assert out.tokens == plain.tokens
    s = out.stats
    assert s.drafted_tokens == k * s.rounds
    assert s.rounds <= s.generated_tokens <= (k + 1) * s.rounds
    assert s.drafter["kind"] == drafters[name].name
    if k == 2:  # the equality tests exercise both acceptances and rejections for every drafter
        assert 0.0 < s.acceptance_rate < 1.0


@pytest.mark.parametrize("name", DRAFTER_NAMES)
def test_eos_cuts_rows_at_different_rounds(target, drafters, plain, name):
    """An EOS that some rows emit early and others never: each row stops on its own. (K = 5:
    the EOS is no part of the compiled program, so this reuses the greedy test's K = 5 one.)"""
    counts = {}
    for row in plain.tokens:
        for t in set(row[2:12]):
            counts[t] = counts.get(t, 0) + 1
    eos = max(counts, key=lambda t: (0 < counts[t] < len(PROMPTS), counts[t]))
    config = GREEDY.replace(eos_token_id=eos)
    expected = specjax.generate(target, PROMPTS, config)
    lengths = {len(t) for t in expected.tokens}
    assert len(lengths) > 1 and min(lengths) < NEW, "the EOS must cut some rows and not others"
    out = specjax.generate(target, PROMPTS, config, draft=drafters[name], speculative=_k(5))
    assert out.tokens == expected.tokens


@pytest.mark.parametrize("name", ["prompt_lookup", "layer_skip", "lookup_then_model"])
def test_batched_equals_per_row(target, drafters, name):
    # GREEDY and K = 2: the batched run reuses the greedy test's program.
    batched = specjax.generate(target, PROMPTS, GREEDY, draft=drafters[name], speculative=_k(2))
    for prompt, tokens in zip(PROMPTS, batched.tokens, strict=True):
        alone = specjax.generate(target, [prompt], GREEDY, draft=drafters[name], speculative=_k(2))
        assert alone.tokens == [tokens]


def test_stepping_rounds_with_a_drafter(target, plain):
    lookup = PromptLookup()
    state = specjax.init_state(target, PROMPTS, GREEDY, draft=lookup, speculative=_k(3))
    while not bool(state.done.all()):
        state = specjax.step(target, state, draft=lookup)
    out = specjax.state_output(state)
    assert out.tokens == plain.tokens
    assert out.stats.drafter["no_match_rounds"] > 0


def test_stepping_with_another_drafter_is_an_error(target, small_draft):
    state = specjax.init_state(target, PROMPTS, draft=PromptLookup(), speculative=_k(3))
    with pytest.raises(ValueError, match="initialised with drafter"):
        specjax.step(target, state, draft=DraftModel(small_draft))


def test_no_match_rounds_are_counted(target):
    """Distinct prompt tokens and K=1: the first round of every row has nothing to match."""
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    out = specjax.generate(
        target, prompts, specjax.GenerationConfig(max_new_tokens=1), draft=PromptLookup(), speculative=_k(1)
    )
    assert out.stats.drafter == {"kind": "prompt_lookup", "no_match_rounds": 2}


def test_layer_skip_and_draft_model_errors(target, small_draft):
    with pytest.raises(
        ValueError, match=r"LayerSkip\(layers=2\) needs 0 < layers < the target's num_hidden_layers \(2\)"
    ):
        specjax.generate(target, PROMPTS, draft=LayerSkip(layers=2))
    other_vocab = specjax.init_model(TARGET_CONFIG.replace(vocab_size=40), 0)
    with pytest.raises(ValueError, match="share a vocabulary"):
        specjax.generate(target, PROMPTS, draft=other_vocab)
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        PromptLookup(max_ngram=1, min_ngram=2)
    with pytest.raises(TypeError, match="Model or a Drafter"):
        specjax.generate(target, PROMPTS, draft="stdlib-draft")


def test_model_drafter_behind_another_catches_up_k_plus_1_tokens(target):
    """After another drafter's K tokens and the bonus were accepted, a draft model that has
    seen none of them must catch up K + 1 tokens. With the target itself as the draft, a
    correct catch-up proposes exactly the target's greedy continuation. A wide catch-up
    does it in one forward; a lone draft model's width-2 catch-up does it because `resync`
    first re-feeds what its cache lacks (cache.lengths says how much). The negative control:
    a cache whose lengths claim K/V it never received is not repaired and reads stale slots."""
    k = 3
    prompt = [1, 2, 3, 4, 5]
    continuation = specjax.generate(target, [prompt], specjax.GenerationConfig(max_new_tokens=2 * k + 1)).tokens[0]
    state = specjax.init_state(
        target, [prompt], specjax.GenerationConfig(max_new_tokens=16), draft=target, speculative=_k(k)
    )
    committed = prompt + continuation[: k + 1]
    ctx = DraftContext(
        tokens=state.tokens.at[0, : len(committed)].set(jnp.asarray(committed)),
        lengths=jnp.asarray([len(committed)], jnp.int32),
        prompt_lengths=state.prompt_lengths,
        done=state.done,
        target_params=target.params,
        target=target.config,
        num_speculative_tokens=k,
        sampling=SamplingConfig(),
    )
    expected = continuation[k + 1 :]
    honest = state.draft_state  # its cache holds the prompt, and its lengths say so
    claiming = honest.replace(cache=honest.cache.replace(lengths=ctx.lengths - 1))
    lone = jax.jit(DraftModel(target).propose)  # one program for the honest and the claiming cache
    for propose, draft_state, catches_up in (
        (jax.jit(DraftModel(target).tolerating_lag(k + 1).propose), honest, True),
        (lone, honest, True),
        (lone, claiming, False),
    ):
        proposal, _ = propose(target.params, draft_state, ctx, jax.random.key(0))
        assert (np.asarray(proposal.tokens)[0].tolist() == expected) == catches_up


def test_layer_skip_reads_the_targets_params_without_copies(target):
    """Two targets with different weights but one config share the compiled program, and
    the draft follows each target's own weights (its layers are never baked in)."""
    other = scaled_model(TARGET_CONFIG, seed=7)
    for model in (target, other):  # (GREEDY and K = 2: the greedy test's programs)
        out = specjax.generate(model, PROMPTS, GREEDY, draft=LayerSkip(1), speculative=_k(2))
        assert out.tokens == specjax.generate(model, PROMPTS, GREEDY).tokens


def test_layer_skip_starts_from_the_targets_prefilled_cache(target):
    """`init` copies the target's first N layers of K/V instead of prefilling its own: they
    equal what its own N-layer prefill writes at every prompt slot (the slots it can read)."""
    from specjax.core.loop import prefill

    prompt = jnp.asarray([[1, 2, 3, 4, 5, 6], [7, 8, 9, 0, 0, 0]], jnp.int32)  # right-padded
    lengths = jnp.asarray([6, 3], jnp.int32)
    state = specjax.init_state(target, [[1, 2, 3, 4, 5, 6], [7, 8, 9]], GREEDY, draft=LayerSkip(1))
    ctx = DraftContext(
        tokens=state.tokens,
        lengths=lengths,
        prompt_lengths=lengths,
        done=state.done,
        target_params=target.params,
        target=target.config,
        num_speculative_tokens=2,
        sampling=SamplingConfig(),
    )
    cache_length = state.target_cache.k.shape[2]
    full = prefill(target.config, target.params, prompt, lengths, cache_length)
    copied = LayerSkip(1).init((), ctx.replace(target_cache=full), prompt, cache_length).cache
    own = LayerSkip(1).init((), ctx, prompt, cache_length).cache
    assert copied.k.shape == own.k.shape == (1, *full.k.shape[1:])
    np.testing.assert_array_equal(np.asarray(copied.lengths), np.asarray(own.lengths))
    for row, n in enumerate([6, 3]):
        for name in ("k", "v"):
            a, b = getattr(copied, name)[:, row, :n], getattr(own, name)[:, row, :n]
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


# --- Sampling: two-sample tests against plain sampling ------------------------------------

VOCAB8 = TARGET_CONFIG.replace(vocab_size=8)
SAMPLE_PROMPT = [1, 2, 3, 1, 2]  # lookup proposes [3, 1, 2, ...] on the first round
SAMPLES = 3000  # the wrong variants fail by p < 1e-40 at this size (1e-8 needed)
SAMPLINGS = {
    "t1": specjax.GenerationConfig(max_new_tokens=3, do_sample=True, temperature=1.0),
    "t0.7_topk5_topp0.9": specjax.GenerationConfig(
        max_new_tokens=3, do_sample=True, temperature=0.7, top_k=5, top_p=0.9
    ),
}


def two_sample_p_value(a: np.ndarray, b: np.ndarray) -> float:
    """Chi-square test of homogeneity of two samples of integer outcomes (cells pooled below 5)."""
    cells = max(a.max(), b.max()) + 1
    table = np.stack([np.bincount(a, minlength=cells), np.bincount(b, minlength=cells)]).astype(np.float64)
    table = table[:, table.sum(axis=0) > 0]
    expected_small = table.sum(axis=0) * min(len(a), len(b)) / (len(a) + len(b)) < 5
    if expected_small.any():
        table = np.concatenate([table[:, ~expected_small], table[:, expected_small].sum(axis=1, keepdims=True)], axis=1)
    if table.shape[1] < 2:
        return 1.0
    return float(scipy_stats.chi2_contingency(table).pvalue)


@pytest.fixture(scope="module")
def pair8():
    target = scaled_model(VOCAB8.replace(num_hidden_layers=3), seed=0, scale=6.0)
    draft = scaled_model(VOCAB8.replace(num_hidden_layers=1), seed=5, scale=6.0)
    return target, draft


@pytest.fixture(scope="module")
def plain_samples(pair8):
    target, _ = pair8
    samples = {}
    for name, config in SAMPLINGS.items():
        out = specjax.generate(target, [SAMPLE_PROMPT] * SAMPLES, config.replace(seed=11))
        samples[name] = np.asarray(out.tokens)
    return samples


def _joint(tokens: np.ndarray) -> np.ndarray:
    return (tokens[:, 0] * 8 + tokens[:, 1]) * 8 + tokens[:, 2]


@pytest.mark.parametrize("rule_name", ["exact", "always_accept"])
@pytest.mark.parametrize("sampling_name", sorted(SAMPLINGS))
@pytest.mark.parametrize("name", ["prompt_lookup", "layer_skip", "lookup_then_model"])
def test_sampling_matches_plain_sampling(pair8, plain_samples, name, sampling_name, rule_name):
    target, draft = pair8
    drafter = {
        "prompt_lookup": PromptLookup(),
        "layer_skip": LayerSkip(layers=1),
        "lookup_then_model": Fallback(PromptLookup(max_ngram=2), DraftModel(draft)),
    }[name]
    out = specjax.generate(
        target,
        [SAMPLE_PROMPT] * SAMPLES,
        SAMPLINGS[sampling_name].replace(seed=1),
        draft=drafter,
        speculative=_k(2, rule=None if rule_name == "exact" else always_accept_rule),
    )
    p_value = two_sample_p_value(_joint(np.asarray(out.tokens)), _joint(plain_samples[sampling_name]))
    if rule_name == "exact":
        assert p_value > 1e-3
        assert 0.0 < out.stats.acceptance_rate < 1.0
    else:
        assert p_value < 1e-8


def test_fallback_takes_a_model_as_a_drafter(target, small_draft, plain):
    """A Model is accepted wherever a drafter is: Fallback drafts with it as a DraftModel."""
    drafter = Fallback(PromptLookup(), small_draft)
    assert drafter == Fallback(PromptLookup(), DraftModel(small_draft))
    out = specjax.generate(target, PROMPTS, GREEDY, draft=drafter, speculative=_k(3))
    assert out.tokens == plain.tokens
    assert set(out.stats.drafter) == {"kind", "first.no_match_rounds"}
