"""Build step of specjax-smollm2: copy the repository's models/pretrained/smollm2-* folders,
in place where they are, into the package's pretrained/ folder in the build tree, so the
wheel carries them while git keeps one copy. pip builds a local directory in place, so
models/ is found two levels up; a build from anywhere else (an sdist) has no models to
copy and stops with an error saying so."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

MODELS = Path(__file__).resolve().parent.parent.parent / "models" / "pretrained"
PATTERN = "smollm2-*"  # pyproject.toml at the repository root excludes the same folders from specjax's wheel


def model_folders() -> list[Path]:
    folders = sorted(p for p in MODELS.glob(PATTERN) if p.is_dir())
    if not folders:
        raise SystemExit(
            f"specjax-smollm2: no {PATTERN} folders in {MODELS}; build this package from a checkout of the "
            "specjax repository (pip install ./companion/smollm2 at its root)"
        )
    return folders


class BuildPy(build_py):
    def run(self):
        super().run()
        out = Path(self.build_lib) / "specjax_smollm2" / "pretrained"
        shutil.rmtree(out, ignore_errors=True)  # build/lib is reused between builds: no stale folders
        for folder in model_folders():
            shutil.copytree(folder, out / folder.name)


setup(cmdclass={"build_py": BuildPy})
