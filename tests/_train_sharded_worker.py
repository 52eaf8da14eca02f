"""Training on a mesh against one device, on 8 host CPU devices; run by tests/test_train_sharded.py.

Needs XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax starts (so it runs in
its own process). For each trainer (train-head Medusa, train-head EAGLE-3 as published,
distill) it runs STEPS steps on one device, then with mesh data=8 and data=2,model=4, and
prints one JSON line per run: the per-step losses, how far the saved params are from the
one-device run's (in units of the tolerance), and how many times the step compiled. The
distill run on (2, 4) resumes from a checkpoint written on data=8 (restored, re-placed).
A last line gives the shard shapes MeshSteps gives a batch and a draft's params.

Held-out acceptance is stubbed: it is generation, whose sharded runs tests/test_sharding.py
compares with unsharded ones, and its compiles would be most of this file's time.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import jax
import numpy as np

import specjax
from specjax.configs import load_config
from specjax.io.tokenizer import ByteTokenizer
from specjax.training import distill, train_heads
from specjax.training.sharded_steps import MeshSteps

# Parameters after STEPS AdamW steps: |mesh - one device| <= ATOL + RTOL * |one device|. Adam
# divides each gradient by its own running size, so a weight whose gradient nearly cancels
# moves by an amount float rounding decides: ATOL is 1e-3 of the learning rate (0.01).
RTOL, ATOL = 1e-5, 1e-5
STEPS = 3
# 8 query heads, 2 kv heads (repeated to 4 on model=4), a vocabulary of 264 (split over
# "model"; the byte tokenizer uses 259 of it), peaked by scaling (tests/conftest.py).
TARGET = specjax.ModelConfig(
    vocab_size=264,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=128,
    tie_word_embeddings=False,
)
MESHES = (None, "data=8", "data=2,model=4")
COMMON = [
    f"steps={STEPS}",
    "log_every=1",
    f"checkpoint_every={STEPS}",
    "optim.learning_rate=0.01",
    "optim.warmup_steps=1",
    "eval.every=1000",
]
HEAD = [*COMMON, "data.seq_len=16", "data.batch_size=8"]
RUNS = {
    "medusa": (train_heads.HeadTrainConfig, [*HEAD, "kind=medusa", "num_heads=2"]),
    "eagle3": (
        train_heads.HeadTrainConfig,
        [
            *HEAD,
            "kind=eagle",
            "eagle.intermediate_size=64",
            "eagle.feature_layers=[0, 1]",
            "eagle.eagle3.enabled=true",
            "eagle.eagle3.draft_vocab_size=64",
            "eagle.eagle3.ttt_steps=2",
        ],
    ),
    # A one-layer draft of the target's architecture with 4 kv heads: split over model=4 as
    # the target is (no kv head repeated), its optimizer state alike.
    "distill": (
        distill.DistillConfig,
        [
            *COMMON,
            "draft_init=config",
            "draft_config.num_key_value_heads=4",
            "data.seq_len=17",
            "data.prompt_len=4",
            "data.batch_size=8",
        ],
    ),
}
_STUB = {f"{m}_{s}": 1.0 for m in ("mean_acceptance_length", "acceptance_rate") for s in ("greedy", "sampled")}


class _StepCompiles(logging.Handler):
    """Counts compilations of the training step (jax_log_compiles logs each one)."""

    count = 0

    def emit(self, record):
        if record.getMessage().startswith("Compiling jit(_step)"):
            _StepCompiles.count += 1


def target_dir(root: Path) -> Path:
    model = specjax.init_model(TARGET, 0)
    params = jax.tree.map(lambda x: x * 4.0 if x.ndim > 1 else x, model.params)
    return specjax.save_model(specjax.Model(TARGET, params, ByteTokenizer()), root / "target")


def trained_params(name: str, results: dict, target: specjax.Model) -> list[np.ndarray]:
    """The params as the run saved them: the draft in HF format, or the head."""
    if name == "distill":
        params = specjax.load_model(results["draft"]).params
    else:
        params = specjax.load_drafter(results["head"], target).params
    return [np.asarray(x) for x in jax.tree.leaves(params)]


def losses(out: Path) -> list[float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def run(name: str, mesh: str | None, root: Path, target: Path, resume_from: str | None = None):
    cls, overrides = RUNS[name]
    train = train_heads.train_head if name != "distill" else distill.distill
    out = root / f"{name}-{mesh}"
    mesh_set = lambda m: [f"mesh={m}"] if m else []  # noqa: E731
    if resume_from is not None:  # a checkpoint written on another mesh, the run finished on this one
        first = load_config(cls, None, [f"target={target}", *overrides, *mesh_set(resume_from)])
        assert train(first, out, progress=False, stop_after=1) == {"completed_steps": 1}
    config = load_config(cls, None, [f"target={target}", *overrides, *mesh_set(mesh)])
    return out, train(config, out, progress=False)


def split_of_a_step(mesh: str) -> dict:
    """Shard shapes MeshSteps gives a batch, a draft's q_proj and its Adam moment, a head's."""
    steps = MeshSteps(mesh, 8)
    (tokens,) = steps.rows(np.zeros((8, 16), np.int32))
    draft = TARGET.replace(num_key_value_heads=4)
    q = np.zeros((64, 8, 8), np.float32)
    tree = {"layers": {0: {"attn": {"q_proj": q}}}}
    params, moments = steps.state(tree, {"mu": tree}, restored=False, layout=steps.layout(draft))
    head, _ = steps.state(tree, {}, restored=False)
    shape = lambda x: list(x.sharding.shard_shape(x.shape))  # noqa: E731
    return {
        "rows": shape(tokens)[0],
        "draft_q_proj": shape(params["layers"][0]["attn"]["q_proj"]),
        "draft_q_proj_mu": shape(moments["mu"]["layers"][0]["attn"]["q_proj"]),
        "head_q_proj": shape(head["layers"][0]["attn"]["q_proj"]),
    }


def main() -> None:
    assert jax.device_count() == 8, jax.device_count()
    train_heads.head_acceptance = distill.acceptance = lambda *args, **kwargs: _STUB  # in this process only
    logging.getLogger("jax").addHandler(_StepCompiles())
    jax.config.update("jax_log_compiles", True)
    logging.getLogger("jax").propagate = False  # the count, not a page of shapes per compile
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target_path = target_dir(root)
        target = specjax.load_model(target_path)
        for name in RUNS:
            reference = None
            for mesh in MESHES:
                resume = "data=8" if (name, mesh) == ("distill", "data=2,model=4") else None
                before = _StepCompiles.count
                out, results = run(name, mesh, root, target_path, resume)
                params = trained_params(name, results, target)
                reference = reference or params
                excess = max(
                    float(np.max(np.abs(a - b) / (ATOL + RTOL * np.abs(b))))
                    for a, b in zip(params, reference, strict=True)
                )
                line = {
                    "run": name,
                    "mesh": mesh,
                    "resumed_from": resume,
                    "losses": losses(out),
                    "param_excess": excess,  # <= 1: within the tolerance
                    "step_compiles": _StepCompiles.count - before,
                }
                print(json.dumps(line), flush=True)
        for mesh in MESHES[1:]:
            print(json.dumps({"split": mesh, **split_of_a_step(mesh)}), flush=True)


if __name__ == "__main__":
    main()
