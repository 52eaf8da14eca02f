"""Greedy speculative decoding must reproduce plain greedy decoding token for token."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import RAGGED_PROMPTS

import specjax

GREEDY = specjax.GenerationConfig(max_new_tokens=24)


def _k(k: int) -> specjax.SpeculativeConfig:
    return specjax.SpeculativeConfig(num_speculative_tokens=k)


@pytest.fixture(scope="module")
def plain(target):
    return specjax.generate(target, RAGGED_PROMPTS, GREEDY)


def test_plain_greedy_matches_argmax_of_full_forward(target, plain):
    """The baseline itself: each generated token is the argmax of a cache-free forward."""
    for prompt, generated in zip(RAGGED_PROMPTS, plain.tokens, strict=True):
        assert len(generated) == 24
        logits = specjax.io.model.logits(target, [prompt + generated])[0]
        expected = logits[len(prompt) - 1 : -1].argmax(axis=-1)
        np.testing.assert_array_equal(generated, expected)


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("draft_name", ["noisy_draft", "small_draft"])
def test_speculative_greedy_equals_plain_greedy(request, target, plain, draft_name, k):
    draft = request.getfixturevalue(draft_name)
    out = specjax.generate(target, RAGGED_PROMPTS, GREEDY, draft=draft, speculative=_k(k))
    assert out.tokens == plain.tokens
    stats = out.stats
    assert stats.drafted_tokens == k * stats.rounds
    assert 0 <= stats.accepted_tokens <= stats.drafted_tokens
    assert len(stats.accepted_per_position) == k
    # Every row-round yields 1..K+1 tokens, so rounds bound the output from both sides.
    assert stats.rounds <= stats.generated_tokens <= (k + 1) * stats.rounds


def test_noisy_draft_is_partially_accepted(target, noisy_draft):
    """The equality tests above must exercise rejections, not only full acceptance."""
    out = specjax.generate(target, RAGGED_PROMPTS, GREEDY, draft=noisy_draft, speculative=_k(3))
    assert 0.1 < out.stats.acceptance_rate < 0.9


@pytest.mark.parametrize("k", [1, 4])
def test_draft_equal_to_target_accepts_everything(target, plain, k):
    out = specjax.generate(target, RAGGED_PROMPTS, GREEDY, draft=target, speculative=_k(k))
    assert out.tokens == plain.tokens
    assert out.stats.acceptance_rate == 1.0
    assert out.stats.accepted_per_position == [1.0] * k
    assert out.stats.mean_acceptance_length == k + 1
    # 24 tokens at K+1 per round: ceil(24 / (K+1)) rounds per row, the last one cut short.
    assert out.stats.target_forwards == -(-24 // (k + 1))


def test_batched_equals_per_row(target, noisy_draft):
    config = GREEDY.replace(max_new_tokens=20)
    batched = specjax.generate(target, RAGGED_PROMPTS, config, draft=noisy_draft, speculative=_k(3))
    for prompt, tokens in zip(RAGGED_PROMPTS, batched.tokens, strict=True):
        alone = specjax.generate(target, [prompt], config, draft=noisy_draft, speculative=_k(3))
        assert alone.tokens == [tokens]
    assert batched.stats.rounds == sum(
        specjax.generate(target, [p], config, draft=noisy_draft, speculative=_k(3)).stats.rounds for p in RAGGED_PROMPTS
    )


@pytest.mark.parametrize("speculative", [False, True])
def test_rows_stop_at_eos_while_others_continue(target, noisy_draft, plain, speculative):
    # Pick as EOS a token that row 0 emits early and row 1 never emits.
    eos = plain.tokens[0][3]
    assert eos not in plain.tokens[0][:3]
    config = GREEDY.replace(eos_token_id=eos)
    if speculative:
        out = specjax.generate(target, RAGGED_PROMPTS, config, draft=noisy_draft, speculative=_k(3))
    else:
        out = specjax.generate(target, RAGGED_PROMPTS, config)
    for generated, reference in zip(out.tokens, plain.tokens, strict=True):
        cut = reference.index(eos) + 1 if eos in reference else len(reference)
        assert generated == reference[:cut]
    assert out.tokens[0][-1] == eos and len(out.tokens[0]) == 4


def test_max_new_tokens_is_exact_for_every_row(target, noisy_draft):
    for n in (1, 2, 7):
        out = specjax.generate(
            target, RAGGED_PROMPTS, GREEDY.replace(max_new_tokens=n), draft=noisy_draft, speculative=_k(4)
        )
        assert [len(t) for t in out.tokens] == [n] * len(RAGGED_PROMPTS)


def test_driving_rounds_one_by_one(target, noisy_draft, plain):
    """step is the loop body: stepping it by hand gives generate's result."""
    k = 3
    state = specjax.init_state(target, RAGGED_PROMPTS, GREEDY, draft=noisy_draft, speculative=_k(k))
    rounds = 0
    while not bool(state.done.all()):
        before = np.asarray(state.lengths)
        state = specjax.step(target, state, draft=noisy_draft)
        after = np.asarray(state.lengths)
        live = after > before
        assert np.all((after - before)[live] <= k + 1)
        # Cache bookkeeping: the target has K/V for all but at most the last committed
        # token, the draft for all but at most the last two.
        assert np.all(np.asarray(state.target_cache.lengths) >= after - 1)
        assert np.all(np.asarray(state.draft_state.cache.lengths) >= after - 2)
        rounds += 1
    out = specjax.state_output(state)
    assert out.tokens == plain.tokens
    assert out.stats.target_forwards == rounds
