"""A griffe extension for the API reference (mkdocs.yml loads it; it is not a page).

pyproject.toml installs the repository's models/ as `specjax.models`
([tool.setuptools.package-dir], and setup.py), so `specjax.ModelConfig` is an alias of
`specjax.models.ModelConfig`. Griffe reads the source tree, where specjax/ has no models/
folder, and could not resolve it. This loads that folder and attaches it where the wheel
puts it.
"""

from __future__ import annotations

import griffe

# The same mapping as [tool.setuptools.package-dir] in pyproject.toml.
PACKAGE_DIRS = {"specjax.models": "models"}


class PackageDir(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        for name, folder in PACKAGE_DIRS.items():
            parent, _, child = name.rpartition(".")
            if parent != pkg.name or child in pkg.members:
                continue
            # Loaded as the top-level package `folder` (its relative imports resolve there),
            # then made a member of `pkg`, so its objects' paths read specjax.models....
            pkg.set_member(child, loader.load(folder, find_stubs_package=False))
