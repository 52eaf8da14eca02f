"""The models shipped inside the package (models/pretrained/, HF-format directories)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

# The embedded pair ships inside the models package (specjax.models) as HF-format directories.
EMBEDDED_DIR = Path(str(files("specjax.models"))) / "pretrained"


def embedded_names() -> list[str]:
    """Names of the model directories shipped under specjax/models/pretrained/."""
    if not EMBEDDED_DIR.is_dir():
        return []
    return sorted(p.name for p in EMBEDDED_DIR.iterdir() if (p / "config.json").is_file())


def embedded_heads() -> list[str]:
    """Names of the trained draft heads shipped under specjax/models/pretrained/ (drafter.json)."""
    if not EMBEDDED_DIR.is_dir():
        return []
    return sorted(p.name for p in EMBEDDED_DIR.iterdir() if (p / "drafter.json").is_file())


def embedded_path(name: str) -> Path | None:
    """Directory of the embedded model or head `name`, or None if there is no such thing."""
    return EMBEDDED_DIR / name if name in embedded_names() + embedded_heads() else None


DEFAULT_TARGET = "stdlib-target"
DEFAULT_DRAFT = "stdlib-draft"


def default_pair() -> tuple[str, str]:
    """The embedded trained pair when it is installed, else the random-weight pair."""
    if embedded_path(DEFAULT_TARGET) and embedded_path(DEFAULT_DRAFT):
        return DEFAULT_TARGET, DEFAULT_DRAFT
    return "random-target", "random-draft"
