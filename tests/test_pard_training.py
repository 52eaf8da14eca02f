"""PARD's mask-token training (`specjax distill` with parallel.enabled): the packed call's
mask against a dense reference, the packed loss against one unpacked forward per mask
group, training lowers the loss, resume (stop_after, and kill -9 of a real process) ends
where an uninterrupted run does, and the trained draft decodes as a ParallelDraft (its mask
id read from its config.json) greedily equal to plain decoding. Tiny byte-level models."""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TARGET_CONFIG, kill_after_checkpoint
from specjax.models import TreeMask, full_forward, init_params

import specjax
from specjax.configs import dump_config, load_config
from specjax.drafters import ParallelDraft
from specjax.io.tokenizer import ByteTokenizer
from specjax.training.data import held_out_prompts
from specjax.training.distill import DistillConfig, distill
from specjax.training.parallel_objective import (
    ParallelTrainConfig,
    default_mask_token_id,
    packed_layout,
    packed_logits,
    parallel_loss,
    split_points,
)

# One layer: what is tested is the same, and every program compiles in less time.
BYTES = TARGET_CONFIG.replace(vocab_size=259, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1)
PAD = 258  # the byte vocabulary's PAD: the default mask token
STEPS = 30


def _model(seed: int, scale: float, base=None, noise: float = 0.0) -> specjax.Model:
    """Weights drawn with numpy (eager jax.random compiles a program per shape): std 0.02 x
    scale, norms at ones; or `base` with relative Gaussian noise."""
    rng = np.random.default_rng(seed)
    if base is None:
        shapes = jax.eval_shape(lambda: init_params(BYTES, 0))
        draw = lambda s: 0.02 * scale * rng.standard_normal(s.shape) if len(s.shape) > 1 else np.ones(s.shape)  # noqa: E731
        params = jax.tree.map(lambda s: jnp.asarray(draw(s), s.dtype), shapes)
    else:
        params = jax.tree.map(
            lambda x: jnp.asarray(x + noise * np.std(x) * rng.standard_normal(x.shape), x.dtype), base.params
        )
    return specjax.Model(BYTES, params, ByteTokenizer())


@pytest.fixture(scope="module")
def pair():
    target = _model(0, 6.0)
    return target, _model(7, 0.0, base=target, noise=1.0)


@pytest.fixture(scope="module")
def pair_dirs(pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("pard_pair")
    for name, model in zip(("target", "draft"), pair, strict=True):
        specjax.save_model(model, root / name)
    return root / "target", root / "draft"


def _config(pair_dirs, *overrides) -> DistillConfig:
    target, draft = pair_dirs
    settings = [
        f"target={target}",
        f"draft={draft}",
        "parallel.enabled=true",
        "parallel.num_masks=2",
        "parallel.groups=3",
        "data.seq_len=24",
        "data.prompt_len=8",
        "data.batch_size=4",
        "optim.learning_rate=0.01",
        "optim.warmup_steps=2",
        "optim.weight_decay=0.0",
        f"steps={STEPS}",
        f"eval.every={STEPS}",
        "eval.prompts=2",
        "eval.prompt_bytes=12",
        "eval.max_new_tokens=8",
        "checkpoint_every=5",
        "log_every=1",
    ]
    return load_config(DistillConfig, None, [*settings, *overrides])


@pytest.fixture(scope="module")
def straight(pair_dirs, tmp_path_factory):
    """One uninterrupted run that the resumed ones must reproduce."""
    run = tmp_path_factory.mktemp("pard_straight")
    return run, distill(_config(pair_dirs), run, progress=False)


def _params_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


# --- The packed call ---------------------------------------------------------------------------


def test_packed_mask_matches_a_dense_reference():
    """Slot by slot from PARD's own inference sequence: group g at split L is fed
    s = [x_0..x_{L-1}, MASK x M] causally, and s_j lives at slot j (j < L) or at slot
    T + g M + (j - L) of the packed call; a query sees exactly the slots of s up to itself
    (real queries: the plain causal window). The TreeMask built from it (per-row visibility)
    gives the same [B, N, S] mask to attention, and a shared [T, W] one is unchanged."""
    t, m = 9, 3
    anchors = np.array([[1, 4, 6], [2, 2, 5]], np.int32)  # t - m = 6 is the last legal split
    b, g = anchors.shape
    n = t + g * m
    positions, visible = (np.asarray(a) for a in jax.jit(packed_layout, static_argnums=(1, 2))(anchors, t, m))
    expected = np.zeros((b, n, n), bool)
    expected_positions = np.zeros((b, n), np.int32)
    for row in range(b):
        for q in range(t):
            expected[row, q, : q + 1] = True
            expected_positions[row, q] = q
        for group, split in enumerate(anchors[row]):
            slot_of = [*range(split), *(t + group * m + i for i in range(m))]  # s_j -> slot
            for j in range(split, split + m):
                expected[row, slot_of[j], [slot_of[i] for i in range(j + 1)]] = True
                expected_positions[row, slot_of[j]] = j
    np.testing.assert_array_equal(visible, expected)
    np.testing.assert_array_equal(positions, expected_positions)
    slots = jnp.broadcast_to(jnp.arange(n), (b, n))
    tree = TreeMask(start=jnp.zeros((b,), jnp.int32), slots=slots, visible=jnp.asarray(visible))
    mask = jax.jit(lambda tree, slots: tree.mask(slots))
    np.testing.assert_array_equal(np.asarray(mask(tree, jnp.arange(n + 4))), np.pad(expected, ((0, 0), (0, 0), (0, 4))))
    shared = np.tril(np.ones((4, 4), bool))  # a 4-node chain from slot 5 (row 0) and 2 (row 1), as verification uses it
    chain = TreeMask(start=jnp.asarray([5, 2]), slots=jnp.zeros((2, 4), jnp.int32), visible=jnp.asarray(shared))
    got = np.asarray(mask(chain, jnp.arange(10)))
    for row, start in enumerate((5, 2)):
        reference = np.zeros((4, 10), bool)
        reference[:, :start] = True
        reference[:, start : start + 4] = shared
        np.testing.assert_array_equal(got[row], reference)


def test_split_points_follow_the_loss_mask_and_the_step():
    parallel = ParallelTrainConfig(enabled=True, num_masks=2, groups=4)
    mask = np.ones((3, 20), np.float32)
    mask[1, :] = 0.0
    mask[1, 12] = 1.0  # only x_13 scored: masks predicting it sit at L = 11 or 12
    mask[2, :] = 0.0  # nothing scored: any split
    points = split_points(parallel, mask, seed=0, step=3)
    assert points.shape == (3, 4) and points.dtype == np.int32
    assert points.min() >= 1 and points.max() <= 20 - 2
    assert len(set(points[0])) == 4  # distinct where there are enough
    assert set(points[1]) <= {11, 12}
    np.testing.assert_array_equal(points, split_points(parallel, mask, seed=0, step=3))
    assert not np.array_equal(points, split_points(parallel, mask, seed=0, step=4))


def test_default_mask_token():
    assert default_mask_token_id(ByteTokenizer(), 259) == PAD

    class Chat:  # SmolLM2's: pad == eos, no spare id, unk <|endoftext|>
        pad_token_id, eos_token_id, bos_token_id, unk_token_id = 2, 2, 1, 0

        def __len__(self):
            return 100

    assert default_mask_token_id(Chat(), 100) == 0
    assert default_mask_token_id(Chat(), 128) == 100  # a padded vocabulary: the first id past the tokenizer
    Chat.unk_token_id = None
    with pytest.raises(ValueError, match=r"set parallel\.mask_token_id"):
        default_mask_token_id(Chat(), 100)
    with pytest.raises(ValueError, match="leaves no split point"):
        load_config(DistillConfig, None, ["parallel.enabled=true", "parallel.num_masks=127", "data.seq_len=128"])


_forward = jax.jit(full_forward, static_argnums=0)


@pytest.mark.parametrize("objective", ["forward_kl", "next_token"])
def test_packed_loss_equals_one_forward_per_group(pair, objective):
    """Unpacked: the real tokens' plain forward, and for every row and group a plain causal
    forward of its own over [x_0..x_{L-1}, MASK x M] (PARD's inference input; filler after
    it, which causal attention hides), output L - 1 + i the prediction of x_{L+i}, taught by
    the target's output at L - 1 + i of its plain forward; the loss assembled in numpy."""
    target, draft = pair
    t, m = 14, 2
    parallel = ParallelTrainConfig(enabled=True, num_masks=m, groups=3, next_token_weight=0.5)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 256, (2, t + 1)).astype(np.int32)
    mask = (rng.random((2, t)) > 0.2).astype(np.float32)
    anchors = split_points(parallel, mask, seed=0, step=0)
    static = (objective, 1.0, 0.5, parallel, PAD, BYTES, BYTES)
    loss, per_offset = jax.jit(parallel_loss, static_argnums=range(7))(
        *static, draft.params, target.params, *map(jnp.asarray, (tokens, mask, anchors))
    )
    packed = np.asarray(
        jax.jit(packed_logits, static_argnums=(0, 4, 5))(BYTES, draft.params, tokens, anchors, m, PAD)[0]
    )

    rows = [(row, group, split) for row in range(2) for group, split in enumerate(anchors[row])]
    fed = np.zeros((len(rows), t), np.int32)  # one row per group
    for k, (row, _, split) in enumerate(rows):
        fed[k, : split + m] = [*tokens[row, :split], *[PAD] * m]
    unpacked = np.asarray(_forward(BYTES, draft.params, fed))
    plain = np.asarray(_forward(BYTES, draft.params, tokens[:, :t]))
    teacher = np.asarray(_forward(BYTES, target.params, tokens[:, :t]))
    np.testing.assert_allclose(packed[:, :t], plain, atol=1e-4)

    def log_softmax(x):
        x = x - x.max()
        return x - np.log(np.exp(x).sum())

    def term(logits, row, p):  # the scored term of an output at position p (predicting x_{p+1})
        log_q = log_softmax(logits)
        if objective == "next_token":
            return -log_q[tokens[row, p + 1]]
        log_p = log_softmax(teacher[row, p])
        return np.sum(np.exp(log_p) * (log_p - log_q))

    sums, weights = np.zeros(m + 1), np.zeros(m + 1)
    for row in range(2):
        for p in range(t):
            sums[0] += mask[row, p] * term(plain[row, p], row, p)
            weights[0] += mask[row, p]
    for k, (row, group, split) in enumerate(rows):
        for i in range(1, m + 1):
            p = split - 1 + i  # the output of mask i, predicting x_{split + i}
            np.testing.assert_allclose(packed[row, t + group * m + i - 1], unpacked[k, p], atol=1e-4)
            sums[i] += mask[row, p] * term(unpacked[k, p], row, p)
            weights[i] += mask[row, p]
    expected = (0.5 * sums[0] + sums[1:].sum()) / (0.5 * weights[0] + weights[1:].sum())
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(per_offset), sums / np.maximum(weights, 1.0), rtol=1e-5)


def test_bfloat16_compute_is_the_float32_loss_within_its_rounding(pair):
    """distill's compute_dtype bfloat16: the packed loss with the draft's config in bfloat16
    (its float32 weights cast inside the loss) is the float32 loss within bfloat16's
    rounding, not bit-equal, and the gradient reaches the weights as float32."""
    target, draft = pair
    parallel = ParallelTrainConfig(enabled=True, num_masks=2, groups=3)
    rng = np.random.default_rng(2)
    tokens = jnp.asarray(rng.integers(0, 256, (2, 15)), jnp.int32)
    mask = jnp.asarray(rng.random((2, 14)) > 0.2, jnp.float32)
    anchors = jnp.asarray(split_points(parallel, np.asarray(mask), seed=0, step=0))

    def loss(config, params):
        return parallel_loss("next_token", 1.0, 0.5, parallel, PAD, config, BYTES, params, target.params, tokens, mask,
                             anchors)[0]  # fmt: skip

    grad = jax.jit(jax.value_and_grad(loss, argnums=1), static_argnums=0)
    want, _ = grad(BYTES, draft.params)
    got, grads = grad(BYTES.replace(dtype="bfloat16"), draft.params)
    np.testing.assert_allclose(float(got), float(want), rtol=2e-2)
    assert float(got) != float(want)
    assert {x.dtype for x in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
    with pytest.raises(ValueError, match="compute_dtype"):
        DistillConfig(compute_dtype="float16")


# --- Training, resume, decoding ----------------------------------------------------------------


def test_training_lowers_the_loss_and_records_the_mask(straight):
    run, results = straight
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == STEPS
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.1
    offsets = [r["loss_per_offset"] for r in rows if "loss_per_offset" in r]
    assert all(len(o) == 3 for o in offsets)  # K = num_masks + 1
    assert np.mean([o[2] for o in offsets[-5:]]) < np.mean([o[2] for o in offsets[:5]])  # the second mask learns
    assert "mean_acceptance_length_greedy" in rows[0] and "mean_acceptance_length_greedy" in rows[-1]
    assert results["parallel_k"] == 3 and results["mask_token_id"] == PAD
    assert json.loads((run / "draft" / "config.json").read_text())["specjax_mask_token_id"] == PAD


def test_resume_reproduces_the_uninterrupted_run(pair_dirs, straight, tmp_path):
    config = _config(pair_dirs)
    assert distill(config, tmp_path, progress=False, stop_after=7) == {"completed_steps": 7}  # checkpoint at 5
    resumed = distill(config, tmp_path, progress=False)
    _params_equal(specjax.load_model(straight[1]["draft"]).params, specjax.load_model(resumed["draft"]).params)


def test_kill_9_during_training_then_resume(pair_dirs, straight, tmp_path, monkeypatch):
    """SIGKILL a real `specjax distill` process after a checkpoint; the rerun ends as the
    uninterrupted run did. The two processes share a compilation cache (the rerun compiles
    nothing the killed one did)."""
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax_cache"))
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    config_path = tmp_path / "pard.yaml"
    dump_config(_config(pair_dirs), config_path)
    run_dir = tmp_path / "killed"
    command = [sys.executable, "-m", "specjax.cli", "distill", "--config", str(config_path), "--out", str(run_dir)]
    kill_after_checkpoint([*command, "--no-progress"], run_dir / "checkpoints", min_step=5, total_steps=STEPS)
    _params_equal(specjax.load_model(straight[1]["draft"]).params, specjax.load_model(run_dir / "draft").params)


def test_trained_draft_decodes_greedily_equal_to_plain(pair, straight):
    """The draft's directory by name alone: its config.json records the mask id, so it is a PARD draft.
    (The held-out prompts and lengths of the run's own evaluation: its program is reused.)"""
    target = pair[0]
    drafter = specjax.load_drafter(straight[1]["draft"], target)
    assert isinstance(drafter, ParallelDraft)
    assert drafter.mask_token_id == PAD
    prompts = held_out_prompts("code", 2, 12, split="validation")
    config = specjax.GenerationConfig(max_new_tokens=8)
    expected = specjax.generate(target, prompts, config).tokens
    out = specjax.generate(
        target, prompts, config, draft=drafter, speculative=specjax.SpeculativeConfig(num_speculative_tokens=3)
    )
    assert out.tokens == expected and out.stats.drafter["kind"] == "parallel_draft"
