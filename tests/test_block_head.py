"""BlockHead (DFlash-style): K proposals from one non-causal head forward over target states.

Exact like every drafter: greedy output equals plain greedy (chains, trees, ragged rows with
EOS, adaptive K with plain steps between rounds), and at T = 1 the output follows the
target's distribution while a variant reporting another position's q fails the very same
test. Its context is right, not merely harmless: the blocks training packs into one forward
equal the drafter's rounds at those anchors, and a head that keeps its context cache
incrementally proposes exactly what one rewriting all of it every round proposes, while a
variant that claims context it never wrote does not.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import RAGGED_PROMPTS, TARGET_CONFIG, scaled_model
from specjax.models import full_forward
from specjax.models.block_net import init_block_head_params
from specjax.models.heads import head_config
from test_parallel_draft import with_eos  # noqa: F401 (a fixture)
from test_sampling import check_two_tokens

import specjax
from specjax.core.sampling import SamplingConfig
from specjax.drafters import BlockHead, DraftContext
from specjax.training.block_objective import packed_blocks
from specjax.trees import Tree

LAYERS = (0, 1)
K = 3


def _head(target: specjax.Model, seed: int = 0, scale: float = 4.0, **fields) -> BlockHead:
    """A random two-layer head, weights scaled up so that its guesses vary with the context."""
    config = head_config(target.config, 2, 1, 48).replace(num_hidden_layers=2)
    params = init_block_head_params(config, len(LAYERS), seed, target.params)
    params = jax.tree.map(lambda x: x * scale if x.ndim > 1 else x, params)
    fields = {"mask_token_id": target.config.vocab_size - 1, "block_size": 4, **fields}
    return BlockHead(params=params, config=config, feature_layers=LAYERS, **fields)


def _k(k: int, **fields) -> specjax.SpeculativeConfig:
    return specjax.SpeculativeConfig(num_speculative_tokens=k, **fields)


# --- Greedy: equal to plain greedy -------------------------------------------------------------


def test_chain_greedy_equals_plain_on_ragged_rows_with_eos(target, with_eos):  # noqa: F811
    config, expected = with_eos
    out = specjax.generate(target, RAGGED_PROMPTS, config, draft=_head(target), speculative=_k(K))
    assert out.tokens == expected
    s = out.stats
    assert s.drafter["kind"] == "block_head" and s.drafted_tokens == K * s.rounds


def test_tree_greedy_equals_plain(target, with_eos):  # noqa: F811
    config, expected = with_eos
    tree = Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    speculative = specjax.SpeculativeConfig(tree=tree)
    out = specjax.generate(target, RAGGED_PROMPTS, config, draft=_head(target), speculative=speculative)
    assert out.tokens == expected


def test_adaptive_k_with_plain_steps_between_rounds(target, with_eos):  # noqa: F811
    config, expected = with_eos
    switching = specjax.AdaptiveConfig(
        ks=(0, 1, 2), costs={0: 1.0, 1: 2.0, 2: 100.0}, probe_budget=1.0, switch_cost=0.0, start_at_max=True
    )
    out = specjax.generate(target, RAGGED_PROMPTS, config, draft=_head(target), speculative=_k(2, adaptive=switching))
    assert out.tokens == expected
    assert out.stats.adaptive["plain_steps"] > 0 and set(out.stats.adaptive["chosen_k"]) == {0, 1, 2}


# --- The context: what training packs is what decoding sees ------------------------------------


def test_packed_training_blocks_equal_the_drafters_rounds(target):
    """Training's packed forward (G blocks of a row at once, each seeing the context below its
    anchor) gives, for every anchor a, the logits the drafter gives in a round at length
    a + 1 after a prefill of tokens 0..a."""
    head = _head(target)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, TARGET_CONFIG.vocab_size - 1, (2, 24)), jnp.int32)
    anchors = jnp.asarray([[0, 5, 13, 20], [2, 9, 11, 17]], jnp.int32)
    _, states = full_forward(target.config, target.params, tokens, LAYERS)  # [B, T, 2D]
    packed = packed_blocks(head.config, head.params, target.params, states, tokens, anchors, K, head.mask_token_id)
    init = jax.jit(head.init, static_argnums=3)
    block_logits = jax.jit(head.block_logits, static_argnums=3)
    for b in range(2):
        for g, a in enumerate(np.asarray(anchors[b]).tolist()):
            length = jnp.asarray([a + 1], jnp.int32)
            ctx = DraftContext(
                tokens=jnp.zeros((1, 32), jnp.int32).at[0, :24].set(tokens[b]),
                lengths=length,
                prompt_lengths=length,
                done=jnp.zeros((1,), bool),
                target_params=target.params,
                target=target.config,
                num_speculative_tokens=K,
                sampling=SamplingConfig(),
                features=states[b : b + 1],  # the prefill's: only positions <= a are read
            )
            state = init(head.params, ctx, tokens[b : b + 1], 32)
            logits, _ = block_logits(head.params, state, ctx, K)
            np.testing.assert_allclose(np.asarray(packed[b, g]), np.asarray(logits[0]), atol=2e-4, rtol=1e-4)


@dataclasses.dataclass(frozen=True)
class ClaimsItsContext(BlockHead):
    """Deliberately wrong: after a round it claims the new target states' K/V are written
    (they are not: the next round's catch-up would write them, and now skips the oldest)."""

    def update(self, weights, state, ctx, num_accepted):
        state = super().update(weights, state, ctx, num_accepted)
        return state.replace(cache=state.cache.replace(lengths=jnp.maximum(ctx.lengths - 1, 0)))


@pytest.mark.parametrize("variant", ["incremental", "claims_its_context"])
def test_the_context_cache_is_exactly_the_committed_one(target, variant):
    """Rounds accepting 2, then 6 plain steps (adaptive K = 0: a lag past the catch-up), then
    rounds accepting 0 and 3, each followed by `update` with the target states the engine
    hands it: the next block's logits equal those after a fresh prefill of everything
    committed. A variant that claims the states' K/V it never wrote differs."""
    head = _head(target)
    if variant != "incremental":
        head = ClaimsItsContext(**{f.name: getattr(head, f.name) for f in dataclasses.fields(head)})
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(0, TARGET_CONFIG.vocab_size - 1, (1, 40)), jnp.int32)
    _, states = full_forward(target.config, target.params, tokens, LAYERS)  # [1, 40, 2D]: by position

    def ctx(length, features):
        lengths = jnp.asarray([length], jnp.int32)
        return DraftContext(
            tokens=tokens,
            lengths=lengths,
            prompt_lengths=lengths,
            done=jnp.zeros((1,), bool),
            target_params=target.params,
            target=target.config,
            num_speculative_tokens=K,
            sampling=SamplingConfig(),
            features=features,
        )

    init = jax.jit(head.init, static_argnums=3)
    block_logits = jax.jit(head.block_logits, static_argnums=3)
    update = jax.jit(head.update)
    length, state = 5, init(head.params, ctx(5, states[:, :8]), tokens[:, :8], 40)
    for accepted in (2, *[None] * 6, 0, 3):  # None: a plain step
        if accepted is None:  # the target ran position L - 1 alone
            state = update(head.params, state, ctx(length + 1, states[:, length - 1 : length]), jnp.zeros(1, jnp.int32))
            length += 1
            continue
        _, state = block_logits(head.params, state, ctx(length, None), K)
        # The verify pass's states at positions L-1..L+K-1, valid up to the accepted ones.
        verified = states[:, length - 1 : length + K]
        state = update(head.params, state, ctx(length + accepted + 1, verified), jnp.asarray([accepted], jnp.int32))
        length += accepted + 1
    got = np.asarray(block_logits(head.params, state, ctx(length, None), K)[0])
    fresh = init(head.params, ctx(length, states[:, :24]), tokens[:, :24], 40)
    reference = np.asarray(block_logits(head.params, fresh, ctx(length, None), K)[0])
    if variant == "incremental":
        np.testing.assert_allclose(got, reference, atol=2e-4, rtol=1e-4)
    else:
        assert np.abs(got - reference).max() > 1e-2


# --- Sampling: the target's distribution, and a negative control ------------------------------

VOCAB8 = TARGET_CONFIG.replace(vocab_size=8)
SAMPLES = 3000


@dataclasses.dataclass(frozen=True)
class UniformQ(BlockHead):
    """Deliberately wrong: proposals are drawn from the head's outputs but reported as drawn
    uniformly. (Reporting another position's q, PARD's negative control, is too mild a lie
    here: a random head's outputs at neighbouring masks are nearly alike, p ~ 0.05.)"""

    def propose(self, weights, state, ctx, key):
        proposal, state = super().propose(weights, state, ctx, key)
        return proposal.replace(q=jnp.full_like(proposal.q, 1.0 / proposal.q.shape[-1])), state


@pytest.mark.parametrize("variant", ["exact", "uniform_q"])
def test_sampling_follows_the_target_at_t1(variant):
    target = scaled_model(VOCAB8, seed=0, scale=6.0)
    head = _head(target, seed=4, scale=6.0)
    if variant != "exact":
        head = UniformQ(**{f.name: getattr(head, f.name) for f in dataclasses.fields(head)})
    check_two_tokens(target, head, _k(2), exact=variant == "exact", samples=SAMPLES)


# --- Construction, saving, loading -------------------------------------------------------------


def test_errors_name_the_problem(target):
    head = _head(target)
    with pytest.raises(ValueError, match="trained for blocks of 4 drafts; num_speculative_tokens 5 asks for more"):
        specjax.generate(target, [[1, 2]], draft=head, speculative=_k(5))
    with pytest.raises(
        ValueError, match=r"mask_token_id must be a token id of the target's vocabulary \(0 <= id < 48\)"
    ):
        dataclasses.replace(head, mask_token_id=48)
    with pytest.raises(ValueError, match="feature layers \\[2\\] do not exist"):
        specjax.generate(target, [[1, 2]], draft=dataclasses.replace(head, feature_layers=(0, 2)), speculative=_k(2))
    with pytest.raises(ValueError, match="needs its layers' config"):
        BlockHead()


def test_saved_and_loaded_by_path(target, tmp_path):
    head = _head(target)
    specjax.save_drafter(head, tmp_path / "head", target_name="tiny", target=target)
    loaded = specjax.load_drafter(tmp_path / "head", target)
    assert loaded == head.without_weights()
    for x, y in zip(jax.tree.leaves(head.params), jax.tree.leaves(loaded.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    other = scaled_model(TARGET_CONFIG, seed=9)
    with pytest.raises(ValueError, match="other weights"):
        specjax.load_drafter(tmp_path / "head", other)
    with pytest.raises(ValueError, match=r"a block head .* is built around its target"):
        specjax.load_drafter(tmp_path / "head")
