"""Named models that need no files: random-weight pairs for timing and smoke tests."""

from __future__ import annotations

from pathlib import Path

import specjax.models
from specjax.model import Model, init_model
from specjax.models import ModelConfig
from specjax.tokenizer import ByteTokenizer

# Random weights accept little (acceptance depends on training), but their cost is real:
# the target is ~20x the draft. Untied embeddings: with tied random embeddings the argmax
# is the input token itself, and any two such models "agree" on repeating it.
RANDOM_PRESETS: dict[str, ModelConfig] = {
    "random-target": ModelConfig(
        vocab_size=259,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    ),
    "random-draft": ModelConfig(
        vocab_size=259,
        hidden_size=96,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    ),
}


# The embedded pair ships inside the models package as HF-format directories.
EMBEDDED_DIR = Path(specjax.models.__file__).resolve().parent / "pretrained"


def embedded_names() -> list[str]:
    """Names of the model directories shipped under specjax/models/pretrained/."""
    if not EMBEDDED_DIR.is_dir():
        return []
    return sorted(p.name for p in EMBEDDED_DIR.iterdir() if (p / "config.json").is_file())


def embedded_path(name: str) -> Path | None:
    """Directory of the embedded model `name`, or None if there is no such model."""
    return EMBEDDED_DIR / name if name in embedded_names() else None


def resolve_model(name: str, seed: int = 0) -> Model:
    """A model by preset name. Raises ValueError listing what exists."""
    if name in RANDOM_PRESETS:
        model = init_model(RANDOM_PRESETS[name], seed=seed)
        return Model(model.config, model.params, tokenizer=ByteTokenizer())
    raise ValueError(f"unknown model {name!r}; available: {', '.join(sorted(RANDOM_PRESETS))}")
