"""Training: the loss falls, and an interrupted run resumes to the same parameters."""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
import pytest
from conftest import kill_after_checkpoint

from specjax.configs import dump_config, load_config
from specjax.training.train import TrainConfig, train

TINY = [
    "model.vocab_size=259",
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",
    "model.max_position_embeddings=64",
    "data.seq_len=32",
    "data.batch_size=4",
    "optim.warmup_steps=2",
    "optim.learning_rate=0.01",
    "checkpoint_every=4",
    "eval_every=6",
    "eval_windows=2",
    "log_every=2",
]


def _config(steps: int) -> TrainConfig:
    return load_config(TrainConfig, None, [*TINY, f"steps={steps}"])


def _assert_same_params(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


@pytest.fixture(scope="module")
def run30(tmp_path_factory):
    """An uninterrupted 30-step run: its metrics, and the parameters the killed run must reach."""
    out = tmp_path_factory.mktemp("run30")
    return out, train(_config(30), out, progress=False)


@pytest.fixture(scope="module")
def run12(tmp_path_factory):
    """An uninterrupted 12-step run that the resumed 12-step runs must reproduce."""
    out = tmp_path_factory.mktemp("run12")
    return out, train(_config(12), out, progress=False)


def test_loss_decreases_and_metrics_are_written(run30):
    out, _ = run30
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(2, 31, 2))
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5
    assert "val_bits_per_byte_code" in rows[2] and "val_bits_per_byte_prose" in rows[-1]
    assert all(r["tokens_per_second"] > 0 for r in rows)


def test_resume_reaches_the_uninterrupted_parameters(run12, tmp_path):
    _, straight = run12
    first = train(_config(12), tmp_path / "resumed", progress=False, stop_after=6)  # checkpoint at 4, stops at 6
    assert not np.allclose(jax.tree.leaves(first.params)[0], jax.tree.leaves(straight.params)[0])
    resumed = train(_config(12), tmp_path / "resumed", progress=False)
    _assert_same_params(resumed.params, straight.params)
    steps = [json.loads(line)["step"] for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)), "metrics after the checkpoint must not be duplicated"


def test_a_run_dir_refuses_a_different_config(run12):
    out, _ = run12  # the check comes before anything is written: the fixture's run is untouched
    with pytest.raises(ValueError, match="holds a run with a different config"):
        train(_config(5), out, progress=False)


def test_kill_9_during_training_then_resume(run30, tmp_path):
    """A real SIGKILL mid-run: the restarted command ends where an uninterrupted run (run30) does."""
    config = _config(30)
    config_path = tmp_path / "tiny.yaml"
    dump_config(config, config_path)
    run_dir = tmp_path / "killed"
    command = [sys.executable, "-m", "specjax.cli", "train", "--config", str(config_path), "--out", str(run_dir)]
    kill_after_checkpoint([*command, "--no-progress"], run_dir / "checkpoints", min_step=4, total_steps=30)
    resumed = train(config, run_dir, progress=False)  # already complete: restores the final checkpoint
    _assert_same_params(resumed.params, run30[1].params)


def _checkpoint_steps(run_dir) -> list[int]:
    return sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())


def test_only_the_newest_checkpoints_are_kept_and_resume_still_works(run12, tmp_path):
    """keep_checkpoints bounds the disk a run uses (each checkpoint: params + AdamW state) and only
    says how the run is kept: a resume may change it, and reaches the uninterrupted parameters."""
    out, straight = run12
    assert _checkpoint_steps(out) == [12]  # the default keeps one: the resume point
    keep_two = load_config(TrainConfig, None, [*TINY, "steps=12", "keep_checkpoints=2"])
    train(keep_two, tmp_path / "resumed", progress=False, stop_after=6)
    assert _checkpoint_steps(tmp_path / "resumed") == [4, 6]  # every 4 steps, and where the run stopped
    resumed = train(_config(12), tmp_path / "resumed", progress=False)  # keeping one now
    _assert_same_params(resumed.params, straight.params)
    assert _checkpoint_steps(tmp_path / "resumed") == [12]
    # A run shorter than checkpoint_every saves its last step only (orbax alone also saved step 1).
    train(_config(3), tmp_path / "short", progress=False)
    assert _checkpoint_steps(tmp_path / "short") == [3]
    with pytest.raises(ValueError, match="keep_checkpoints must be >= 1"):
        load_config(TrainConfig, None, [*TINY, "keep_checkpoints=0"])
