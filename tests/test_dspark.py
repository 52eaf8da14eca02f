"""DSpark: a block head plus a low-rank Markov head and a confidence head.

Exact like every drafter: greedy output equals plain greedy (chain and tree, two rows), and
at T = 1 the output follows the target's distribution, while a variant that draws with the
Markov term but reports q without it fails the very same test. With the Markov head at
zero the network is the block head's, op for op, in decoding and in training's packed
forward. The confidence is a [B, K] probability, the head saves and loads as kind
"dspark", and its loss falls over a few steps.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TARGET_CONFIG, adam_steps, scaled_model
from specjax.models import BlockMask, full_forward, init_cache
from specjax.models.block_net import block_head_forward, block_head_states, block_logits_of, init_block_head_params
from specjax.models.dspark_net import dspark_outputs, init_dspark_extras, markov_state
from specjax.models.heads import head_config
from test_sampling import check_two_tokens

import specjax
from specjax.core.sampling import SamplingConfig, probabilities
from specjax.drafters import DraftContext, DSpark
from specjax.drafters.dspark import markov_chain
from specjax.trees import Tree

LAYERS = (0, 1)
K = 3
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10]]


def _dspark(target: specjax.Model, seed: int = 0, scale: float = 4.0, markov: float = 1.0) -> DSpark:
    """A random two-layer DSpark head, weights scaled up so that its guesses vary with the
    context; `markov` scales a random `up` (0: the untrained Markov head, the block head)."""
    config = head_config(target.config, 2, 1, 48).replace(num_hidden_layers=2)
    params = init_block_head_params(config, len(LAYERS), seed, target.params)
    params = jax.tree.map(lambda x: x * scale if x.ndim > 1 else x, params)
    extras = init_dspark_extras(config, rank=8, seed=seed)
    keys = jax.random.split(jax.random.key(seed + 7), 2)
    d = config.hidden_size
    extras["markov"]["up"] = markov * scale * jax.random.normal(keys[0], (8, d)) / np.sqrt(8)
    extras["confidence"]["w"] = jax.random.normal(keys[1], (d,))
    fields = {"mask_token_id": target.config.vocab_size - 1, "block_size": 4}
    return DSpark(params={**params, **extras}, config=config, feature_layers=LAYERS, **fields)


def _k(k: int, **fields) -> specjax.SpeculativeConfig:
    return specjax.SpeculativeConfig(num_speculative_tokens=k, **fields)


def _ctx(target, tokens, length: int, features, k: int = K, sampling=None) -> DraftContext:
    b = tokens.shape[0]
    lengths = jnp.full((b,), length, jnp.int32)
    return DraftContext(
        tokens=tokens,
        lengths=lengths,
        prompt_lengths=lengths,
        done=jnp.zeros((b,), bool),
        target_params=target.params,
        target=target.config,
        num_speculative_tokens=k,
        sampling=sampling or SamplingConfig(),
        features=features,
    )


# --- Greedy: equal to plain greedy -------------------------------------------------------------


def test_greedy_equals_plain_chain_and_tree(target):
    config = specjax.GenerationConfig(max_new_tokens=12)
    expected = specjax.generate(target, PROMPTS, config).tokens
    head = _dspark(target)
    out = specjax.generate(target, PROMPTS, config, draft=head, speculative=_k(K))
    assert out.tokens == expected
    assert out.stats.drafter["kind"] == "dspark" and out.stats.drafted_tokens == K * out.stats.rounds
    tree = Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    out = specjax.generate(target, PROMPTS, config, draft=head, speculative=_k(3, tree=tree))
    assert out.tokens == expected


# --- Sampling: exact at T = 1, and a wrong q is caught ------------------------------------------

VOCAB8 = TARGET_CONFIG.replace(vocab_size=8)
SAMPLES = 3000


@dataclasses.dataclass(frozen=True)
class QWithoutMarkov(DSpark):
    """Deliberately wrong: drafts are drawn with the Markov term, but q is reported as the
    plain block outputs' (the term left out of what each draft was drawn from)."""

    def propose(self, weights, state, ctx, key):
        hidden, state = self.block_states(weights, state, ctx, ctx.num_speculative_tokens)
        proposal = markov_chain(self.config, weights, ctx.target_params, hidden, self._anchor(ctx), key, ctx.sampling)
        plain = block_logits_of(self.config, weights, ctx.target_params, hidden)
        return proposal.replace(q=probabilities(plain, ctx.sampling)), state


@pytest.mark.parametrize("variant", ["exact", "q_without_markov"])
def test_sampling_follows_the_target_at_t1(variant):
    target = scaled_model(VOCAB8, seed=0, scale=6.0)
    head = _dspark(target, seed=4, scale=6.0, markov=3.0)
    if variant != "exact":
        head = QWithoutMarkov(**{f.name: getattr(head, f.name) for f in dataclasses.fields(head)})
    check_two_tokens(target, head, _k(2), exact=variant == "exact", samples=SAMPLES)


# --- The network: the block head's when the Markov head is zero --------------------------------


def test_markov_head_at_zero_is_the_block_head(target):
    """With up = 0 the outputs are the block head's, exactly, in decoding's one pass; a Markov
    head that is not zero changes them where it is used only."""
    zero, moved = _dspark(target, markov=0.0), _dspark(target)  # the same block head
    config = zero.config
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 47, (2, 16)), jnp.int32)
    previous = jnp.asarray([[3, 11, 30, 2]], jnp.int32)

    @jax.jit
    def run(target_params, zero_params, moved_params):
        _, states = full_forward(target.config, target_params, tokens, LAYERS)  # [2, 16, 2D]
        # One round at length 6: context positions 0..4, the block [token 5, MASK x 3] at 5..8.
        context = jnp.arange(5, dtype=jnp.int32)[None]
        block = jnp.concatenate([tokens[:1, 5:6], jnp.full((1, 3), 47, jnp.int32)], axis=1)
        positions = jnp.arange(5, 9, dtype=jnp.int32)[None]
        mask = BlockMask(start=jnp.asarray([5]), slots=positions, width=4, mode="bidirectional")
        args = (states[:1, :5], context, block, positions, init_cache(config, 1, 16), mask)
        logits, _ = block_head_forward(config, zero_params, target_params, *args)
        hidden, _ = block_head_states(config, zero_params, target_params, *args)  # [1, 4, D]
        z = markov_state(zero_params, target_params, hidden, previous, jnp.ones((4,), bool))
        at_zero, confidence = dspark_outputs(config, zero_params, target_params, z)
        z = markov_state(moved_params, target_params, hidden, previous, jnp.arange(4) >= 1)
        other, _ = dspark_outputs(config, moved_params, target_params, z)
        return logits, at_zero, confidence, other

    logits, at_zero, confidence, other = (np.asarray(x) for x in run(target.params, zero.params, moved.params))
    np.testing.assert_array_equal(at_zero, logits)
    np.testing.assert_array_equal(other[:, 0], logits[:, 0])
    assert np.abs(other[:, 1:] - logits[:, 1:]).max() > 1e-2
    assert confidence.shape == (1, 4) and np.all((confidence > 0) & (confidence < 1))


def test_confidence_is_a_probability_per_row_and_draft(target):
    head = _dspark(target)
    tokens = jnp.zeros((2, 32), jnp.int32).at[:, :6].set(jnp.asarray([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]))

    @jax.jit
    def propose(target_params, params):
        _, features = full_forward(target.config, target_params, tokens[:, :6], LAYERS)
        ctx = _ctx(target, tokens, 6, features, sampling=SamplingConfig(temperature=1.0))
        ctx = ctx.replace(target_params=target_params)
        state = head.init(params, ctx, tokens[:, :6], 32)
        return head.propose(params, state, ctx, jax.random.key(0))[0]

    proposal = propose(target.params, head.params)
    c = np.asarray(proposal.confidence)
    assert c.shape == (2, K) and c.dtype == np.float32
    assert np.all((c > 0) & (c < 1)) and np.ptp(c) > 1e-3  # it reads the state: not one constant
    assert proposal.tokens.shape == (2, K) and proposal.q.shape == (2, K, 48)


# --- Saving, loading, training ------------------------------------------------------------------


def test_saved_and_loaded_as_dspark(target, tmp_path):
    head = _dspark(target)
    specjax.save_drafter(head, tmp_path / "head", target_name="tiny", target=target)
    loaded = specjax.load_drafter(tmp_path / "head", target)
    assert isinstance(loaded, DSpark) and loaded == head.without_weights()
    for x, y in zip(jax.tree.leaves(head.params), jax.tree.leaves(loaded.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    by_method = specjax.load_drafter({"method": "dspark", "model": str(tmp_path / "head")}, target)
    assert by_method == loaded
    with pytest.raises(ValueError, match=r"a DSpark head .* is built around its target"):
        specjax.load_drafter(tmp_path / "head")
    with pytest.raises(ValueError, match="saves in specjax's own format only"):
        specjax.save_drafter(head, tmp_path / "published", format="speculators")
    plain = {k: v for k, v in head.params.items() if k not in ("markov", "confidence")}
    with pytest.raises(ValueError, match="a DSpark head's params need markov and confidence"):
        specjax.generate(target, [[1, 2]], draft=dataclasses.replace(head, params=plain), speculative=_k(2))


def test_loss_falls_over_a_few_steps(target):
    from specjax.training.data import DataConfig
    from specjax.training.dspark_objective import DSparkHeadConfig, DSparkLoss, dspark_head_start
    from specjax.training.train_heads import HeadTrainConfig

    cfg = DSparkHeadConfig(block_size=3, anchors=4, mask_token_id=47, feature_layers=LAYERS, rank=4)
    initial, as_head, loss = dspark_head_start(cfg, target, seed=0)
    assert isinstance(loss, DSparkLoss) and isinstance(as_head(initial), DSpark)
    with pytest.raises(ValueError, match=r"dspark\.rank must be >= 1"):
        DSparkHeadConfig(rank=0)
    with pytest.raises(ValueError, match="leave no room for a block of 4"):
        HeadTrainConfig(kind="dspark", data=DataConfig(seq_len=5, batch_size=2))
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 47, (2, 12)), jnp.int32)
    params, values, parts = adam_steps(loss, target.params, initial, tokens)
    assert values[-1] < 0.9 * values[0], values
    assert all(p.shape == (3,) for p in parts)
    assert float(jnp.abs(params["markov"]["up"]).max()) > 0  # the Markov head trains
    assert float(jnp.abs(params["confidence"]["w"]).max()) > 0  # and the confidence head
