"""Adaptive speculation with a drafter that abstains (prompt lookup without a match): those
rounds are plain steps, the output stays the target's greedy output, and `abstain=False`
verifies the no-match proposals as before."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import pytest
from test_drafters import PROMPTS

import specjax
from specjax.drafters import DraftContext, Fallback, LayerSkip, PromptLookup

NEW = 24
# Drafting K = 2 costs next to nothing, so the policy drafts whenever it is allowed to.
CHEAP = specjax.AdaptiveConfig(ks=(0, 2), costs={0: 1.0, 2: 1.01})


def _generate(model, adaptive, prompts=PROMPTS):
    return specjax.generate(
        model,
        prompts,
        specjax.GenerationConfig(max_new_tokens=NEW),
        draft=PromptLookup(),
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=2, adaptive=adaptive),
    )


@pytest.fixture(scope="module")
def plain(target):
    return specjax.generate(target, PROMPTS, specjax.GenerationConfig(max_new_tokens=NEW))


def test_prompt_lookup_abstains_exactly_where_it_finds_no_match():
    tokens = jnp.array([[5, 6, 7, 5, 0, 0], [1, 2, 3, 4, 0, 0]])  # row 0's last token occurred before
    ctx = DraftContext(
        tokens=tokens,
        lengths=jnp.array([4, 4]),
        prompt_lengths=jnp.array([4, 4]),
        done=jnp.array([False, False]),
        target_params=None,
        target=None,
        num_speculative_tokens=2,
        sampling=None,
    )
    lookup = PromptLookup()
    assert lookup.abstains((), None, ctx).tolist() == [False, True]
    both = Fallback(lookup, lookup)
    assert both.abstains(((), ()), (None, None), ctx).tolist() == [False, True]
    assert Fallback(lookup, LayerSkip(layers=1)).abstains(((), ()), (None, None), ctx) is None


def test_no_match_rounds_become_plain_steps_and_greedy_stays_plain_greedy(target, plain):
    on = _generate(target, CHEAP)
    off = _generate(target, dataclasses.replace(CHEAP, abstain=False))
    assert on.tokens == plain.tokens and off.tokens == plain.tokens
    on_policy, off_policy = on.stats.adaptive, off.stats.adaptive
    assert on_policy["plain_steps"] >= on_policy["abstained_steps"] > 0
    assert off_policy["abstained_steps"] == 0
    # Abstaining rounds propose nothing: fewer drafted tokens and fewer verified no-match proposals.
    assert on.stats.drafted_tokens < off.stats.drafted_tokens
    assert on.stats.drafter["no_match_rounds"] < off.stats.drafter["no_match_rounds"]
    assert sum(on_policy["rounds_per_k"].values()) == on.stats.target_forwards
