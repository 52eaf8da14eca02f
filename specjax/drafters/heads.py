"""Saving and loading trained draft heads (Medusa and EAGLE-style heads).

A head directory holds `drafter.json` (its kind, shape, and the target it was trained
for) and `model.safetensors` (the head's own weights only: the target's embedding and LM
head are read from the target at run time, never stored twice).
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import load_file, save_file

from specjax.drafters.base import Drafter
from specjax.drafters.eagle import Eagle, head_config
from specjax.drafters.medusa import Medusa
from specjax.io.embedded import embedded_path
from specjax.models import ModelConfig

FORMAT = "specjax-drafter-1"
_CONFIG = "drafter.json"


def is_head_directory(path) -> bool:
    return (Path(path) / _CONFIG).is_file()


def _flatten(params: dict, prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = np.asarray(jax.device_get(value))
    return out


def _unflatten(flat: dict[str, np.ndarray]) -> dict:
    out: dict = {}
    for name, value in flat.items():
        node = out
        *parents, leaf = name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def save_drafter(drafter: Drafter, path, target_name: str | None = None, target: ModelConfig | None = None) -> Path:
    """Write a trained head to `path` (a directory), naming the target it was trained for."""
    if not isinstance(drafter, Medusa | Eagle) or drafter.params is None:
        raise ValueError(f"save_drafter saves trained heads (Medusa or Eagle with weights), got {drafter!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if isinstance(drafter, Medusa):
        shape = {"num_heads": drafter.num_heads, "hidden_size": drafter.hidden_size, "vocab_size": drafter.vocab_size}
    else:
        c = drafter.config
        shape = {
            "hidden_size": c.hidden_size,
            "vocab_size": c.vocab_size,
            "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads,
            "intermediate_size": c.intermediate_size,
            "feature_layers": list(drafter.feature_layers),  # [] = the final-norm feature
        }
    config = {
        "format": FORMAT,
        "kind": drafter.name,
        **shape,
        "target": {
            "name": target_name,
            **({} if target is None else {"hidden_size": target.hidden_size, "vocab_size": target.vocab_size}),
        },
    }
    (path / _CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    save_file(_flatten(drafter.params), str(path / "model.safetensors"))
    return path


def load_drafter(path, target=None) -> Drafter:
    """A head saved by `save_drafter` (a directory, or the name of an embedded head such as
    stdlib-medusa), checked against `target` (a Model or ModelConfig) if given.

    A head trained for another target (another hidden size or vocabulary) is a clear error.
    """
    path = (embedded_path(path) if isinstance(path, str) else None) or Path(path)
    if not is_head_directory(path):
        raise ValueError(f"{path} is not a specjax head directory (no {_CONFIG})")
    config = json.loads((path / _CONFIG).read_text())
    if config.get("format") != FORMAT:
        raise ValueError(f"{path / _CONFIG} has format {config.get('format')!r}, expected {FORMAT!r}")
    params = jax.tree.map(jax.numpy.asarray, _unflatten(load_file(str(path / "model.safetensors"))))
    target_config = None if target is None else getattr(target, "config", target)
    trained_for = config["target"].get("name") or "another target"
    if config["kind"] == "medusa":
        drafter = Medusa(params=params, vocab_size=int(config["vocab_size"]))
    elif config["kind"] == "eagle":
        if target_config is None:
            raise ValueError(f"an EAGLE head ({path}) is built around its target: pass the target to load_drafter")
        if (target_config.hidden_size, target_config.vocab_size) != (config["hidden_size"], config["vocab_size"]):
            raise ValueError(
                f"head {path} was trained for {trained_for}: it reads hidden size {config['hidden_size']} and "
                f"vocabulary {config['vocab_size']}, the target has {target_config.hidden_size} and "
                f"{target_config.vocab_size}"
            )
        layer = head_config(
            target_config, config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]
        )
        # Heads saved before multi-layer features have no "feature_layers": the final-norm feature.
        drafter = Eagle(params=params, config=layer, feature_layers=tuple(config.get("feature_layers", ())))
    else:
        raise ValueError(f"unknown head kind {config['kind']!r} in {path}")
    if target_config is not None:
        try:
            drafter.check(target_config, 1)
        except ValueError as e:
            raise ValueError(f"head {path} was trained for {trained_for}: {e}") from e
    return drafter
