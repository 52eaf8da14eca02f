"""Package discovery, which pyproject.toml cannot express alone: every package under
specjax/ is found, and models/ (top level in the repository, so it imports nothing from
specjax) installs as specjax.models with its subpackages.

build_py starts the models' pretrained/ folder afresh in the build tree: setuptools reuses
build/lib between builds, so a folder copied by an earlier build (or one since moved to a
companion wheel by pyproject.toml's exclude-package-data) would otherwise ship again."""

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    def run(self):
        shutil.rmtree(Path(self.build_lib) / "specjax" / "models" / "pretrained", ignore_errors=True)
        super().run()


setup(
    packages=[
        *find_packages(include=["specjax", "specjax.*"]),
        "specjax.models",
        *(f"specjax.models.{name}" for name in find_packages("models")),
    ],
    cmdclass={"build_py": BuildPy},
)
