"""Feature-conditioned draft heads (Medusa, EAGLE): features, greedy equality, exact
sampling, save/load, training and its resume after kill -9."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import RAGGED_PROMPTS, TARGET_CONFIG, kill_after_checkpoint, scaled_model
from specjax.models import full_forward
from specjax.models.heads import head_config, init_eagle_params, init_medusa_params, medusa_hidden, target_logits

import specjax
from specjax.bench.distribution import chi_square_p_value
from specjax.configs import dump_config, load_config
from specjax.core.acceptance import always_accept_rule
from specjax.core.sampling import SamplingConfig, probabilities
from specjax.drafters import Eagle, Medusa
from specjax.io.tokenizer import ByteTokenizer
from specjax.training.data import training_batch
from specjax.training.train_heads import EagleHeadConfig, HeadTrainConfig, eagle_loss, medusa_loss, train_head
from specjax.trees import Tree, tree_no_residual_rule


def random_heads(config, num_heads: int, seed: int, scale: float) -> Medusa:
    """Heads that differ from the target's LM head: random residual blocks of `scale`."""
    params = init_medusa_params(config.hidden_size, num_heads, seed)
    w = scale * jax.random.normal(jax.random.key(seed + 1), params["w"].shape) / np.sqrt(config.hidden_size)
    return Medusa(params={"w": w, "b": params["b"]}, vocab_size=config.vocab_size)


def random_eagle(target: specjax.Model, seed: int, scale: float) -> Eagle:
    """An EAGLE head whose layer weights are scaled up so that its guesses vary."""
    layer = head_config(target.config, 2, 1, 32)
    params = init_eagle_params(layer, target.params, seed)
    params = {**params, "fc": params["fc"] * scale, "layers": jax.tree.map(lambda x: x * scale, params["layers"])}
    return Eagle(params=params, config=layer)


@pytest.fixture(scope="module")
def target():
    return scaled_model(TARGET_CONFIG, seed=0)


@pytest.fixture(scope="module", params=["medusa", "eagle"])
def heads(request, target):
    if request.param == "medusa":
        return random_heads(TARGET_CONFIG, num_heads=4, seed=0, scale=0.5)
    return random_eagle(target, seed=0, scale=8.0)


def test_heads_receive_the_targets_hidden_states_at_the_right_positions(target, heads):
    """After the prefill and after every round, the head holds the target's hidden states up
    to position length - 2 (the last verified one), as a cache-free full forward computes them:
    Medusa the one at length - 2, EAGLE all of them by position."""
    state = specjax.init_state(
        target,
        RAGGED_PROMPTS,
        specjax.GenerationConfig(max_new_tokens=20),
        draft=heads,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=3),
    )
    for _ in range(5):
        lengths = np.asarray(state.lengths)
        # The whole buffer: slots past a row's length cannot reach earlier positions (causal).
        _, features = jax.jit(full_forward, static_argnums=(0, 3))(target.config, target.params, state.tokens, True)
        live = ~np.asarray(state.done)
        if heads.name == "medusa":
            expected = np.asarray(features)[np.arange(len(lengths)), np.maximum(lengths - 2, 0)]
            held = np.asarray(state.draft_state.feature)
            np.testing.assert_allclose(held[live], expected[live], atol=2e-4, rtol=2e-4)
        else:
            for b in np.flatnonzero(live):
                held = np.asarray(state.draft_state.features[b, : lengths[b] - 1])
                np.testing.assert_allclose(held, np.asarray(features[b, : lengths[b] - 1]), atol=2e-4, rtol=2e-4)
        state = specjax.step(target, state, draft=heads)


@pytest.mark.parametrize("tree", [None, Tree.full(2, 3)], ids=["chain", "tree"])
def test_greedy_with_heads_equals_plain_greedy(target, heads, tree):
    if tree is not None and not heads.supports_trees:
        with pytest.raises(ValueError, match="cannot expand a token tree"):
            specjax.generate(
                target,
                RAGGED_PROMPTS,
                specjax.GenerationConfig(),
                draft=heads,
                speculative=specjax.SpeculativeConfig(tree=tree),
            )
        return
    plain = specjax.generate(target, RAGGED_PROMPTS, specjax.GenerationConfig(max_new_tokens=24))
    out = specjax.generate(
        target,
        RAGGED_PROMPTS,
        specjax.GenerationConfig(max_new_tokens=24),
        draft=heads,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=3, tree=tree),
    )
    assert out.tokens == plain.tokens
    assert out.stats.accepted_tokens > 0 and out.stats.drafter["kind"] == heads.name


VOCAB8 = TARGET_CONFIG.replace(vocab_size=8)
PROMPT = [1, 2, 3]
SAMPLES = 6000


def _exact_joint(model, sampling) -> np.ndarray:
    vocab = model.config.vocab_size
    first = probabilities(jnp.asarray(specjax.io.model.logits(model, [PROMPT])[0, -1]), sampling)
    seconds = specjax.io.model.logits(model, [[*PROMPT, t] for t in range(vocab)])[:, -1]
    return np.asarray(first[:, None] * probabilities(jnp.asarray(seconds), sampling)).reshape(-1)


@pytest.mark.parametrize("rule_name", ["exact", "wrong"])
@pytest.mark.parametrize(
    "kind, tree",
    [("medusa", None), ("medusa", Tree.from_paths([(0,), (1,), (2,), (0, 0), (1, 0)])), ("eagle", None)],
    ids=["medusa-chain", "medusa-tree", "eagle-chain"],
)
def test_sampling_with_heads_follows_the_target(rule_name, kind, tree):
    target = scaled_model(VOCAB8, seed=0, scale=6.0)
    heads = random_heads(VOCAB8, num_heads=2, seed=3, scale=4.0) if kind == "medusa" else random_eagle(target, 3, 8.0)
    expected = _exact_joint(target, SamplingConfig(temperature=1.0))
    wrong = always_accept_rule if tree is None else tree_no_residual_rule
    out = specjax.generate(
        target,
        [PROMPT] * SAMPLES,
        specjax.GenerationConfig.at_temperature(1.0, max_new_tokens=2, seed=1),
        draft=heads,
        speculative=specjax.SpeculativeConfig(
            num_speculative_tokens=2, rule=None if rule_name == "exact" else wrong, tree=tree
        ),
    )
    tokens = np.asarray(out.tokens)
    p_value = chi_square_p_value(tokens[:, 0] * 8 + tokens[:, 1], expected)
    if rule_name == "exact":
        assert p_value > 1e-3
        assert 0.0 < out.stats.acceptance_rate < 1.0
    else:
        assert p_value < 1e-8


def test_save_load_round_trip_and_wrong_target(target, heads, tmp_path):
    specjax.save_drafter(heads, tmp_path / "head", target_name="tiny-target", target=target.config)
    loaded = specjax.load_drafter(tmp_path / "head", target)
    assert loaded.without_weights() == heads.without_weights()
    for a, b in zip(jax.tree.leaves(heads.params), jax.tree.leaves(loaded.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    a = specjax.generate(
        target,
        RAGGED_PROMPTS,
        specjax.GenerationConfig(max_new_tokens=12),
        draft=heads,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=3),
    )
    b = specjax.generate(
        target,
        RAGGED_PROMPTS,
        specjax.GenerationConfig(max_new_tokens=12),
        draft=loaded,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=3),
    )
    assert a.tokens == b.tokens and a.stats == b.stats
    other = scaled_model(TARGET_CONFIG.replace(hidden_size=64, intermediate_size=64), seed=0)
    with pytest.raises(ValueError, match=r"trained for tiny-target.*hidden size 32"):
        specjax.load_drafter(tmp_path / "head", other)
    with pytest.raises(ValueError, match="vocabulary"):
        specjax.load_drafter(tmp_path / "head", TARGET_CONFIG.replace(vocab_size=64))
    if heads.name == "medusa":
        with pytest.raises(ValueError, match="at most 4 tokens"):
            specjax.generate(
                target,
                [[1, 2]],
                specjax.GenerationConfig(),
                draft=loaded,
                speculative=specjax.SpeculativeConfig(num_speculative_tokens=5),
            )
    with pytest.raises(ValueError, match="is neither a specjax head directory"):
        specjax.load_drafter(tmp_path)


# --- Training --------------------------------------------------------------------------------

BYTES = TARGET_CONFIG.replace(vocab_size=259, num_attention_heads=2, num_key_value_heads=1)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("head_target")
    model = scaled_model(BYTES, seed=0, scale=6.0)
    specjax.save_model(specjax.Model(model.config, model.params, ByteTokenizer()), root / "target")
    return root / "target"


def _config(target_dir, *overrides) -> HeadTrainConfig:
    return load_config(
        HeadTrainConfig,
        None,
        [
            f"target={target_dir}",
            "num_heads=3",
            "data.seq_len=32",
            "data.batch_size=4",
            "optim.learning_rate=0.01",
            "optim.warmup_steps=2",
            "eval.prompts=4",
            "eval.prompt_bytes=16",
            "eval.max_new_tokens=12",
            "eval.num_speculative_tokens=3",
            "checkpoint_every=5",
            "log_every=5",
            *overrides,
        ],
    )


def test_training_lowers_the_loss_of_every_head(target_dir, tmp_path):
    config = _config(target_dir, "steps=60", "eval.every=30")
    results = train_head(config, tmp_path / "run", progress=False)
    rows = [json.loads(r) for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum("loss_per_head" in r for r in rows) == 12
    assert sum("mean_acceptance_length_greedy" in r for r in rows) == 3  # steps 0, 30, 60
    target = specjax.load_model(target_dir)
    head = specjax.load_drafter(results["head"], target)
    assert head.num_heads == 3 and results["head_parameters"] == 3 * (32 * 32 + 32)
    # On one fixed batch (batch noise aside), every head's KL to the target went down.
    tokens = jnp.asarray(training_batch(config.data, config.seed, 0))
    initial = init_medusa_params(BYTES.hidden_size, 3, config.seed)
    _, before = medusa_loss(target.config, target.params, initial, tokens)
    _, after = medusa_loss(target.config, target.params, head.params, tokens)
    assert np.all(np.asarray(after) < 0.9 * np.asarray(before)), (before, after)


def test_eagle_training_lowers_its_losses(target_dir, tmp_path):
    # Heads 0: the target's (BYTES has the defaults' 2 and 1, so the network is the same).
    sizes = ("eagle.num_attention_heads=0", "eagle.num_key_value_heads=0", "eagle.intermediate_size=32")
    config = _config(target_dir, "kind=eagle", *sizes, "steps=30", "eval.every=30")
    results = train_head(config, tmp_path / "run", progress=False)
    target = specjax.load_model(target_dir)
    head = specjax.load_drafter(results["head"], target)
    want = {"hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 32}
    assert results["eagle_layer"] == want
    assert {name: getattr(head.config, name) for name in want} == want
    tokens = jnp.asarray(training_batch(config.data, config.seed, 0))
    initial = init_eagle_params(head.config, target.params, config.seed)
    _, before = eagle_loss(head.config, target.config, target.params, initial, tokens, (1.0, 0.1))
    _, after = eagle_loss(head.config, target.config, target.params, head.params, tokens, (1.0, 0.1))
    assert np.all(np.asarray(after) < 0.9 * np.asarray(before)), (before, after)  # feature loss and token KL


def test_kill_9_during_head_training_then_resume(target_dir, tmp_path):
    """SIGKILL a real `specjax train-head` after a checkpoint; the rerun ends as an uninterrupted
    run. The kind is the block head: its anchors are drawn per batch, so a resumed run must
    draw the same ones (the machinery is every kind's)."""
    config = _config(
        target_dir, "kind=block", "block.intermediate_size=32", "block.block_size=3", "steps=40", "eval.every=40"
    )
    config_path = tmp_path / "head.yaml"
    dump_config(config, config_path)
    run_dir = tmp_path / "killed"
    command = [sys.executable, "-m", "specjax.cli", "train-head", "--config", str(config_path), "--out", str(run_dir)]
    kill_after_checkpoint([*command, "--no-progress"], run_dir / "checkpoints", min_step=10, total_steps=40)
    straight = train_head(config, tmp_path / "straight", progress=False)
    target = specjax.load_model(target_dir)
    a = specjax.load_drafter(straight["head"], target).params
    b = specjax.load_drafter(run_dir / "head", target).params
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "name",
    [
        "stdlib-medusa",
        "stdlib-eagle",
        "stdlib-eagle3",
        "stdlib-eagle3-published",
        "stdlib-block-head",
        "stdlib-dspark-head",
        "stdlib-dflash2-head",
    ],
)
def test_embedded_heads_decode_exactly_and_are_accepted(name):
    """The shipped heads, on the target they were trained for: greedy output equals plain
    greedy with a chain and with a tree, and they are accepted well beyond chance."""
    target = specjax.load_model("stdlib-target")
    head = specjax.load_drafter(name, target)
    prompts = ["def parse_args(self):\n", "import os\n"]
    plain = specjax.generate(target, prompts, specjax.GenerationConfig(max_new_tokens=32))
    config = specjax.GenerationConfig(max_new_tokens=32)
    for speculative in (
        specjax.SpeculativeConfig(num_speculative_tokens=4),
        specjax.SpeculativeConfig(tree=Tree.full(2, 3)),
    ):
        out = specjax.generate(target, prompts, config, draft=head, speculative=speculative)
        assert out.tokens == plain.tokens
        assert out.stats.mean_acceptance_length > 1.8


def _dense_medusa_loss(config, target_params, head_params, tokens, mask=None):
    """Medusa's loss as first written: every head's [B, T, H, V] logits at once."""
    logits, features = full_forward(config, target_params, tokens, features=True)
    b, t, d = features.shape
    num_heads = head_params["w"].shape[0]
    hidden = medusa_hidden(head_params, features.reshape(b * t, d)).reshape(b, t, num_heads, d)
    head_logits = target_logits(config, target_params, hidden)  # [B, T, H, V]
    losses = []
    for k in range(1, num_heads + 1):
        teacher = jax.nn.log_softmax(logits[:, k:], axis=-1)
        student = jax.nn.log_softmax(head_logits[:, : t - k, k - 1], axis=-1)
        kl = jnp.sum(jnp.exp(teacher) * (teacher - student), axis=-1)  # [B, T-k]
        weights = jnp.ones_like(kl) if mask is None else mask[:, k:]
        losses.append(jnp.sum(kl * weights) / jnp.maximum(jnp.sum(weights), 1.0))
    return jnp.mean(jnp.stack(losses)), jnp.stack(losses)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("blocks", [1, 2])
def test_medusa_loss_one_head_at_a_time_equals_the_dense_formula(target, masked, blocks):
    """The scanned, rematerialised loss (one head's logits alive at a time) has the dense
    formula's value, per-head parts and gradient, for a mask or none and for heads of one
    or several residual blocks."""
    d, num_heads = TARGET_CONFIG.hidden_size, 4
    keys = jax.random.split(jax.random.key(3), 3)
    shape = (num_heads, d, d) if blocks == 1 else (num_heads, blocks, d, d)
    head_params = {
        "w": jax.random.normal(keys[0], shape) / np.sqrt(d),
        "b": 0.1 * jax.random.normal(keys[1], shape[:-1]),
    }
    tokens = jax.random.randint(keys[2], (3, 12), 0, TARGET_CONFIG.vocab_size)
    mask = None
    if masked:  # a loss mask over predicted positions, as a dataset's
        mask = (jax.random.uniform(jax.random.key(4), tokens.shape) < 0.6).astype(jnp.float32)
    args = (TARGET_CONFIG, target.params)
    (loss, parts), grads = jax.value_and_grad(lambda p: medusa_loss(*args, p, tokens, mask), has_aux=True)(head_params)
    (want, want_parts), want_grads = jax.value_and_grad(
        lambda p: _dense_medusa_loss(*args, p, tokens, mask), has_aux=True
    )(head_params)
    assert parts.shape == (num_heads,) and float(want) > 1e-3  # heads that differ from the target
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(parts), np.asarray(want_parts), rtol=1e-6, atol=1e-6)
    for name in ("w", "b"):
        np.testing.assert_allclose(np.asarray(grads[name]), np.asarray(want_grads[name]), rtol=1e-5, atol=1e-6)


def test_eagle_head_sizes_of_zero_are_the_targets():
    """0 = the target's own (as distill's draft_config), so configs/eagle3_any_target.yaml
    sizes its head for any target; explicit sizes stay, negative ones are refused."""
    path = Path(__file__).resolve().parents[1] / "configs" / "eagle3_any_target.yaml"
    config = load_config(HeadTrainConfig, path, ["dataset.path=chats.jsonl"])
    layer = config.eagle.layer(TARGET_CONFIG)
    for name in ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"):
        assert getattr(layer, name) == getattr(TARGET_CONFIG, name), name
    assert layer.num_hidden_layers == 1 and config.eagle.eagle3.enabled and not config.eagle.feature_layers
    mixed = EagleHeadConfig(num_attention_heads=0, num_key_value_heads=0, intermediate_size=24).layer(TARGET_CONFIG)
    assert (mixed.num_attention_heads, mixed.intermediate_size) == (TARGET_CONFIG.num_attention_heads, 24)
    with pytest.raises(ValueError, match="0: the target's"):
        EagleHeadConfig(intermediate_size=-1)
    with pytest.raises(ValueError, match=r"missing config key dataset\.path"):  # no --data: one line, exit 2
        load_config(HeadTrainConfig, path)
