"""Finished parts of a bench run, kept on disk so a killed or failed run resumes.

A long experiment (E12 on SmolLM2 runs for an hour and more) is a sequence of parts that
each stand alone: a timing group of drafters beside its own plain baseline, a throughput
bucket. `FinishedParts.get_or_run(key, run, *args)` returns the rows a part left in
`<out>/finished_parts.json`, or runs it and writes its rows there before going on. The
file is keyed by a fingerprint of everything that decides the numbers (the bench config,
the models' descriptions and the target's and draft's weights): a run with any other
setting starts afresh and overwrites it. run_bench deletes the file once results.json
holds the whole run.

A resumed part was timed by an earlier process, perhaps under another load: the
experiment records which parts it took from the file (`resumed_parts`), and its rows
keep their own plain baselines, so ratios never mix processes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import jax

from specjax.io.model import params_sha256

FILE = "finished_parts.json"


def run_fingerprint(config: dict, models: dict, weights: list) -> str:
    """sha256 over the config and model descriptions (canonical JSON) and each weights tree's
    params_sha256 (values rounded to bfloat16; 0.3 s for 135M parameters)."""
    digest = hashlib.sha256(json.dumps({"config": config, "models": models}, sort_keys=True, default=str).encode())
    for tree in weights:
        digest.update(params_sha256(tree).encode() if jax.tree.leaves(tree) else b"none")
    return digest.hexdigest()


class FinishedParts:
    """Parts of one run by key; `path=None` keeps nothing (the Python API without a results directory).

    `fingerprint` is called once, at the first part: a bench whose experiments keep no parts
    pays nothing at start-up for hashing the weights."""

    def __init__(self, path: Path | None = None, fingerprint: Callable[[], str] = str):
        self.path, self._fingerprint = path, fingerprint
        self.resumed: list[str] = []
        self._parts: dict[str, list] | None = None  # read at the first part

    def _stored(self) -> dict[str, list]:
        if self._parts is None:
            self.fingerprint = self._fingerprint()
            self._parts = {}
            if self.path is not None and self.path.exists():  # written atomically: whole or absent
                stored = json.loads(self.path.read_text(encoding="utf-8"))
                if stored.get("fingerprint") == self.fingerprint:
                    self._parts = stored.get("parts", {})
        return self._parts

    def get_or_run(self, key: str, run: Callable[..., list], *args) -> list:
        """The rows part `key` left on disk, else `run(*args)`'s rows, written down before returning."""
        parts = self._stored()
        if key in parts:
            self.resumed.append(key)
            return parts[key]
        # Through JSON either way, so a fresh part and a resumed one return the same types.
        rows = parts[key] = json.loads(json.dumps(run(*args)))
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"fingerprint": self.fingerprint, "parts": parts}), encoding="utf-8")
            tmp.replace(self.path)  # atomic: a kill leaves the old file or the new one
        return rows

    def discard(self) -> None:
        """The run is written whole: its parts are no longer needed."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)
