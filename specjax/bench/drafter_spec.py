"""A bench config's `draft:` (and E8's and E11's drafters): one `specjax.SpeculativeConfig`.

    draft: stdlib-draft                                    a model (embedded, preset, HF directory)
    draft: stdlib-eagle                                    a trained head (its files say so)
    draft: stdlib-pard-draft                               a PARD draft (its config records the mask)
    draft: {method: ngram, prompt_lookup_max: 3}           any SpeculativeConfig mapping
    draft: {method: layer_skip, layers: 2}
    draft: {method: fallback, first: {method: ngram}, then: stdlib-draft}
    draft: {hidden_size: 64, num_hidden_layers: 2, ...}    a draft model of this shape, random weights

The same parser (`SpeculativeConfig.parse`) reads the API's and the CLI's drafters, so a
key the chosen method does not take fails here too, with its dotted path.
"""

from __future__ import annotations

from specjax.config import SpeculativeConfig
from specjax.configs import from_dict
from specjax.models import ModelConfig


class Raw:
    """Type hint of the last option of a multi-shape field: a value that fits no shape arrives
    unchanged, so the field's owner can re-parse it with the shape it was meant to have and
    report that shape's error (configs.from_dict alone reports the *first* shape's error)."""


def parse_draft(value, where: str) -> SpeculativeConfig:
    """`value` as a SpeculativeConfig, or a ValueError that names `where` and what is wrong.
    A mapping is a drafter spec unless it holds none of SpeculativeConfig's keys (then it is
    a ModelConfig: a draft model's shape)."""
    if isinstance(value, dict) and not ({"method", "kind", "model", "path"} & set(value)):
        try:
            return SpeculativeConfig(model=from_dict(ModelConfig, value, where))
        except ValueError as error:
            message = str(error)
            raise ValueError(message if where in message else f"{where}: {message}") from None
    try:
        return SpeculativeConfig.parse(value, where)
    except ValueError as error:
        message = str(error)
        raise ValueError(message if message.startswith(f"{where}") else f"{where}: {message}") from None
