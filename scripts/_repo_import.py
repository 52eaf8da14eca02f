"""`import specjax` from this repository without an install (GPU scripts run on bare machines).

The package's search path also holds the repository root, so `specjax.models` resolves to
ROOT/models exactly as pyproject's package-dir maps it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def import_specjax_from_this_repository() -> None:
    if "specjax" in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(
        "specjax", ROOT / "specjax" / "__init__.py", submodule_search_locations=[str(ROOT / "specjax"), str(ROOT)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["specjax"] = module
    spec.loader.exec_module(module)
