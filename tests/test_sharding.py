"""Sharded generation on a ("data", "model") mesh equals unsharded generation.

The multi-device checks run in subprocesses (tests/_sharded_worker.py): XLA must be told
how many host CPU devices to create before it starts, and this process already has one.
  - one process with 8 devices runs three meshes in turn (the worker's MESHES): tokens, logits, shard shapes of
    params and caches, no recompiles, slice loading;
  - two processes with 4 devices each (gloo CPU collectives) form one 8-device mesh and
    must print the tokens this process computes unsharded.
Bad meshes are checked here directly: they fail before any device is needed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import pytest

import specjax
from specjax.parallel import make_mesh, parse_mesh, plan

sys.path.insert(0, str(Path(__file__).parent))
import _sharded_worker as worker

WORKER = str(Path(__file__).parent / "_sharded_worker.py")


def _env(devices: int) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def unsharded():
    """Plain greedy tokens on this process's one device (the worker checks speculative == plain)."""
    return specjax.generate(
        worker.scaled(worker.TARGET, 0), worker.PROMPTS, specjax.GenerationConfig(max_new_tokens=worker.NEW)
    ).tokens


def test_every_mesh_matches_unsharded(unsharded):
    """(1,8), (2,4), (8,1): tokens, logits, layouts, no recompiles, slice loading; the
    parallel drafters on (2,4)."""
    done = subprocess.run([sys.executable, WORKER, "meshes"], env=_env(8), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = _json_lines(done.stdout)
    meshes = [tuple(line["mesh"]) for line in lines if "mesh" in line]
    assert meshes == list(worker.MESHES)
    assert all(line["ok"] and line["logit_err"] <= 1e-5 and line["recompiles"] == 0 for line in lines if "mesh" in line)
    assert {line["draft"] for line in lines if "mesh" in line} == {"sharded", "replicated"}
    assert any(line.get("loading") == "ok" for line in lines)
    assert any(line.get("parallel_drafters") == ["block_head", "parallel_draft"] for line in lines)
    # The 8-device process computed the same unsharded reference as this 1-device one.
    assert lines[-1]["tokens"] == unsharded and lines[-1]["spec_tokens"] == unsharded


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_agree_with_one(unsharded):
    """Two localhost processes x 4 CPU devices, one (2, 4) mesh via jax.distributed + gloo."""
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, "distributed", str(i), port],
            env=_env(4),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=400)
            assert p.returncode == 0, err[-4000:]
            outs.append(_json_lines(out)[-1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [o["process"] for o in outs] == [0, 1]
    for o in outs:
        assert o["tokens"] == unsharded


def test_mesh_needing_more_devices_than_exist_names_the_numbers():
    with pytest.raises(ValueError, match=r"data=2 x model=4 needs 8 devices, but only 1 exist"):
        make_mesh(data=2, model=4)
    with pytest.raises(ValueError, match="must be an integer >= 1, got 0"):
        make_mesh(data=0)
    with pytest.raises(ValueError, match="data=2,model=4"):
        parse_mesh("data=2,experts=4")
    assert parse_mesh("data=2, model=4") == {"data": 2, "model": 4}


def test_model_the_mesh_cannot_split_names_the_numbers():
    config = specjax.ModelConfig(num_attention_heads=4, num_key_value_heads=2, intermediate_size=176)
    with pytest.raises(ValueError, match=r"num_attention_heads divisible by 8, but this model has 4 heads"):
        plan(config, 8)
    with pytest.raises(ValueError, match=r"cannot split 3 kv heads"):
        plan(config.replace(num_attention_heads=6, num_key_value_heads=3, head_dim=16), 2)
    with pytest.raises(ValueError, match=r"intermediate_size divisible by 4, got 174"):
        plan(config.replace(intermediate_size=174), 4)
    p = plan(config, 4)  # 2 kv heads on 4 devices: each stored twice
    assert (p.kv_repeat, p.shard_vocab) == (2, False)  # vocab 259 is not divisible by 4: replicated


def test_e10_config_loads_and_bad_scaling_sections_fail():
    from specjax.bench import BenchConfig
    from specjax.bench.experiments.e10_scaling import Scaling
    from specjax.configs import load_config

    config = load_config(BenchConfig, Path(__file__).parents[1] / "configs" / "e10_scaling.yaml")
    assert config.experiments == ["scaling"] and "data=2,model=4" in config.scaling.meshes
    with pytest.raises(ValueError, match="data=2,model=4"):
        Scaling(meshes=["2x4"])
    with pytest.raises(ValueError, match="draft_layouts"):
        Scaling(draft_layouts=["pipelined"])
    with pytest.raises(ValueError, match="data=2,model=4"):
        BenchConfig(mesh="model:4")


def test_bench_mesh_places_the_pair():
    """A bench config's `mesh:` puts the target (and a draft model) on the mesh for every experiment."""
    from jax.sharding import NamedSharding

    from specjax.bench import BenchConfig
    from specjax.bench.context import BenchContext
    from specjax.engine.timed_loops import draft_model_of

    ctx = BenchContext(BenchConfig(experiments=["waste"], mesh={"data": 1, "model": 1}), progress=False)
    for model in (ctx.target, draft_model_of(ctx.draft)):
        sharding = model.params["layers"][0]["attn"]["q_proj"].sharding
        assert isinstance(sharding, NamedSharding) and sharding.mesh.axis_names == ("data", "model")


def test_cli_generate_on_a_mesh(capsys):
    """`specjax generate --mesh`: the flag parses, shards the model, and a bad mesh is a clear error."""
    from specjax.cli import main

    common = ["generate", "--prompt", "def f(", "--max-new-tokens", "4", "--plain", "--json"]
    assert main([*common, "--mesh", "data=1,model=1"]) == 0
    assert json.loads(capsys.readouterr().out)["timing"]["mesh"] == "data=1,model=1"
    assert main([*common, "--mesh", "data=2,model=4"]) != 0
    assert "needs 8 devices, but only 1 exist" in capsys.readouterr().err


def test_tp_cost_model_counts_what_the_layout_implies():
    """Per-device bytes follow the layout; all-reduces are 2 per layer (+1 vocab-split embedding)."""
    import math

    from specjax.parallel.cost import per_device_bytes, predict_tp_speculative, tp_allreduce_bytes

    config = worker.TARGET  # vocab 64: the embedding is vocab-split on 8 devices
    model = specjax.init_model(config, 0)
    assert per_device_bytes(config, 1, 1, 8, 64)["weight_bytes"] == 4 * model.num_parameters
    sharded = per_device_bytes(config, 2, 8, 8, 64)
    replicated = sum(4 * math.prod(x.shape) for x in jax.tree.leaves(model.params) if x.ndim == 1)
    # kv heads 2 -> 8 on 8 devices: k/v kernels grow 4x before the 8-way split.
    kv_kernels = 2 * config.num_hidden_layers * 4 * 64 * 2 * 8
    assert sharded["weight_bytes"] == replicated + (4 * model.num_parameters - replicated + 3 * kv_kernels) // 8
    assert sharded["kv_cache_bytes"] == 2 * 2 * 4 * 64 * 1 * 8 * 4  # layers, rows/data, slots, 1 head, d, fp32
    comm = tp_allreduce_bytes(config, 4, 5, 8)
    assert comm["allreduces"] == 2 * 2 + 1 and comm["bytes_per_allreduce"] == 4 * 5 * 64 * 4
    assert comm["ring_bytes_per_device"] == 2 * 7 / 8 * comm["payload_bytes"]
    assert tp_allreduce_bytes(config, 4, 5, 1)["payload_bytes"] == 0
    fast, slow = (
        predict_tp_speculative(config, worker.DRAFT, 8, 8, 4, 64, 3.0, 1e12, link, 1e-6, "sharded")
        for link in (1e12, 1e9)
    )
    assert 0 < slow["tp_efficiency"] < fast["tp_efficiency"] <= 1
