"""EAGLE-3 trained from a feature store (training/feature_store.py, `specjax store-features`):
the stored batch gives the live loss and gradient, an interrupted write resumes to the same
bytes, a store of other provenance is refused by name, and a short train-head run from the
store logs the live run's losses. One 3-layer byte target (259 tokens), float32 stores
(the live loss to float tolerance; bfloat16, the default, is checked at a bfloat16 tolerance)."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TARGET_CONFIG
from specjax.models import init_params

import specjax
from specjax.configs import load_config
from specjax.io.tokenizer import ByteTokenizer
from specjax.training.eagle3_objective import StoredTTTLoss, TTTLoss, eagle3_options, init_eagle3_params
from specjax.training.feature_store import FeatureStore
from specjax.training.stored_features import run_store_windows, store_provenance
from specjax.training.train_heads import (
    HeadTrainConfig,
    _batches,
    _eagle3_setup,
    _stored_batches,
    store_features,
    train_head,
)

BYTES3 = TARGET_CONFIG.replace(vocab_size=259, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=3)
LAYERS = (0, 1, 2)


def _model(seed: int) -> specjax.Model:
    shapes = jax.eval_shape(lambda: init_params(BYTES3, 0))
    rng = np.random.default_rng(seed)
    params = jax.tree.map(
        lambda s: jnp.asarray(0.12 * rng.standard_normal(s.shape) if len(s.shape) > 1 else np.ones(s.shape), s.dtype),
        shapes,
    )
    return specjax.Model(BYTES3, params, ByteTokenizer())


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("feature_store")
    specjax.save_model(_model(0), root / "target")
    specjax.save_model(_model(1), root / "other_target")
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "parse", "value", "return", "(x)", "self", "none"]
    with open(root / "data.jsonl", "w") as f:
        for i in range(48):
            f.write(json.dumps({"text": f"{i}: " + " ".join(rng.choice(words, 8))}) + "\n")
    return root


def _config(paths: Path, *overrides) -> HeadTrainConfig:
    return load_config(
        HeadTrainConfig,
        None,
        [
            f"target={paths / 'target'}",
            "kind=eagle",
            "eagle.intermediate_size=32",
            f"eagle.feature_layers={list(LAYERS)}",
            "eagle.eagle3.enabled=true",
            "eagle.eagle3.draft_vocab_size=64",
            "eagle.eagle3.ttt_steps=2",
            "eagle.eagle3.lm_head_init=target",
            "data.seq_len=16",
            "data.batch_size=4",
            "optim.learning_rate=0.02",
            "optim.warmup_steps=1",
            "eval.prompts=2",
            "eval.prompt_bytes=8",
            "eval.max_new_tokens=4",
            "eval.num_speculative_tokens=2",
            "eval.every=100",
            "steps=3",
            "checkpoint_every=100",
            "log_every=1",
            "features.dtype=float32",
            "features.shard_windows=4",
            *overrides,
        ],
    )


DATASET = ("dataset.seq_len=16", "dataset.batch_size=4")  # with dataset.path


@pytest.fixture(scope="module")
def stores(paths):
    """{name: (config, store dir)}: the corpus stream and a JSONL dataset, float32."""
    out = {}
    for name, extra in (("corpus", ()), ("dataset", (f"dataset.path={paths / 'data.jsonl'}", *DATASET))):
        config = _config(paths, *extra)
        store_features(config, paths / f"store_{name}", progress=False)
        out[name] = (_config(paths, *extra, f"features.store={paths / f'store_{name}'}"), paths / f"store_{name}")
    return out


@functools.partial(jax.jit, static_argnums=0)
def _value_and_grad(loss, target_params, params, inputs, mask):
    return jax.value_and_grad(loss, argnums=1, has_aux=True)(target_params, params, inputs, mask)


def _loss_and_grad_norm(loss, target, params, inputs, mask):
    """(loss, the gradient's global norm, parts [P, N]); one compiled program per loss and shapes."""
    (value, parts), grads = _value_and_grad(loss, target.params, params, inputs, mask)
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(grads)))
    return float(value), float(norm), np.asarray(parts)


def _start(config, target):
    """(live loss, stored loss, initial head params) of `config` on `target`."""
    layer, layers, vocab = _eagle3_setup(config, target, None)
    s, options = config.eagle.eagle3, eagle3_options(vocab.size)
    params = init_eagle3_params(layer, len(layers), vocab, seed=0, target=(target.config, target.params))
    live = TTTLoss(layer, target.config, options, layers, vocab, s)
    return live, StoredTTTLoss(layer, target.config, options, vocab, s), params


def test_stored_batch_gives_the_live_loss_and_gradient(paths, stores):
    """A dataset's store (its epoch order and mask); the corpus's rows are the run's own steps."""
    config, _ = stores["dataset"]
    target = specjax.load_model(paths / "target")
    live_loss, stored_loss, params = _start(config, target)
    live, stored = _batches(config, target), _stored_batches(config, target, None)
    step = 4  # rows from the epoch's random order (dataset_batch's), not the file's
    tokens, mask = live(step)
    batch, stored_mask = stored(step)
    np.testing.assert_array_equal(batch["tokens"], tokens)
    assert mask is not None and 0 < mask.sum() < mask.size  # a real mask: positions left out
    np.testing.assert_array_equal(stored_mask, mask)
    want = _loss_and_grad_norm(live_loss, target, params, tokens, mask)
    got = _loss_and_grad_norm(stored_loss, target, params, batch, stored_mask)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4)
    np.testing.assert_allclose(got[2], want[2], rtol=1e-4, atol=1e-6)
    # The tolerance tells misalignments apart: another step's windows, one layer's states for another's.
    other, _ = stored(step + 1)
    shifted = _loss_and_grad_norm(stored_loss, target, params, {**other, "tokens": batch["tokens"]}, stored_mask)
    assert abs(shifted[0] - want[0]) > 1e-3 * abs(want[0])
    d = BYTES3.hidden_size
    swapped = np.concatenate(
        [batch["multi"][..., d : 2 * d], batch["multi"][..., :d], batch["multi"][..., 2 * d :]], -1
    )
    wrong_layer = _loss_and_grad_norm(stored_loss, target, params, {**batch, "multi": swapped}, stored_mask)
    assert abs(wrong_layer[0] - want[0]) > 1e-3 * abs(want[0])


def test_bfloat16_store_is_the_live_loss_within_bfloat16_rounding(paths, stores, tmp_path):
    """bfloat16 keeps 8 bits of mantissa: the loss agrees to about 1e-2 relative, not 1e-5."""
    config, _ = stores["dataset"]
    dataset = (f"dataset.path={paths / 'data.jsonl'}", *DATASET, "features.dtype=bfloat16")
    store_features(_config(paths, *dataset), tmp_path / "bf16", progress=False)
    target = specjax.load_model(paths / "target")
    live_loss, stored_loss, params = _start(config, target)
    bf16 = _config(paths, *dataset, f"features.store={tmp_path / 'bf16'}")
    batch, mask = _stored_batches(bf16, target, None)(0)
    assert batch["logits"].dtype == jnp.bfloat16 and batch["multi"].dtype == jnp.bfloat16
    tokens, _ = _batches(config, target)(0)
    want = _loss_and_grad_norm(live_loss, target, params, tokens, mask)
    got = _loss_and_grad_norm(stored_loss, target, params, batch, mask)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-2)


def test_bfloat16_compute_is_the_float32_loss_within_its_rounding(paths, stores):
    """eagle3.compute_dtype bfloat16 (mixed precision): the same batch's loss and gradient
    within bfloat16's rounding of the float32 ones, the gradient float32 for float32
    weights, and the products really in bfloat16 (the loss is not bit-equal)."""
    config, _ = stores["dataset"]
    target = specjax.load_model(paths / "target")
    _, stored_loss, params = _start(config, target)
    mixed = dataclasses.replace(
        stored_loss, settings=dataclasses.replace(stored_loss.settings, compute_dtype="bfloat16")
    )
    batch, mask = _stored_batches(config, target, None)(2)
    want = _loss_and_grad_norm(stored_loss, target, params, batch, mask)
    got = _loss_and_grad_norm(mixed, target, params, batch, mask)
    np.testing.assert_allclose(got[0], want[0], rtol=2e-2)
    np.testing.assert_allclose(got[1], want[1], rtol=5e-2)
    assert got[0] != want[0]
    _, grads = _value_and_grad(mixed, target.params, params, batch, mask)
    assert {x.dtype for x in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
    with pytest.raises(ValueError, match="compute_dtype"):
        dataclasses.replace(stored_loss.settings, compute_dtype="float16")


def test_scoring_every_position_is_the_unmasked_loss(paths, stores):
    """eagle3.score all: the loss of a masked dataset batch is the loss over every position up
    to each window's last scored one (the prompts too, no padding), which the mask's loss is
    not; and a store built for one run length serves another (the vocabulary is the split's)."""
    config, _ = stores["dataset"]
    target = specjax.load_model(paths / "target")
    _, stored_loss, params = _start(config, target)
    every = dataclasses.replace(stored_loss, settings=dataclasses.replace(stored_loss.settings, score="all"))
    batch, mask = _stored_batches(config, target, None)(1)
    mask = mask.copy()
    mask[:, :5] = 0.0  # as a chat's prompt is: unscored positions before the scored ones
    real = np.flip(np.maximum.accumulate(np.flip(mask, 1), axis=1), 1)  # up to the last scored position
    assert real.sum() > mask.sum() and real.sum() < real.size  # the prompt in, the window's end out
    unmasked = _loss_and_grad_norm(stored_loss, target, params, batch, real)
    got = _loss_and_grad_norm(every, target, params, batch, mask)
    np.testing.assert_allclose(got[0], unmasked[0], rtol=1e-6)
    assert abs(got[0] - _loss_and_grad_norm(stored_loss, target, params, batch, mask)[0]) > 1e-3 * abs(got[0])
    with pytest.raises(ValueError, match=r"eagle3\.score"):
        dataclasses.replace(stored_loss.settings, score="prompts")
    longer = dataclasses.replace(config, steps=3 * config.steps)
    np.testing.assert_array_equal(_stored_batches(longer, target, None)(1)[0]["tokens"], batch["tokens"])


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_an_interrupted_write_resumes_to_the_same_bytes(paths, stores, tmp_path):
    config = _config(paths)  # the corpus: 3 steps x 4 windows, 3 shards of 4
    _, straight = stores["corpus"]
    run = tmp_path / "resumed"
    store_features(config, run, progress=False, stop_after=1)
    assert sorted(p.name for p in run.glob("shard-*")) == ["shard-00000.safetensors"]
    # What a kill -9 mid-shard leaves: a partial .tmp, never a partial shard.
    (run / "shard-00001.safetensors.tmp").write_bytes(b"\x00" * 100)
    with pytest.raises(ValueError, match="incomplete"):
        FeatureStore(run, json.loads((run / "manifest.json").read_text())["provenance"])
    summary = store_features(config, run, progress=False)
    assert summary["shards"] == 3 and summary["windows"] == 12
    assert _files(run) == _files(straight)


def test_a_store_of_other_provenance_is_refused_by_name(paths, stores):
    config, directory = stores["corpus"]
    target = specjax.load_model(paths / "target")
    with pytest.raises(ValueError, match=r"target\.weights_sha256"):
        other = _config(paths, f"target={paths / 'other_target'}", f"features.store={directory}")
        _stored_batches(other, specjax.load_model(paths / "other_target"), None)
    with pytest.raises(ValueError, match=r"layers \(store: \[0, 1, 2\]; this run: \[2, 1, 0\]"):
        _stored_batches(_config(paths, "eagle.feature_layers=[2,1,0]", f"features.store={directory}"), target, None)
    with pytest.raises(ValueError, match=r"dtype"):
        _stored_batches(_config(paths, "features.dtype=bfloat16", f"features.store={directory}"), target, None)
    with pytest.raises(ValueError, match=r"windows\.seed"):
        _stored_batches(_config(paths, "seed=1", f"features.store={directory}"), target, None)
    # And the run it was built for opens it.
    windows = run_store_windows(config, target)
    _, layers, vocab = _eagle3_setup(config, target, None)
    assert FeatureStore(directory, store_provenance(config, target, windows, layers, vocab)).corpus


def test_train_head_from_the_store_logs_the_live_losses(paths, stores, tmp_path):
    stored_config, _ = stores["dataset"]
    live_config = _config(paths, f"dataset.path={paths / 'data.jsonl'}", *DATASET)
    live = train_head(live_config, tmp_path / "live", progress=False)
    stored = train_head(stored_config, tmp_path / "stored", progress=False)
    assert live["draft_vocab"] == stored["draft_vocab"]

    def losses(run):
        rows = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return np.array([[r["loss"], *r["kl_per_step"]] for r in rows if "loss" in r])

    assert losses("live").shape == (3, 3)
    np.testing.assert_allclose(losses("stored"), losses("live"), rtol=1e-4)
    assert not np.allclose(losses("live")[0], losses("live")[-1])  # the steps trained: the losses moved


def test_store_features_command_finishes_a_store_and_train_head_takes_it(paths, stores, tmp_path, capsys):
    """`specjax store-features` on a complete store writes nothing and reports it; a config
    naming a store that does not exist is an error naming the command that builds one."""
    from specjax.cli import main
    from specjax.configs import dump_config

    config, directory = stores["corpus"]
    dump_config(config, tmp_path / "head.yaml")
    before = _files(directory)
    assert main(["store-features", "--config", str(tmp_path / "head.yaml"), "--out", str(directory)]) == 0
    assert json.loads(capsys.readouterr().out)["shards"] == 3
    assert _files(directory) == before
    missing = _config(paths, f"features.store={tmp_path / 'none'}")
    with pytest.raises(ValueError, match="specjax store-features"):
        _stored_batches(missing, specjax.load_model(paths / "target"), None)
