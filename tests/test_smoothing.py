"""SmoothQuant for the int8 weight format (specjax/io/smoothing.py): the folded factors leave
the float function unchanged, and they make int8 closer to float32 on a trained model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TARGET_CONFIG
from test_weight_formats import FAMILY_CONFIGS

import specjax
from specjax.io.model import logits
from specjax.io.smoothing import activation_maxima, smooth

TOKENS = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8]]


def _outlier_model(config) -> specjax.Model:
    """Random weights whose residual stream has channels 4x and 40x the rest."""
    model = specjax.init_model(config, seed=3)
    channel = jnp.asarray(np.tile([1.0, 4.0, 40.0], config.hidden_size)[: config.hidden_size], jnp.float32)
    params = jax.tree.map(lambda x: x * 4 if x.ndim > 1 else x, model.params)
    params["embed"] = params["embed"] * channel
    rng = np.random.default_rng(0)
    for i in range(config.num_hidden_layers):  # init leaves biases 0: a fold that misses one would pass
        attn = params["layers"][i]["attn"]
        for name in [n for n in attn if n.endswith("_bias")]:
            attn[name] = jnp.asarray(rng.normal(size=attn[name].shape), jnp.float32)
    return specjax.Model(config, params)


@pytest.mark.parametrize("config", FAMILY_CONFIGS.values(), ids=FAMILY_CONFIGS.keys())
def test_smoothing_moves_scale_between_operations_without_changing_the_function(config):
    """Each fold (norm -> q/k/v, norm -> gate/up, v -> o, up -> down) must divide exactly what
    it multiplies: a wrong axis, a missed bias or Gemma's (1 + w) norm taken as w changes the
    logits. Channel scales of 1, 4 and 40 make the factors far from 1."""
    model = _outlier_model(config)
    smoothed = smooth(model, np.asarray(TOKENS, np.int32), alpha=0.5)
    changed = jax.tree.map(lambda a, b: not np.allclose(a, b), model.params, smoothed)
    assert changed["layers"][0]["input_norm"]["scale"] and changed["layers"][0]["mlp"]["down_proj"]
    assert not changed["embed"]  # the LM head (tied or not) is never smoothed: draft heads read it
    reference = logits(model, TOKENS)
    out = logits(specjax.Model(config, smoothed), TOKENS)
    np.testing.assert_allclose(out, reference, rtol=2e-4, atol=2e-4 * float(np.abs(reference).max()))


def test_calibration_sees_every_projection_of_every_layer():
    model = specjax.init_model(TARGET_CONFIG, seed=0)
    seen = activation_maxima(model, np.asarray(TOKENS, np.int32))
    layers, d = TARGET_CONFIG.num_hidden_layers, TARGET_CONFIG.hidden_size
    assert {n: len(v) for n, v in seen.items() if n != "embed" and n != "lm_head"} == dict.fromkeys(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), layers
    )
    assert seen["q_proj"][0].shape == (d,) and seen["down_proj"][0].shape == (TARGET_CONFIG.intermediate_size,)
    assert all(np.all(np.asarray(m) >= 0) for m in seen["up_proj"])


def test_smoothing_flattens_the_activations_int8_quantises():
    """What SmoothQuant is for: after smoothing, each projection input's largest channel is much
    closer to its typical channel (per-token int8 spends its codes on the largest). A factor
    applied the wrong way round makes it worse. Quality on a real model: results/weight_formats."""
    model = _outlier_model(TARGET_CONFIG)
    tokens = np.asarray(TOKENS, np.int32)
    before = activation_maxima(model, tokens)
    after = activation_maxima(specjax.Model(model.config, smooth(model, tokens, alpha=0.5)), tokens)
    for name in ("q_proj", "o_proj", "up_proj", "down_proj"):
        for layer, (b, a) in enumerate(zip(before[name], after[name], strict=True)):
            spread = {"before": np.max(b) / np.median(b), "after": np.max(a) / np.median(a)}
            assert spread["after"] < 0.7 * spread["before"], (name, layer, spread)


def test_alpha_outside_zero_one_is_an_error():
    with pytest.raises(ValueError, match=r"alpha must lie in \[0, 1\]"):
        smooth(specjax.init_model(TARGET_CONFIG, seed=0), np.asarray(TOKENS, np.int32), alpha=1.5)
