"""ParallelDraft (PARD): K proposals from one draft forward over [context, MASK x (K - 1)].

Exact like every drafter: greedy output equals plain greedy (chains, trees, ragged rows
with EOS, adaptive K), and at T = 1 the output follows the target's distribution while a
variant that reports another position's q fails the very same test. The block mask is
checked against a dense reference, and the draft cache against mask K/V read as context.
An untrained draft proposes poorly after a mask, which exactness does not care about; with
the target itself as the draft, the first proposal of every round (the ordinary next-token
prediction) must be the target's own, which it is only if the cache holds exactly the
committed K/V.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import RAGGED_PROMPTS, TARGET_CONFIG, scaled_model
from specjax.models import BlockMask, forward, init_cache
from test_sampling import PROMPT, _exact_joint

import specjax
from specjax.bench.distribution import chi_square_p_value
from specjax.core.sampling import SamplingConfig
from specjax.drafters import DraftContext, ParallelDraft
from specjax.trees import Tree

MASK = TARGET_CONFIG.vocab_size - 1  # an ordinary id to an untrained draft
NEW = 16


def _k(k: int, **fields) -> specjax.SpeculativeConfig:
    return specjax.SpeculativeConfig(num_speculative_tokens=k, **fields)


# --- The block mask --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["causal", "bidirectional"])
def test_block_mask_matches_a_dense_reference(mode):
    """Rows of T tokens at slot = position ending in a block of W (one row's clamped at 0,
    as a short prompt's catch-up is): query p sees slot s iff s <= p, or in bidirectional
    mode both lie in the block. Built here with loops, compared over every cache slot."""
    s, t, width = 20, 7, 4
    starts = np.array([3, 10, 1])
    positions = np.maximum(starts[:, None] + width - t + np.arange(t), 0)  # [B, T]
    mask = BlockMask(start=jnp.asarray(starts), slots=jnp.asarray(positions), width=width, mode=mode)
    got = np.asarray(mask.mask(jnp.arange(s)))  # [B, T, S]
    expected = np.zeros((len(starts), t, s), bool)
    for b, start in enumerate(starts):
        for i, p in enumerate(positions[b]):
            for slot in range(s):
                both_in_block = start <= p < start + width and start <= slot < start + width
                expected[b, i, slot] = slot <= p or (mode == "bidirectional" and both_in_block)
    np.testing.assert_array_equal(got, expected)
    first = t - width  # the block's first query
    assert got[0, first, starts[0] + width - 1] == (mode == "bidirectional")  # it sees the block's end
    assert not got[0, first - 1, starts[0] :].any()  # context never sees into the block
    assert got[0, -1, : starts[0] + width].all()  # the block's last token sees everything before it
    with pytest.raises(ValueError, match="block mode"):
        dataclasses.replace(mask, mode="full").mask(jnp.arange(s))


def test_block_mask_through_forward(target):
    """In a forward (full attention and the blockwise path): causal == no mask; bidirectional
    lets the block's first token read a later block token, and context never; neither sets
    cache.lengths (the caller says what is committed)."""
    config, params = target.config, target.params
    positions = jnp.arange(6, dtype=jnp.int32)[None]
    start = jnp.asarray([3], jnp.int32)  # block: positions 3..5
    masks = {
        "plain": None,
        "causal": BlockMask(start, positions, 3),
        "bidirectional": BlockMask(start, positions, 3, mode="bidirectional"),
    }

    @jax.jit
    def run(tokens):  # one program for every mask and both attention paths
        out = {}
        for block_size in (256, 2):
            cache = init_cache(config, 1, 8, block_size=block_size)
            for name, mask in masks.items():
                logits, written = forward(config, params, tokens, positions, cache, mask)
                out[f"{name}/{block_size}"] = (logits, written.lengths)
        return out

    tokens = jnp.asarray([[5, 6, 7, 8, 9, 10]], jnp.int32)
    before, after = run(tokens), run(tokens.at[0, 5].set(11))  # after: the block's last token changed
    for block_size in (256, 2):
        plain, causal, both = (before[f"{name}/{block_size}"] for name in masks)
        np.testing.assert_allclose(causal[0], plain[0], atol=1e-5)
        assert int(causal[1][0]) == int(both[1][0]) == 0 and int(plain[1][0]) == 6
        np.testing.assert_allclose(both[0][:, :3], plain[0][:, :3], atol=1e-5)  # context: causal
        changed = after[f"bidirectional/{block_size}"][0]
        np.testing.assert_allclose(changed[:, :3], both[0][:, :3], atol=1e-5)
        assert not np.allclose(changed[:, 3], both[0][:, 3], atol=1e-3)  # position 3 reads position 5
        np.testing.assert_allclose(both[0], before["bidirectional/256"][0], atol=1e-5)  # both paths agree


# --- Greedy: equal to plain greedy -------------------------------------------------------------


@pytest.fixture(scope="module")
def with_eos(target):
    """A greedy config whose EOS cuts some ragged rows early and not others, and its plain output."""
    plain = specjax.generate(target, RAGGED_PROMPTS, specjax.GenerationConfig(max_new_tokens=NEW))
    counts = {}
    for row in plain.tokens:
        for token in set(row[2:10]):
            counts[token] = counts.get(token, 0) + 1
    eos = max(counts, key=lambda t: (0 < counts[t] < len(RAGGED_PROMPTS), counts[t]))
    config = specjax.GenerationConfig(max_new_tokens=NEW, eos_token_id=eos)
    expected = specjax.generate(target, RAGGED_PROMPTS, config)
    assert min(len(t) for t in expected.tokens) < NEW == max(len(t) for t in expected.tokens)
    return config, expected.tokens


def test_chain_greedy_equals_plain_on_ragged_rows_with_eos(target, with_eos):
    config, expected, k = *with_eos, 4
    out = specjax.generate(target, RAGGED_PROMPTS, config, draft=ParallelDraft(target, MASK), speculative=_k(k))
    assert out.tokens == expected
    s = out.stats
    assert s.drafter["kind"] == "parallel_draft" and s.drafted_tokens == k * s.rounds
    # Proposal 1 is the target's own next token whenever the cache holds the committed K/V;
    # after a mask a model never trained on them guesses, and rejections happen.
    assert s.accepted_per_position[0] == 1.0 and s.acceptance_rate < 1.0


def test_tree_greedy_equals_plain(target, with_eos):
    config, expected = with_eos
    tree = Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    out = specjax.generate(
        target,
        RAGGED_PROMPTS,
        config,
        draft=ParallelDraft(target, MASK),
        speculative=specjax.SpeculativeConfig(tree=tree),
    )
    assert out.tokens == expected
    assert out.stats.accepted_tokens > 0


def test_adaptive_k_with_plain_steps_between_rounds(target, with_eos):
    """K in {0, 1, 2}: plain steps leave the draft cache arbitrarily far behind; `resync`
    feeds the rest from cache.lengths, which must say where committed K/V end (not past
    the masks). K = 1 is a block of no mask at all."""
    config, expected = with_eos
    switching = specjax.AdaptiveConfig(
        ks=(0, 1, 2), costs={0: 1.0, 1: 2.0, 2: 100.0}, probe_budget=1.0, switch_cost=0.0, start_at_max=True
    )
    out = specjax.generate(
        target, RAGGED_PROMPTS, config, draft=ParallelDraft(target, MASK), speculative=_k(2, adaptive=switching)
    )
    assert out.tokens == expected
    assert out.stats.adaptive["plain_steps"] > 0 and set(out.stats.adaptive["chosen_k"]) == {0, 1, 2}
    assert out.stats.accepted_per_position[0] == 1.0


def test_mask_kv_is_never_read_as_committed_context(target):
    """After a round the masks' K/V sit at slots L..L+K-2. A cache whose lengths said they
    were committed (what a plain forward would set) skips rewriting them when far behind:
    the block's first output then differs from a fresh prefill's of the committed tokens.
    With the right lengths it equals it."""
    k, prompt = 3, [1, 2, 3, 4, 5]
    committed = [*prompt, 9, 8, 7, 6, 5, 4]  # a lag of k + 3 > k + 1: past what the catch-up covers
    drafter = ParallelDraft(target, MASK)
    tokens = jnp.zeros((1, 32), jnp.int32).at[0, : len(committed)].set(jnp.asarray(committed))
    ctx = DraftContext(
        tokens=tokens,
        lengths=jnp.asarray([len(prompt)], jnp.int32),
        prompt_lengths=jnp.asarray([len(prompt)], jnp.int32),
        done=jnp.zeros((1,), bool),
        target_params=target.params,
        target=target.config,
        num_speculative_tokens=k,
        sampling=SamplingConfig(),
    )
    later = ctx.replace(lengths=jnp.asarray([len(committed)], jnp.int32))
    init = jax.jit(drafter.init, static_argnums=3)
    block_logits = jax.jit(drafter.block_logits, static_argnums=3)
    _, after_round = block_logits(target.params, init(target.params, ctx, tokens[:, :16], 32), ctx, k)
    assert int(after_round.cache.lengths[0]) == len(prompt)  # not len(prompt) + k - 1
    fresh = init(target.params, later.replace(prompt_lengths=later.lengths), tokens[:, :16], 32)
    reference = np.asarray(block_logits(target.params, fresh, later, k)[0])
    honest = np.asarray(block_logits(target.params, after_round, later, k)[0])
    np.testing.assert_allclose(honest, reference, atol=1e-4)
    claiming = after_round.replace(cache=after_round.cache.replace(lengths=jnp.asarray([len(prompt) + k - 1])))
    stale = np.asarray(block_logits(target.params, claiming, later, k)[0])
    assert not np.allclose(stale[0, 0], reference[0, 0], atol=1e-2)


# --- Sampling: the target's distribution, and a negative control ------------------------------

VOCAB8 = TARGET_CONFIG.replace(vocab_size=8)
SAMPLES = 3000  # the wrong variant scores p ~ 1e-60 at this size


@dataclasses.dataclass(frozen=True)
class ReversedQ(ParallelDraft):
    """Deliberately wrong: proposal i is drawn from block output i, but reported as drawn
    from output K - 1 - i (another position's distribution)."""

    def propose(self, weights, state, ctx, key):
        proposal, state = super().propose(weights, state, ctx, key)
        return proposal.replace(q=proposal.q[:, ::-1]), state


@pytest.fixture(scope="module")
def pair8():
    target = scaled_model(VOCAB8, seed=0, scale=6.0)
    draft = scaled_model(VOCAB8.replace(num_hidden_layers=1), seed=5, scale=6.0)
    return target, draft


@pytest.mark.parametrize("variant", ["exact", "reversed_q"])
def test_sampling_follows_the_target_at_t1(pair8, variant):
    target, draft = pair8
    config = specjax.GenerationConfig.at_temperature(1.0, max_new_tokens=2, seed=1)
    expected = _exact_joint(target, config.sampling)  # p(t1, t2 | PROMPT), [64]
    drafter = (ParallelDraft if variant == "exact" else ReversedQ)(draft, VOCAB8.vocab_size - 1)
    out = specjax.generate(target, [PROMPT] * SAMPLES, config, draft=drafter, speculative=_k(2))
    tokens = np.asarray(out.tokens)
    p_value = chi_square_p_value(tokens[:, 0] * 8 + tokens[:, 1], expected)
    if variant == "exact":
        assert p_value > 1e-3
        assert 0.0 < out.stats.acceptance_rate < 1.0
    else:
        assert p_value < 1e-8


# --- Construction ------------------------------------------------------------------------------


def test_errors_name_the_problem(target):
    for bad in (TARGET_CONFIG.vocab_size, -1, None, True, 3.0):
        with pytest.raises(
            ValueError, match=r"mask_token_id must be a token id of the draft's vocabulary \(0 <= id < 48\)"
        ):
            ParallelDraft(target, bad)
    other_vocab = specjax.init_model(TARGET_CONFIG.replace(vocab_size=40), 0)
    with pytest.raises(ValueError, match="share a vocabulary: draft vocab_size 40 != target vocab_size 48"):
        specjax.generate(target, [[1, 2]], draft=ParallelDraft(other_vocab, 3))
    with pytest.raises(ValueError, match="needs a draft Model"):
        ParallelDraft(mask_token_id=3)


def test_registered_by_name(target):
    spec = {"method": "parallel_draft", "model": "tiny", "mask_token_id": MASK}
    drafter = specjax.load_drafter(spec, load=lambda name: target)
    assert drafter == ParallelDraft(target, MASK) and drafter.weights() is target.params
    # No mask_token_id: the model's recorded one (config.json's specjax_mask_token_id), else an error.
    recorded = dataclasses.replace(target, mask_token_id=MASK - 1)
    unmasked = {"method": "parallel_draft", "model": "tiny"}
    assert specjax.load_drafter(unmasked, load=lambda name: recorded).mask_token_id == MASK - 1
    assert specjax.load_drafter(spec, load=lambda name: recorded).mask_token_id == MASK  # a given one wins
    with pytest.raises(ValueError, match=r"method 'parallel_draft' needs mask_token_id: 'tiny' records none"):
        specjax.load_drafter(unmasked, load=lambda name: target)
    with pytest.raises(ValueError, match=r"method 'parallel_draft' needs model \(it takes catch_up, mask_token_id"):
        specjax.load_drafter({"method": "parallel_draft", "mask_token_id": MASK}, load=lambda name: target)


def test_a_pard_draft_by_name_is_a_pard_draft_and_asked_for_as_a_draft_model_is_one():
    """The trap of earlier releases: `--drafter stdlib-pard-draft` ran the PARD draft as an
    autoregressive draft. Its config.json records its mask token, so the name alone is a PARD
    draft; `method: draft_model` still runs it autoregressively, as asked."""
    target_config = specjax.load_model("stdlib-target").config
    assert isinstance(specjax.load_drafter("stdlib-pard-draft", target_config), ParallelDraft)
    asked = specjax.load_drafter({"method": "draft_model", "model": "stdlib-pard-draft"}, target_config)
    assert type(asked).__name__ == "DraftModel"
    assert isinstance(specjax.load_drafter("stdlib-draft", target_config), type(asked))  # no mask recorded


def test_the_shipped_pard_draft_decodes_exactly_and_is_accepted():
    """stdlib-pard-draft (models/pretrained/, trained by configs/pard_draft.yaml) on the target
    it was trained for, by name alone (its mask id is recorded): greedy equals plain, and it is
    accepted well beyond chance (held-out 2.73 at K = 4 in its model card)."""
    target = specjax.load_model("stdlib-target")
    drafter = ParallelDraft(specjax.load_model("stdlib-pard-draft"))  # no mask id given
    assert drafter.mask_token_id == 258
    prompts = ["def parse_args(self):\n", "import os\n"]
    settings = specjax.GenerationConfig(max_new_tokens=32)
    plain = specjax.generate(target, prompts, settings)
    spec = specjax.generate(
        target, prompts, settings, draft=drafter, speculative=specjax.SpeculativeConfig(num_speculative_tokens=4)
    )
    assert spec.tokens == plain.tokens
    assert spec.stats.mean_acceptance_length > 1.8
