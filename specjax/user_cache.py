"""The directory specjax keeps files in between processes, and writing a directory into it whole.

What lives there: measured round costs (engine/cost_cache.py, under round_costs/), derived
data: deleting the directory loses nothing but the time to measure them again.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    """$SPECJAX_CACHE_DIR, else $XDG_CACHE_HOME/specjax, else ~/.cache/specjax."""
    if os.environ.get("SPECJAX_CACHE_DIR"):
        return Path(os.environ["SPECJAX_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specjax"


def write_dir(path: Path, fill: Callable[[Path], None], what: str) -> bool:
    """Make directory `path` whole or not at all: `fill(tmp)` writes into a temporary sibling,
    which is then renamed to `path`, so a killed process leaves no half-written directory.
    False (with a warning) when it cannot be written: a read-only home is no reason to fail."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
        try:
            fill(tmp)
            os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide a shared cache directory's entries
            os.replace(tmp, path)
        except OSError:
            if path.is_dir():  # another process renamed its copy first: keep theirs
                shutil.rmtree(tmp, ignore_errors=True)
                return True
            raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return True
    except OSError as e:
        warnings.warn(f"could not write the {what} cache {path} ({e})", stacklevel=3)
        return False
