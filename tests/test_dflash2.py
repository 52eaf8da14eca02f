"""DFlash 2: a block head plus a two-tap dynamic convolution and a selector over its top paths.

Exact like every drafter: greedy output equals plain greedy (two rows), and
at T = 1 the output follows the target's distribution, while a variant that proposes the
selected path but reports the block's own q (as if the tokens had been drawn from the
outputs independently) fails the very same test. With gamma and the selector's `next` at
zero the head is the block head, op for op: the same logits and the same proposal. The
head saves and loads as kind "dflash2", and its loss falls over a few steps.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import adam_steps, scaled_model
from specjax.models import full_forward
from specjax.models.block_net import init_block_head_params
from specjax.models.dflash2_net import init_dflash2_extras, top_paths
from specjax.models.heads import head_config
from test_dspark import LAYERS, PROMPTS, SAMPLES, VOCAB8, _ctx, _k
from test_sampling import check_two_tokens

import specjax
from specjax.core.sampling import SamplingConfig, probabilities
from specjax.drafters import BlockHead, DFlash2

K = 3


def _dflash2(target: specjax.Model, seed: int = 0, scale: float = 4.0, moved: float = 1.0, **fields) -> DFlash2:
    """A random two-layer DFlash 2 head, weights scaled up so that its guesses vary with the
    context; `moved` scales a random gamma and selector `next` (0: untrained, the block head)."""
    config = head_config(target.config, 2, 1, 48).replace(num_hidden_layers=2)
    params = init_block_head_params(config, len(LAYERS), seed, target.params)
    params = jax.tree.map(lambda x: x * scale if x.ndim > 1 else x, params)
    extras = init_dflash2_extras(config, rank=8, groups=2, seed=seed)
    keys = jax.random.split(jax.random.key(seed + 9), 2)
    extras["conv"]["gamma"] = moved * jax.random.normal(keys[0], (config.hidden_size,))
    extras["selector"]["next"] = moved * scale * jax.random.normal(keys[1], (config.hidden_size, 8))
    fields = {"mask_token_id": target.config.vocab_size - 1, "block_size": 4, "paths": 4, "branch": 2, **fields}
    return DFlash2(params={**params, **extras}, config=config, feature_layers=LAYERS, **fields)


def _fields(head) -> dict:
    return {f.name: getattr(head, f.name) for f in dataclasses.fields(head)}


def test_greedy_equals_plain(target):
    """A chain of selected paths; trees run BlockHead's own tree code on the convolved
    outputs (`block_logits`, checked below), which tests/test_block_head.py covers."""
    config = specjax.GenerationConfig(max_new_tokens=12)
    expected = specjax.generate(target, PROMPTS, config).tokens
    out = specjax.generate(target, PROMPTS, config, draft=_dflash2(target), speculative=_k(K))
    assert out.tokens == expected
    assert out.stats.drafter["kind"] == "dflash2" and out.stats.drafted_tokens == K * out.stats.rounds


@dataclasses.dataclass(frozen=True)
class BlockQ(DFlash2):
    """Deliberately wrong: proposes the selected path, but reports q as the convolved block
    outputs' (as if each token had been drawn from its own output, ignoring the selection)."""

    def propose(self, weights, state, ctx, key):
        proposal, state = super().propose(weights, state, ctx, key)
        logits, _ = self.block_logits(weights, state, ctx, ctx.num_speculative_tokens)
        return proposal.replace(q=probabilities(logits, ctx.sampling)), state


@pytest.mark.parametrize("variant", ["exact", "block_q"])
def test_sampling_follows_the_target_at_t1(variant):
    target = scaled_model(VOCAB8, seed=0, scale=6.0)
    head = _dflash2(target, seed=4, scale=6.0, moved=3.0)
    if variant != "exact":
        head = BlockQ(**_fields(head))
    check_two_tokens(target, head, _k(2), exact=variant == "exact", samples=SAMPLES)


def test_untrained_extras_are_the_block_head(target):
    """gamma = 0 and next = 0: the same logits as the block head, the same greedy proposal
    (path 0, the argmax), in one round; moved extras change both. A sampled proposal's q
    is a distribution per position that gives the drawn token mass."""
    zero, moved = _dflash2(target, moved=0.0), _dflash2(target)
    block = BlockHead(**{k: v for k, v in _fields(zero).items() if k not in ("paths", "branch")})
    block = dataclasses.replace(block, params={k: v for k, v in zero.params.items() if k not in ("conv", "selector")})
    tokens = jnp.zeros((2, 32), jnp.int32).at[:, :6].set(jnp.asarray([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]))

    @jax.jit
    def round_of(target_params, heads):
        _, features = full_forward(target.config, target_params, tokens[:, :6], LAYERS)
        out = []
        rounds = ((block, 0, None), (zero, 1, None), (moved, 2, None), (moved, 2, 1.0))
        for head, i, temperature in rounds:
            sampling = SamplingConfig() if temperature is None else SamplingConfig(temperature=temperature)
            ctx = _ctx(target, tokens, 6, features, sampling=sampling).replace(target_params=target_params)
            state = head.init(heads[i], ctx, tokens[:, :6], 32)
            logits, _ = head.block_logits(heads[i], state, ctx, K)
            proposal, _ = head.propose(heads[i], state, ctx, jax.random.key(0))
            out.append((logits, proposal.tokens, proposal.q))
        return out

    (bl, bt, _), (zl, zt, _), (ml, mt, _), (_, st, sq) = round_of(
        target.params, (block.params, zero.params, moved.params)
    )
    np.testing.assert_array_equal(np.asarray(zl), np.asarray(bl))
    np.testing.assert_array_equal(np.asarray(zt), np.asarray(bt))
    assert np.abs(np.asarray(ml) - np.asarray(bl)).max() > 1e-2
    assert np.any(np.asarray(mt) != np.asarray(bt))  # the selector picked another path somewhere
    sq = np.asarray(sq)
    np.testing.assert_allclose(sq.sum(-1), 1.0, rtol=1e-5)
    assert np.all(np.take_along_axis(sq, np.asarray(st)[..., None], -1) > 0)


def test_top_paths_are_the_best_sums():
    lp = jax.nn.log_softmax(jax.random.normal(jax.random.key(3), (2, 3, 6)), axis=-1)  # [B, K, V]
    paths, scores = jax.jit(top_paths, static_argnums=(1, 2))(lp, 5, 3)
    assert paths.shape == (2, 5, 3) and scores.shape == (2, 5)
    np.testing.assert_array_equal(np.asarray(paths[:, 0]), np.asarray(jnp.argmax(lp, -1)))
    lp_np = np.asarray(lp)  # every path over the top 3 per position, by its sum
    for b in range(2):
        top = np.argsort(-lp_np[b], axis=-1)[:, :3]
        sums = sorted(
            (lp_np[b, 0, x] + lp_np[b, 1, y] + lp_np[b, 2, z]) for x in top[0] for y in top[1] for z in top[2]
        )
        np.testing.assert_allclose(np.asarray(scores[b]), sums[::-1][:5], rtol=1e-5)


def test_saved_and_loaded_as_dflash2(target, tmp_path):
    head = _dflash2(target, paths=6, branch=3)
    specjax.save_drafter(head, tmp_path / "head", target_name="tiny", target=target)
    loaded = specjax.load_drafter(tmp_path / "head", target)
    assert isinstance(loaded, DFlash2) and loaded == head.without_weights()
    assert (loaded.paths, loaded.branch) == (6, 3)
    for x, y in zip(jax.tree.leaves(head.params), jax.tree.leaves(loaded.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert specjax.load_drafter({"method": "dflash2", "model": str(tmp_path / "head")}, target) == loaded
    with pytest.raises(ValueError, match=r"a DFlash 2 head .* is built around its target"):
        specjax.load_drafter(tmp_path / "head")
    with pytest.raises(ValueError, match="a DFlash 2 head saves in specjax's own format only"):
        specjax.save_drafter(head, tmp_path / "published", format="speculators")
    plain = {k: v for k, v in head.params.items() if k not in ("conv", "selector")}
    with pytest.raises(ValueError, match="a DFlash 2 head's params need conv and selector"):
        specjax.generate(target, [[1, 2]], draft=dataclasses.replace(head, params=plain), speculative=_k(2))
    with pytest.raises(ValueError, match=r"DFlash2\.paths must be >= 1"):
        dataclasses.replace(head, paths=0)


def test_loss_falls_over_a_few_steps(target):
    from specjax.training.data import DataConfig
    from specjax.training.dflash2_objective import DFlash2HeadConfig, DFlash2Loss, dflash2_head_start
    from specjax.training.train_heads import HeadTrainConfig

    cfg = DFlash2HeadConfig(block_size=3, anchors=4, mask_token_id=47, feature_layers=LAYERS, rank=4, conv_groups=2)
    initial, as_head, loss = dflash2_head_start(cfg, target, seed=0)
    assert isinstance(loss, DFlash2Loss) and isinstance(as_head(initial), DFlash2)
    assert (as_head(initial).paths, as_head(initial).branch) == (16, 4)
    with pytest.raises(ValueError, match=r"dflash2\.paths must be >= 1"):
        DFlash2HeadConfig(paths=0)
    with pytest.raises(ValueError, match="leave no room for a block of 4"):
        HeadTrainConfig(kind="dflash2", data=DataConfig(seq_len=5, batch_size=2))
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 47, (2, 12)), jnp.int32)
    params, values, parts = adam_steps(loss, target.params, initial, tokens)
    assert values[-1] < 0.9 * values[0], values
    assert parts[0].shape == (3,) and all(np.isfinite(float(p)) for p in parts[2:])
    assert float(jnp.abs(params["conv"]["gamma"]).max()) > 0  # the convolution trains
    assert float(jnp.abs(params["selector"]["next"]).max()) > 0  # and the selector
