"""Measured round costs kept on disk, so adaptive speculation measures once per machine and shape.

Measuring (engine/round_costs.py) takes about a minute for the embedded pair at K <= 8, and
costs measured afresh in every process make the policy's schedule differ from run to run.
A loop iteration's time depends on shapes, layouts and the machine, not on the weights'
values, so one file per key serves every later process: the device and software, both
models' configurations and weight layouts (dtype, shape, sharding), the batch bucket, the
cache length and config, the sampling settings (temperature, top-k, top-p, min-p: top-p
sorts the vocabulary every round) and the candidates. Files live in
`cache_dir()/round_costs/<sha256 of the key>.json` and hold the key in readable form, the
costs, when they were measured and how long that took. They are written whole or not at
all (a temporary file renamed over the old one), and one that cannot be read is measured
again, with a warning.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import jax
import jaxlib

from specjax.core.sampling import SamplingConfig
from specjax.engine.clock import cpu_count, cpu_model
from specjax.user_cache import cache_dir
from specjax.version import __version__

FORMAT = 2  # bump when the measurement's method changes, so older files stop matching (2: the whole SamplingConfig)


def _layout(weights) -> str:
    """A digest of every leaf's shape, dtype and sharding: what the timing depends on besides configs."""

    def leaf(x):
        sharding = getattr(x, "sharding", None)
        spec = getattr(sharding, "spec", None)
        mesh = getattr(sharding, "mesh", None)
        where = (dict(mesh.shape), str(spec)) if mesh is not None else type(sharding).__name__
        return (tuple(x.shape), str(x.dtype), where)

    text = repr([leaf(x) for x in jax.tree.leaves(weights)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cost_key(target, drafter, batch: int, config, context: int, sampling: SamplingConfig, cache) -> dict:
    """What the costs of `measure_round_costs(target, drafter, batch, config, context, sampling, ...)` depend on."""
    backend = jax.default_backend()
    return {
        "format": FORMAT,
        "backend": backend,
        "device_kind": jax.devices()[0].device_kind,
        "device_count": jax.device_count(),
        "process_count": jax.process_count(),
        # XLA:CPU reports every CPU as "cpu": its model and the cores it may use tell them apart.
        "cpu": cpu_model() if backend == "cpu" else None,
        "cpu_count": cpu_count() if backend == "cpu" else None,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "specjax": __version__,
        "target": repr(target.config),
        "target_weights": _layout(target.params),
        "drafter": repr(drafter.without_weights()),
        "drafter_weights": _layout(drafter.weights()),
        "batch": int(batch),
        "context": int(context),
        "sampling": dataclasses.asdict(sampling),
        "cache": repr(cache),
        "candidates": [str(label) for label in config.labels],
        "trees": [repr(tree) for tree in config.trees] if config.trees else None,
    }


def cost_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return cache_dir() / "round_costs" / f"{digest}.json"


def _read(path: Path, key: dict, labels) -> dict | None:
    """The file's record, or None when there is none; a file that does not hold costs for
    `key` (corrupt, truncated by hand, another format) is ignored with a warning."""
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        if record["key"] != key:
            raise ValueError("its key differs from this run's")
        costs = {label: float(record["costs_seconds"][str(label)]) for label in labels}
        if not all(c > 0 for c in costs.values()):
            raise ValueError(f"non-positive costs {costs}")
        return {**record, "costs": costs}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        warnings.warn(f"ignoring the unreadable round-cost cache {path} ({e}); measuring again", stacklevel=4)
        return None


def _write(path: Path, record: dict) -> None:
    """Write whole or not at all: a killed process leaves the old file or none, never half of one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(record, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache directory's files
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:  # a read-only home is no reason to fail a generation
        warnings.warn(f"could not write the round-cost cache {path} ({e})", stacklevel=4)


def cached_costs(key: dict, labels, measure: Callable[[], dict], remeasure: bool = False) -> tuple[dict, dict]:
    """({label: seconds}, where they came from): the file for `key` if there is a readable one
    and not `remeasure`, else `measure()`, then written for the next process.

    The second item: source ("cache" or "measured"), seconds (spent here, reading or
    measuring), path, measured_at (UTC, ISO 8601) and measurement_seconds (what the
    measurement took, in whichever process made it)."""
    path, start = cost_path(key), time.perf_counter()
    record = None if remeasure else _read(path, key, labels)
    if record is not None:
        source = "cache"
    else:
        costs = measure()
        record = {
            "key": key,
            "costs_seconds": {str(label): costs[label] for label in labels},
            "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "measurement_seconds": time.perf_counter() - start,
            "costs": costs,
        }
        _write(path, {k: v for k, v in record.items() if k != "costs"})
        source = "measured"
    info = {
        "source": source,
        "seconds": time.perf_counter() - start,
        "path": str(path),
        "measured_at": record.get("measured_at"),
        "measurement_seconds": record.get("measurement_seconds"),
    }
    return record["costs"], info
