"""Multi-layer target features (EAGLE-3's low/mid/high concatenation) and the EAGLE head that
reads them: the features against transformers and a cache-free forward, clear errors for bad
layer indices, greedy equality (chain and tree), save/load, and the unrolled training loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from conftest import RAGGED_PROMPTS, TARGET_CONFIG, scaled_model
from flax import nnx
from specjax.models import forward, full_forward, graphdef
from specjax.models.heads import head_config, head_passes, init_eagle_params
from test_families import HF_CONFIGS as FAMILY_CONFIGS
from test_hf_interop import HF_CONFIGS as INTEROP_CONFIGS
from test_hf_interop import make_hf, save_hf

import specjax
from specjax.core.loop import CacheConfig, prefill
from specjax.drafters import Eagle
from specjax.training.train_heads import eagle_loss
from specjax.trees import Tree

THREE = TARGET_CONFIG.replace(num_hidden_layers=3)
LAYERS = (0, 2)


@pytest.mark.parametrize("name", ["llama3", "qwen3", "gemma3", "mixtral", "gpt2"])
def test_layer_features_are_the_block_outputs_transformers_computes(name, tmp_path):
    """features=(0, 1) of a 2-layer model: block 0's output is transformers' hidden_states[1];
    block 1's, through the final norm, is its last (normed) hidden state."""
    config = {**FAMILY_CONFIGS, "gpt2": INTEROP_CONFIGS["gpt2"]}[name]()
    hf = make_hf(config)
    model = specjax.load_model(save_hf(hf, tmp_path))
    ids = [[5, 9, 2, 17, 3, 40, 11, 60, 7]]
    with torch.no_grad():
        hidden = [h.numpy() for h in hf(torch.tensor(ids), output_hidden_states=True).hidden_states]
    d = model.config.hidden_size
    _, features = full_forward(model.config, model.params, jnp.asarray(ids), features=(0, 1))  # [1, T, 2D]
    assert features.shape == (1, len(ids[0]), 2 * d)
    block0, block1 = np.asarray(features[..., :d]), features[..., d:]
    np.testing.assert_allclose(block0, hidden[1], rtol=1e-4, atol=1e-4 * np.abs(hidden[1]).max())
    normed = np.asarray(nnx.merge(graphdef(model.config), model.params).final_norm(block1))
    np.testing.assert_allclose(normed, hidden[-1], rtol=1e-4, atol=1e-4 * np.abs(hidden[-1]).max())


def test_layer_features_through_chunked_prefill_and_cached_steps():
    """The engine's paths (a chunked prefill, then cached forwards of 3 tokens) return the same
    multi-layer features, in the order asked, as one cache-free forward at those positions."""
    model = scaled_model(THREE, seed=0)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, THREE.vocab_size, (2, 13)), jnp.int32)
    whole = jax.jit(full_forward, static_argnums=0, static_argnames="features")
    plain, reference = whole(THREE, model.params, tokens, features=(2, 0))  # [B, 13, 2D]
    d = THREE.hidden_size
    order = np.concatenate([np.arange(2 * d, 3 * d), np.arange(0, d)])  # (2, 0) from (0, 1, 2)
    _, every = whole(THREE, model.params, tokens, features=(0, 1, 2))
    np.testing.assert_array_equal(np.asarray(reference), np.asarray(every)[..., order])
    prompt_lengths = jnp.asarray([10, 7], jnp.int32)
    chunked = jax.jit(prefill, static_argnums=(0, 4, 5), static_argnames="features")
    cache, features = chunked(
        THREE, model.params, tokens[:, :10], prompt_lengths, 16, CacheConfig(prefill_chunk=4), features=(2, 0)
    )
    np.testing.assert_allclose(features[0], reference[0, :10], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(features[1, :7], reference[1, :7], rtol=1e-5, atol=1e-5)
    positions = prompt_lengths[:, None] + jnp.arange(3)  # [B, 3]
    step = jnp.take_along_axis(tokens, positions, axis=1)
    run = jax.jit(forward, static_argnums=0, static_argnames="features")
    logits, _, features = run(THREE, model.params, step, positions, cache, features=(2, 0))
    rows = np.arange(2)[:, None]
    np.testing.assert_allclose(features, np.asarray(reference)[rows, np.asarray(positions)], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits, np.asarray(plain)[rows, np.asarray(positions)], rtol=1e-5, atol=1e-5)
    assert len(run(THREE, model.params, step, positions, cache)) == 2  # no features asked: none returned


def test_bad_feature_layers_are_clear_errors():
    model = scaled_model(THREE, seed=0)
    tokens = jnp.asarray([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"layers \[5, -1\] do not exist: the model has 3 layers, indices 0..2"):
        full_forward(THREE, model.params, tokens, features=(0, 5, -1))
    with pytest.raises(ValueError, match=r"feature layers \[1, 1\] repeat an index"):
        full_forward(THREE, model.params, tokens, features=(1, 1))
    with pytest.raises(ValueError, match="selects no layer"):
        full_forward(THREE, model.params, tokens, features=())
    head = eagle(model, LAYERS)
    two = scaled_model(TARGET_CONFIG, seed=0)  # same width and vocabulary, 2 layers: no block 2
    with pytest.raises(ValueError, match=r"feature layers \[2\] do not exist: the model has 2 layers"):
        specjax.generate(two, [[1, 2]], specjax.GenerationConfig(max_new_tokens=4), draft=head)
    without_reduce = {k: v for k, v in head.params.items() if k != "reduce"}
    with pytest.raises(ValueError, match="lack a reduce matrix"):
        specjax.generate(
            model,
            [[1]],
            specjax.GenerationConfig(),
            draft=Eagle(without_reduce, head.config, feature_layers=LAYERS),
        )
    with pytest.raises(ValueError, match=r"reduce matrix reads 64 features, but feature_layers=\(0, 1, 2\) gives 96"):
        specjax.generate(
            model,
            [[1]],
            specjax.GenerationConfig(),
            draft=Eagle(head.params, head.config, feature_layers=(0, 1, 2)),
        )


def eagle(target: specjax.Model, layers, seed: int = 0, scale: float = 8.0) -> Eagle:
    """A random multi-layer head, its layer scaled up so that its guesses vary."""
    layer = head_config(target.config, 2, 1, 32)
    params = init_eagle_params(layer, target.params, seed, target.config, layers)
    params = {**params, "fc": params["fc"] * scale, "layers": jax.tree.map(lambda x: x * scale, params["layers"])}
    return Eagle(params=params, config=layer, feature_layers=layers)


@pytest.fixture(scope="module")
def target():
    return scaled_model(THREE, seed=0)


def test_multi_layer_head_holds_the_targets_layer_features_by_position(target):
    """After the prefill and after every round the head holds, for every verified position,
    the concatenated block outputs a cache-free full forward computes there."""
    head = eagle(target, LAYERS)
    assert head.needs_features == LAYERS  # what the engine passes to forward(features=...)
    state = specjax.init_state(
        target,
        RAGGED_PROMPTS,
        specjax.GenerationConfig(max_new_tokens=20),
        draft=head,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=3),
    )
    run = jax.jit(full_forward, static_argnums=(0, 3))
    for _ in range(4):
        lengths, live = np.asarray(state.lengths), ~np.asarray(state.done)
        _, features = run(target.config, target.params, state.tokens, LAYERS)  # [B, S, 2D]
        for b in np.flatnonzero(live):
            held = np.asarray(state.draft_state.features[b, : lengths[b] - 1])
            np.testing.assert_allclose(held, np.asarray(features[b, : lengths[b] - 1]), atol=2e-4, rtol=2e-4)
        state = specjax.step(target, state, draft=head)


@pytest.mark.parametrize("tree", [None, Tree.full(2, 3)], ids=["chain", "tree"])
def test_greedy_with_a_multi_layer_head_equals_plain_greedy(target, tree):
    head = eagle(target, LAYERS)
    plain = specjax.generate(target, RAGGED_PROMPTS, specjax.GenerationConfig(max_new_tokens=24))
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=3, tree=tree)
    config = specjax.GenerationConfig(max_new_tokens=24)
    out = specjax.generate(target, RAGGED_PROMPTS, config, draft=head, speculative=speculative)
    assert out.tokens == plain.tokens
    assert out.stats.accepted_tokens > 0


def test_save_load_round_trip_keeps_the_layers_and_old_heads_still_load(target, tmp_path):
    head = eagle(target, LAYERS)
    specjax.save_drafter(head, tmp_path / "head", target_name="three", target=target.config)
    loaded = specjax.load_drafter(tmp_path / "head", target)
    assert loaded.feature_layers == LAYERS and loaded.without_weights() == head.without_weights()
    assert loaded.params["reduce"].shape == (2 * THREE.hidden_size, THREE.hidden_size)
    for a, b in zip(jax.tree.leaves(head.params), jax.tree.leaves(loaded.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    config, k3 = specjax.GenerationConfig(max_new_tokens=12), specjax.SpeculativeConfig(num_speculative_tokens=3)
    a = specjax.generate(target, RAGGED_PROMPTS, config, draft=head, speculative=k3)
    b = specjax.generate(target, RAGGED_PROMPTS, config, draft=loaded, speculative=k3)
    assert a.tokens == b.tokens and a.stats == b.stats
    with pytest.raises(
        ValueError,
        match=r"trained for three with feature layers \[0, 2\] \(of 3 layers\); the given "
        r"target has 2 layers \(feature layers \[2\] do not exist\)",
    ):
        specjax.load_drafter(tmp_path / "head", TARGET_CONFIG)
    old = specjax.load_drafter("stdlib-eagle", specjax.load_model("stdlib-target"))  # saved before the field
    assert old.feature_layers == () and old.needs_features is True and "reduce" not in old.params


def test_unrolled_loss_trains_both_passes(target):
    """At init the reduce of the normalised block outputs is exactly the final-norm feature
    (the head starts as a one-layer EAGLE head); a few Adam steps on one batch lower the
    multi-layer loss (both unrolled passes), and the gradient reaches the reduce matrix."""
    head = eagle(target, LAYERS, scale=1.0)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, THREE.vocab_size, (4, 24)), jnp.int32)
    _, final = full_forward(THREE, target.params, tokens, features=True)  # [B, T, D]
    _, blocks = full_forward(THREE, target.params, tokens, features=LAYERS)  # [B, T, 2D]
    one_layer = {k: v for k, v in head.params.items() if k != "reduce"}
    logits, predicted = head_passes(head.config, one_layer, target.params, tokens, final)
    both_logits, both_predicted = head_passes(head.config, head.params, target.params, tokens, final, blocks)
    np.testing.assert_allclose(both_logits[0], logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(both_predicted[0], predicted, rtol=1e-4, atol=1e-4)

    def loss(params):
        return eagle_loss(head.config, THREE, target.params, params, tokens, (1.0, 0.1), layers=LAYERS)

    optimizer = optax.adam(3e-3)

    @jax.jit
    def step(params, opt_state):
        (_, parts), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, parts, jnp.abs(grads["reduce"]).max()

    params, state = head.params, optimizer.init(head.params)
    params, state, before, reduce_grad = step(params, state)
    assert float(reduce_grad) > 0
    for _ in range(25):
        params, state, after, _ = step(params, state)
    assert np.all(np.asarray(after) < 0.9 * np.asarray(before)), (before, after)
