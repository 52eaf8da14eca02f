"""`train-head` and `distill` on a ("data", "model") mesh equal one device (`mesh:`, `--mesh`).

The multi-device run is one subprocess (tests/_train_sharded_worker.py) with 8 host CPU
devices: XLA must be told how many before it starts, and this process already has one. It
trains a Medusa head, a published EAGLE-3 head and a distilled draft for a few steps on
one device, on data=8 and on data=2,model=4, and this file checks the losses, the saved
params and the layouts. Bad meshes fail before any device is needed: checked here directly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _train_sharded_worker as worker

from specjax.training.data import DataConfig
from specjax.training.datasets import DatasetConfig
from specjax.training.distill import DistillConfig, DistillDataConfig
from specjax.training.train_heads import HeadTrainConfig

WORKER = str(Path(__file__).parent / "_train_sharded_worker.py")


def _env(devices: int) -> dict:
    env = dict(os.environ)
    # Compiling the steps is most of the worker's time; XLA's CPU backend optimisations off
    # halve it (every run, the one-device reference too, compiles under the same flags).
    flags = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices} {flags}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    return env


def test_training_on_meshes_equals_one_device():
    """Losses within rtol 1e-5 of one device's at every step, saved params within the worker's
    tolerance (RTOL 1e-5, ATOL 1e-5 after 3 AdamW steps), one compile of the step per mesh,
    and the distill run resumed on (2, 4) from a data=8 checkpoint equal too."""
    done = subprocess.run([sys.executable, WORKER], env=_env(8), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    runs = [line for line in lines if "run" in line]
    assert [(r["run"], r["mesh"]) for r in runs] == [(n, m) for n in worker.RUNS for m in worker.MESHES]
    for name in worker.RUNS:
        reference, *meshes = [r for r in runs if r["run"] == name]
        assert len(reference["losses"]) == worker.STEPS and np.all(np.isfinite(reference["losses"]))
        for run in meshes:
            np.testing.assert_allclose(run["losses"], reference["losses"], rtol=1e-5, err_msg=str(run))
            assert run["param_excess"] <= 1.0, run
            assert run["step_compiles"] == 1, run  # the step's outputs keep their shardings: no recompile
    assert any(r["resumed_from"] == "data=8" for r in runs)
    splits = {line["split"]: line for line in lines if "split" in line}
    # data=8: a row per device, nothing split over a model axis of 1.
    assert splits["data=8"]["rows"] == 1 and splits["data=8"]["draft_q_proj"] == [64, 8, 8]
    # data=2,model=4: 4 rows per device; the draft's heads (and their Adam moments) split 4
    # ways as the target's, a head replicated.
    two_by_four = splits["data=2,model=4"]
    assert two_by_four["rows"] == 4
    assert two_by_four["draft_q_proj"] == two_by_four["draft_q_proj_mu"] == [64, 2, 8]
    assert two_by_four["head_q_proj"] == [64, 8, 8]


def test_a_batch_the_data_axis_does_not_divide_is_a_clear_error():
    with pytest.raises(ValueError, match=r"over data=3 devices, but the batch has 16 rows: use a batch_size divisible"):
        HeadTrainConfig(mesh="data=3")
    with pytest.raises(ValueError, match=r"over data=4 devices, but the batch has 6 rows"):
        HeadTrainConfig(data=DataConfig(seq_len=16, batch_size=6), mesh="data=4,model=2")
    with pytest.raises(ValueError, match=r"but the batch has 6 rows"):  # a dataset's batch_size is the batch
        HeadTrainConfig(dataset=DatasetConfig(path="chats.jsonl", batch_size=6), mesh="data=4")
    with pytest.raises(ValueError, match=r"over data=8 devices, but the batch has 12 rows"):
        DistillConfig(data=DistillDataConfig(batch_size=12), mesh="data=8")
    with pytest.raises(ValueError, match="data=2,model=4"):
        DistillConfig(mesh="2x4")
    # A model axis alone splits no rows; the config reads it without any device.
    assert HeadTrainConfig(mesh="model=4").mesh == "model=4"
    assert DistillConfig(data=DistillDataConfig(batch_size=12), mesh="data=4").mesh == "data=4"


def test_cli_mesh_flag(tmp_path, capsys):
    """--mesh sets `mesh` (as --set mesh=); bad meshes are one-line errors before any model loads."""
    from specjax.cli import main

    assert main(["train-head", "--mesh", "data=3", "--out", str(tmp_path / "head")]) != 0
    assert "over data=3 devices, but the batch has 16 rows" in capsys.readouterr().err
    distill = ["distill", "--mesh", "data=2,model=4", "--set", "data.batch_size=8", "--out", str(tmp_path / "d")]
    assert main(distill) != 0
    assert "needs 8 devices, but only 1 exist" in capsys.readouterr().err
