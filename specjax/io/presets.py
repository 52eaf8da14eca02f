"""Named models that need no files: random-weight pairs for timing and smoke tests."""

from __future__ import annotations

from pathlib import Path

from specjax.io.embedded import embedded_names, embedded_path
from specjax.io.hf import load_model
from specjax.io.model import Model, init_model
from specjax.io.tokenizer import ByteTokenizer
from specjax.models import ModelConfig

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


def resolve_model(name: str, seed: int = 0) -> Model:
    """A model by random-preset name, embedded name, or local Hugging Face directory."""
    if name in RANDOM_PRESETS:
        model = init_model(RANDOM_PRESETS[name], seed=seed)
        return Model(model.config, model.params, tokenizer=ByteTokenizer())
    if embedded_path(name) is None and not Path(name).is_dir():
        known = ", ".join([*sorted(RANDOM_PRESETS), *embedded_names()])
        raise ValueError(f"unknown model {name!r}: not a directory, and not one of: {known}")
    return load_model(name)
