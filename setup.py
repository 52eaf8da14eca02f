"""Package discovery, which pyproject.toml cannot express alone: every package under
specjax/ is found, and models/ (top level in the repository, so it imports nothing from
specjax) installs as specjax.models with its subpackages."""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["specjax", "specjax.*"]),
        "specjax.models",
        *(f"specjax.models.{name}" for name in find_packages("models")),
    ],
)
