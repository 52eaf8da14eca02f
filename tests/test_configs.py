"""YAML configs: typed, strict about unknown keys, overridable from the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from specjax.configs import apply_overrides, load_config
from specjax.training.train import TrainConfig


def test_load_with_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  hidden_size: 32\n  num_attention_heads: 2\nsteps: 7\n")
    config = load_config(TrainConfig, path, ["optim.learning_rate=0.01", "data.seq_len=64", "model.hidden_size=48"])
    assert config.steps == 7 and config.model.hidden_size == 48 and config.model.num_attention_heads == 2
    assert config.optim.learning_rate == 0.01 and config.data.seq_len == 64
    assert isinstance(config.optim.learning_rate, float)


def test_unknown_key_names_its_path(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  hiden_size: 32\n")
    with pytest.raises(ValueError, match=r"unknown config key model\.hiden_size"):
        load_config(TrainConfig, path)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("steps=ten", "steps: expected an integer"),
        ("model.tie_word_embeddings=3", "model.tie_word_embeddings: expected true or false"),
        ("data", "must look like key.path=value"),
        ("steps=0", "steps must be >= 1"),
    ],
)
def test_bad_overrides(override, message):
    with pytest.raises(ValueError, match=message):
        load_config(TrainConfig, None, [override])


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="config file not found"):
        load_config(TrainConfig, "no/such.yaml")


def test_shipped_configs_load():
    for name in ("train_target", "train_draft"):
        config = load_config(TrainConfig, Path(__file__).parents[1] / "configs" / f"{name}.yaml")
        assert config.model.vocab_size == 259


def test_apply_overrides_does_not_mutate():
    data = {"a": {"b": 1}}
    assert apply_overrides(data, ["a.b=2"]) == {"a": {"b": 2}}
    assert data == {"a": {"b": 1}}
