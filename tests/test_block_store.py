"""Block heads (block, DSpark, DFlash 2) trained from a feature store (training/block_store.py):
with top_k = V the stored batch gives the live loss of each, a small top_k does not (but
keeps the target's argmax: the agreement is the live one), an interrupted write resumes to
the same bytes, and a store of other provenance or an unstorable kind is refused by name.

The 3-layer byte target of tests/test_feature_store.py, in memory (the stores are built by
build_store, what `store-features` runs after loading the target), and its kind of data; a
float32 store. Random head weights (a trained-looking head, not init's), no init compiles,
and the losses compiled at XLA's lowest optimisation level: the file stays a few seconds."""

from __future__ import annotations

import functools
import json

import jax
import numpy as np
import pytest
from specjax.models import full_forward
from test_feature_store import BYTES3, DATASET, _files, _model

from specjax.configs import load_config
from specjax.training.head_kinds import head_kind
from specjax.training.stored_features import build_store
from specjax.training.train_heads import HeadTrainConfig, _batches, _stored_batches, store_features

HEAD = ("num_layers=1", "num_attention_heads=2", "num_key_value_heads=1", "intermediate_size=32", "block_size=3")
KIND_FIELDS = {"block": (), "dspark": ("rank=4",), "dflash2": ("rank=4", "conv_groups=2", "paths=4", "branch=2")}
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(target, data file, the dataset's store with top_k = V: every log-probability)."""
    root = tmp_path_factory.mktemp("block_store")
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "parse", "value", "return", "(x)", "self", "none"]
    with open(root / "data.jsonl", "w") as f:
        for i in range(24):
            f.write(json.dumps({"text": f"{i}: " + " ".join(rng.choice(words, 8))}) + "\n")
    target = _model(0)
    build_store(_config(root / "data.jsonl"), target, root / "store", progress=False)
    return target, root / "data.jsonl", root / "store"


def _config(data, kind: str = "block", *overrides) -> HeadTrainConfig:
    fields = [f"{kind}.{field}" for field in (*HEAD, *KIND_FIELDS[kind])]
    return load_config(
        HeadTrainConfig,
        None,
        [
            "target=byte3",  # not loaded: the tests pass the Model
            f"kind={kind}",
            *fields,
            f"dataset.path={data}",
            *DATASET,
            "features.dtype=float32",
            "features.shard_windows=4",
            f"features.top_k={BYTES3.vocab_size}",
            *overrides,
        ],
    )


@functools.partial(jax.jit, static_argnums=0, compiler_options=FAST_COMPILE)
def _loss(loss, target_params, params, inputs, mask):
    return loss(target_params, params, inputs, mask)


def _head(config, target):
    """(the kind's loss, random head params of its shapes), its init never compiled."""
    kinds = []
    shapes = jax.eval_shape(lambda: kinds.append(head_kind(config, target, None)) or kinds[0].initial)
    rng = np.random.default_rng(1)
    params = jax.tree.map(lambda s: (0.2 * rng.standard_normal(s.shape) + (len(s.shape) < 2)).astype(s.dtype), shapes)
    return kinds[0].loss, params


def _live_and_stored(config, target, step: int = 1):
    """(live (loss, parts), stored (loss, parts)) of config's head on one step's batch."""
    loss, params = _head(config, target)
    tokens, mask = _batches(config, target)(step)
    batch, stored_mask = _stored_batches(config, target, None)(step)
    assert mask is not None and 0 < mask.sum() < mask.size  # a real mask: positions left out
    np.testing.assert_array_equal(stored_mask, mask)
    return _loss(loss, target.params, params, tokens, mask), _loss(loss, target.params, params, batch, stored_mask)


@pytest.mark.parametrize("kind", ["block", "dspark", "dflash2"])
def test_a_full_top_k_store_gives_the_live_loss(built, kind):
    target, data, store = built
    (live, live_parts), (got, got_parts) = _live_and_stored(_config(data, kind, f"features.store={store}"), target)
    assert float(live) > 0.1  # a random head: far from its teacher
    np.testing.assert_allclose(float(got), float(live), rtol=1e-5)
    for a, b in zip(got_parts, live_parts, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_a_small_top_k_changes_the_loss_but_not_the_targets_argmax(built, tmp_path):
    target, data, _ = built
    build_store(_config(data, "block", "features.top_k=4"), target, tmp_path / "top4", progress=False)
    config = _config(data, "block", "features.top_k=4", f"features.store={tmp_path / 'top4'}")
    (live, (live_kl, _)), (got, (kl, _)) = _live_and_stored(config, target)
    assert abs(float(got) - float(live)) > 1e-2 * abs(float(live))  # the tail's mass is gone from the teacher
    assert not np.allclose(kl, live_kl, rtol=1e-2)
    # What is stored is the target's own top 4, in order: top_ids[..., 0], the labels, is its argmax.
    batch, _ = _stored_batches(config, target, None)(0)
    logits = jax.jit(full_forward, static_argnums=0, compiler_options=FAST_COMPILE)(
        target.config, target.params, batch["tokens"]
    )
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    top, ids = jax.lax.top_k(logprobs, 4)
    np.testing.assert_array_equal(batch["top_ids"], ids)
    np.testing.assert_array_equal(batch["top_ids"][..., 0], np.argmax(logprobs, axis=-1))
    np.testing.assert_allclose(batch["top_logprobs"], top, rtol=1e-5, atol=1e-6)


def test_an_interrupted_write_resumes_to_the_same_bytes(built, tmp_path):
    target, data, straight = built
    config, run = _config(data), tmp_path / "resumed"
    build_store(config, target, run, progress=False, stop_after=1)
    assert sorted(p.name for p in run.glob("shard-*")) == ["shard-00000.safetensors"]
    (run / "shard-00001.safetensors.tmp").write_bytes(b"\x00" * 100)  # what a kill mid-shard leaves
    summary = build_store(config, target, run, progress=False)
    assert summary["shards"] > 2 and summary["kind"] == "block" and summary["top_k"] == BYTES3.vocab_size
    assert _files(run) == _files(straight)


def test_a_store_of_other_provenance_or_an_unstorable_kind_is_refused_by_name(built, tmp_path):
    target, data, store = built
    with pytest.raises(ValueError, match=r"top_k \(store: 259; this run: 8\)"):
        _stored_batches(_config(data, "block", "features.top_k=8", f"features.store={store}"), target, None)
    other = ("dspark.feature_layers=[2,1,0]", f"features.store={store}")
    with pytest.raises(ValueError, match=r"layers \(store: \[0, 1, 2\]; this run: \[2, 1, 0\]"):
        _stored_batches(_config(data, "dspark", *other), target, None)
    with pytest.raises(ValueError, match=r"target\.weights_sha256"):
        _stored_batches(_config(data, "dflash2", f"features.store={store}"), _model(1), None)
    for kind in ("medusa", "eagle"):  # eagle without eagle3: EAGLE-1
        storable = r"storable kinds are eagle with eagle\.eagle3.*block, dspark, dflash2"
        with pytest.raises(ValueError, match=rf"not {kind}.*{storable}"):
            load_config(HeadTrainConfig, None, [f"kind={kind}", f"features.store={store}"])
        with pytest.raises(ValueError, match="storable kinds"):
            store_features(load_config(HeadTrainConfig, None, [f"kind={kind}"]), tmp_path / "never", progress=False)
    assert not (tmp_path / "never").exists()
