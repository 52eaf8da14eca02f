"""Distillation: batches and masks, acceptance goes up, and resume is exact."""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TARGET_CONFIG, kill_after_checkpoint, noisy_copy, scaled_model
from safetensors import safe_open
from specjax.models import full_forward

import specjax
from specjax.configs import dump_config, load_config
from specjax.drafters.layer_skip import early_exit
from specjax.io.shared_weights import save_model_sharing
from specjax.io.tokenizer import ByteTokenizer
from specjax.training.distill import DistillConfig, _start_draft, distill, distillation_batch

# The test target's shape with the byte vocabulary, so text prompts from the corpus work.
BYTES = TARGET_CONFIG.replace(vocab_size=259, num_attention_heads=2, num_key_value_heads=1)


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    target = scaled_model(BYTES, seed=0, scale=6.0)
    # A heavily perturbed copy: it starts far from the target (little acceptance) but can
    # reach it, so a few dozen steps show whether distillation moves it the right way.
    draft = noisy_copy(target, noise=1.0, seed=7)
    for name, model in (("target", target), ("draft", draft)):
        specjax.save_model(specjax.Model(model.config, model.params, ByteTokenizer()), root / name)
    return root / "target", root / "draft"


def _config(pair_dirs, *overrides) -> DistillConfig:
    target, draft = pair_dirs
    return load_config(
        DistillConfig,
        None,
        [
            f"target={target}",
            f"draft={draft}",
            "data.seq_len=24",
            "data.prompt_len=8",
            "data.batch_size=4",
            "optim.learning_rate=0.01",
            "optim.warmup_steps=2",
            "optim.weight_decay=0.0",
            "eval.prompts=4",
            "eval.prompt_bytes=16",
            "eval.max_new_tokens=16",
            "checkpoint_every=5",
            "log_every=5",
            *overrides,
        ],
    )


def test_batch_mixes_sources_with_masks(pair_dirs):
    config = _config(pair_dirs, "data.corpus=0.5", "data.target_generated=0.25", "data.draft_generated=0.25")
    target, draft = specjax.load_model(pair_dirs[0]), specjax.load_model(pair_dirs[1])
    tokens, mask = distillation_batch(config, target, draft, step=3)
    assert tokens.shape == (4, 24) and mask.shape == (4, 23)
    assert tokens.min() >= 0 and tokens.max() < 259
    # Corpus rows learn everywhere; generated rows only where the model continued the prompt.
    np.testing.assert_array_equal(mask[:2], 1.0)
    np.testing.assert_array_equal(mask[2:, :7], 0.0)
    np.testing.assert_array_equal(mask[2:, 7:], 1.0)
    # The draft row is the draft's own (greedy-free, T=1) continuation of its prompt: regenerate it.
    again, _ = distillation_batch(config, target, draft, step=3)
    np.testing.assert_array_equal(tokens, again)
    other, _ = distillation_batch(config, target, draft, step=4)
    assert not np.array_equal(tokens[3], other[3])


def test_distillation_increases_acceptance(pair_dirs, tmp_path):
    config = _config(pair_dirs, "steps=40", "eval.every=40", "data.corpus=0.5", "data.draft_generated=0.5")
    results = distill(config, tmp_path, progress=False)
    # A random 259-way target is nearly flat, so its argmax is close to arbitrary and greedy
    # acceptance barely moves; at the distillation temperature (T=1) acceptance = 1 - TV does.
    before, after = results["mean_acceptance_length_sampled_before"], results["mean_acceptance_length_sampled_after"]
    assert after > before + 0.5
    assert results["mean_acceptance_length_after"] >= results["mean_acceptance_length_before"]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == results
    distilled = specjax.load_model(results["draft"])
    assert distilled.config == specjax.load_model(pair_dirs[1]).config


def test_resume_reproduces_the_uninterrupted_run(pair_dirs, tmp_path):
    config = _config(pair_dirs, "steps=12", "eval.every=12", "objective=tv", "data.draft_generated=0.5")
    straight = distill(config, tmp_path / "straight", progress=False)
    partial = distill(config, tmp_path / "resumed", progress=False, stop_after=7)  # checkpoint at 5
    assert partial == {"completed_steps": 7}
    assert _checkpoint_steps(tmp_path / "resumed") == ["7"]  # keep_checkpoints=1: the 5 went once 7 was whole
    resumed = distill(config, tmp_path / "resumed", progress=False)
    assert _checkpoint_steps(tmp_path / "resumed") == _checkpoint_steps(tmp_path / "straight") == ["12"]
    a = specjax.load_model(straight["draft"]).params
    b = specjax.load_model(resumed["draft"]).params
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def _checkpoint_steps(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())


def test_kill_9_during_distillation_then_resume(pair_dirs, tmp_path):
    """SIGKILL a real `specjax distill` process after a checkpoint; the rerun ends as an uninterrupted run."""
    # 24 steps: the kill lands after the step-10 checkpoint with steps to spare, and all three
    # runs (killed, rerun, straight) stay short (60 steps made this the suite's slowest test).
    config = _config(pair_dirs, "steps=24", "eval.every=24", "data.draft_generated=0.5")
    config_path = tmp_path / "distill.yaml"
    dump_config(config, config_path)
    run_dir = tmp_path / "killed"
    command = [sys.executable, "-m", "specjax.cli", "distill", "--config", str(config_path), "--out", str(run_dir)]
    kill_after_checkpoint([*command, "--no-progress"], run_dir / "checkpoints", min_step=10, total_steps=24)
    straight = distill(config, tmp_path / "straight", progress=False)
    a = specjax.load_model(straight["draft"]).params
    b = specjax.load_model(run_dir / "draft").params
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def test_config_errors(pair_dirs):
    with pytest.raises(ValueError, match="unknown objective"):
        _config(pair_dirs, "objective=kl")
    with pytest.raises(ValueError, match="data fractions must be >= 0"):
        _config(pair_dirs, "data.corpus=0.0")


def test_draft_init_target_layers_is_the_targets_first_layers_copied(pair_dirs):
    """draft_init target_layers: the draft computes what layer skip's first N layers do (the
    same logits), on copies of the target's arrays (the step donates the draft's buffers)."""
    config = _config(pair_dirs, "draft_init=target_layers", "draft_config.num_hidden_layers=1")
    target = specjax.load_model(pair_dirs[0])
    draft = _start_draft(config, target)
    assert draft.config.num_hidden_layers == 1 and draft.tokenizer is target.tokenizer
    tokens = np.random.default_rng(0).integers(0, 259, (2, 12)).astype(np.int32)
    skip_config, skip_params = early_exit(target.config, target.params, 1)
    np.testing.assert_array_equal(
        full_forward(draft.config, draft.params, tokens), full_forward(skip_config, skip_params, tokens)
    )
    assert draft.params["embed"] is not target.params["embed"]
    for bad, match in (
        ("draft_config.hidden_size=64", "only draft_config.num_hidden_layers"),
        ("draft_config.num_hidden_layers=9", "must be < the target's"),
    ):
        with pytest.raises(ValueError, match=match):
            _start_draft(_config(pair_dirs, "draft_init=target_layers", bad), target)


def test_frozen_embedding_draft_ships_without_the_targets_tensors(pair_dirs, tmp_path):
    """train_embedding false with draft_init target_layers: the embedding and LM head stay the
    target's, and OUT/draft_shared holds everything else (bfloat16) and borrows them back from
    the target on load, checked by sha256."""
    config = _config(
        pair_dirs,
        "draft_init=target_layers",
        "draft_config.num_hidden_layers=1",
        "train_embedding=false",
        "steps=2",
        "eval.every=2",
        "eval.prompts=2",
        "eval.max_new_tokens=4",
    )
    results = distill(config, tmp_path, progress=False)
    target, full = specjax.load_model(pair_dirs[0]), specjax.load_model(results["draft"])
    for name in ("embed", "lm_head"):
        np.testing.assert_array_equal(full.params[name], target.params[name])
    assert not np.array_equal(full.params["layers"][0]["mlp"]["up_proj"], target.params["layers"][0]["mlp"]["up_proj"])
    shared_dir = tmp_path / "draft_shared"
    with safe_open(str(shared_dir / "model.safetensors"), "numpy") as f:
        assert not {"model.embed_tokens.weight", "lm_head.weight"} & set(f.keys())
    shared = specjax.load_model(shared_dir)
    assert shared.config == full.config
    pairs = zip(jax.tree_util.tree_leaves_with_path(shared.params), jax.tree.leaves(full.params), strict=True)
    for (path, a), b in pairs:
        expected = np.asarray(jnp.asarray(b, jnp.bfloat16).astype(jnp.float32))  # layers were written in bf16
        exact = "embed" in str(path) or "lm_head" in str(path)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b) if exact else expected)
    # Another model under the borrowed name is refused, not silently used.
    config_file = shared_dir / "config.json"
    saved = json.loads(config_file.read_text())
    saved["specjax_weights_from"]["sha256"] = "0" * 64
    config_file.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="other values"):
        specjax.load_model(shared_dir)
    with pytest.raises(ValueError, match="differs from"):  # a trained embedding cannot be borrowed
        save_model_sharing(specjax.load_model(pair_dirs[1]), tmp_path / "x", "t", target)


def test_comparison_writes_table_and_plot(pair_dirs, tmp_path):
    from specjax.configs import to_dict
    from specjax.training.distill_compare import CompareConfig, Variant, compare

    base = _config(pair_dirs, "steps=4", "eval.every=2", "eval.max_new_tokens=8")
    config = CompareConfig(
        base=base,
        variants=[
            Variant("next_token", ["objective=next_token"]),
            Variant("tv_on_policy", ["objective=tv", "data.draft_generated=0.5"]),
        ],
    )
    rows = compare(config, tmp_path, progress=False)
    assert [r["variant"] for r in rows] == ["next_token", "tv_on_policy"]
    assert rows[0]["gain_vs_first_variant"] == 0.0
    assert (tmp_path / "acceptance.png").stat().st_size > 1000
    header = (tmp_path / "results.csv").read_text().splitlines()[0]
    assert header.startswith("variant,mean_acceptance_length_before")
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [r["step"] for r in saved["curves"]["tv_on_policy"]] == [0, 2, 4]
    assert saved["config"] == to_dict(config)
