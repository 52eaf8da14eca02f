"""`as_drafter`: a `Model` where a drafter is expected becomes a `DraftModel`.

Its own module so that composing drafters (fallback.py) and the package's entry points
(`specjax.drafters.as_drafter`, the engine) share one conversion without an import cycle.
"""

from __future__ import annotations

from specjax.drafters.base import Drafter
from specjax.drafters.draft_model import DraftModel
from specjax.io.model import Model


def as_drafter(draft: Model | Drafter) -> Drafter:
    """A `Model` becomes a `DraftModel`; a drafter is returned as it is."""
    if isinstance(draft, Drafter):
        return draft
    if isinstance(draft, Model):
        return DraftModel(draft)
    raise TypeError(
        f"draft must be a specjax Model or a Drafter (e.g. specjax.drafters.PromptLookup()), got {type(draft)!r}"
    )
