"""Run directories shared by training and distillation: config guard, checkpoints, metrics.

A run directory holds the resolved config, orbax checkpoints and a metrics JSONL. Orbax
writes each checkpoint to a temporary directory and renames it when complete, so a kill
at any moment leaves only whole checkpoints behind, and the newest one is the resume point.

Only the newest `keep_checkpoints` (a field of every training config, default 1) are kept:
each holds the params and the optimizer's state (AdamW: three times the params), hundreds of
MB for a SmolLM2-sized draft. One is enough to resume after a kill -9: orbax deletes older
steps only after the new one is committed, so a whole checkpoint is always on disk.
Checkpoints are written every `checkpoint_every` steps and at a run's last step, never
otherwise (orbax by itself also saves a manager's first step: a 3-step run left two).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import orbax.checkpoint as ocp
import yaml

from specjax.configs import dump_config, from_dict
from specjax.training.data import manifest


def open_run(out_dir: str | Path, config, config_file: str) -> Path:
    """Create `out_dir` for `config`, or check that the run already there has the same config."""
    out_dir = Path(out_dir).resolve()
    saved = out_dir / config_file
    if saved.exists():
        previous = from_dict(type(config), yaml.safe_load(saved.read_text()))
        if _computed(previous) != _computed(config):
            raise ValueError(
                f"{out_dir} holds a run with a different config ({saved}); use another --out to start a new run"
            )
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    dump_config(config, saved)
    # The corpus split depends on the interpreter's stdlib: record which one this run saw.
    (out_dir / "corpus.json").write_text(json.dumps(manifest(), indent=2))
    return out_dir


# Fields of a training config that say how a run is kept, not what it computes.
_NOT_COMPUTED = {"mesh": None, "keep_checkpoints": 1}


def _computed(config):
    """`config` less where it runs and what it keeps: a run resumes on another mesh (its
    checkpoint is re-placed) or keeping another number of checkpoints."""
    return dataclasses.replace(config, **{k: v for k, v in _NOT_COMPUTED.items() if hasattr(config, k)})


class Checkpoints:
    """The newest `keep` checkpoints of a run's state pytree, saved every `every` steps (module docstring)."""

    def __init__(self, directory: Path, every: int, keep: int = 1):
        if keep < 1:
            raise ValueError(f"keep_checkpoints must be >= 1 (the resume point), got {keep}")
        self.every = every
        self.manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep))

    @property
    def latest_step(self) -> int:
        return self.manager.latest_step() or 0

    def restore(self, template):
        """The newest checkpoint, shaped like `template` (a pytree of arrays)."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        return self.manager.restore(self.latest_step, args=ocp.args.StandardRestore(abstract))

    def save(self, step: int, state, force: bool = False) -> None:
        """Save at multiples of `every`, or when forced (a run's last step); else nothing."""
        if (force or step % self.every == 0) and step != self.manager.latest_step():
            self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


class Metrics:
    """Append-only JSONL that forgets rows past the checkpoint a run resumes from."""

    def __init__(self, path: Path, resume_step: int):
        self.path = path
        if path.exists():
            kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= resume_step]
            path.write_text("".join(line + "\n" for line in kept))

    def write(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def rows(self) -> list[dict]:
        return [json.loads(line) for line in self.path.read_text().splitlines()] if self.path.exists() else []


def resume_or_start(out_dir: Path, params, optimizer, checkpoint_every: int, keep_checkpoints: int = 1):
    """(params, opt_state, start_step, checkpoints, metrics) of a run: fresh from `params`, or
    restored from the newest checkpoint in `out_dir` if there is one."""
    state = {"params": params, "opt_state": optimizer.init(params)}
    checkpoints = Checkpoints(out_dir / "checkpoints", checkpoint_every, keep_checkpoints)
    start = checkpoints.latest_step
    if start:
        state = checkpoints.restore(state)
    return state["params"], state["opt_state"], start, checkpoints, Metrics(out_dir / "metrics.jsonl", start)
