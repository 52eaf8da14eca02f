"""Tiny models (a few thousand parameters) for CPU tests.

Random init at std 0.02 gives nearly uniform, repetitive outputs; the weights are scaled
up so that greedy paths vary and distributions are peaked, which is what the tests need
to be able to fail.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import specjax

TARGET_CONFIG = specjax.ModelConfig(
    vocab_size=48,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)

SMALL_DRAFT_CONFIG = TARGET_CONFIG.replace(
    hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
)


def scaled_model(config: specjax.ModelConfig, seed: int, scale: float = 8.0) -> specjax.Model:
    model = specjax.init_model(config, seed)
    params = jax.tree.map(lambda x: x * scale if x.ndim > 1 else x, model.params)
    return specjax.Model(config, params)


def noisy_copy(model: specjax.Model, noise: float, seed: int) -> specjax.Model:
    """A draft that tracks `model` imperfectly: every weight gets relative Gaussian noise."""
    return specjax.Model(model.config, _noisy_params(model.params, noise, seed))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _noisy_params(params, noise: float, seed: int):
    # One program per params structure: op by op, every weight shape compiled its own
    # random-normal and std kernels (seconds per model, in many modules).
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [x + noise * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    return jax.tree.unflatten(treedef, noisy)


@pytest.fixture(scope="session")
def target():
    return scaled_model(TARGET_CONFIG, seed=0)


@pytest.fixture(scope="session")
def noisy_draft(target):
    return noisy_copy(target, noise=0.1, seed=3)


@pytest.fixture(scope="session")
def small_draft():
    return scaled_model(SMALL_DRAFT_CONFIG, seed=1)


@pytest.fixture(scope="session")
def _shared_tokenizers(request, tmp_path_factory):
    shared = getattr(request.config, "specjax_tokenizers", None)  # the README and docs' (../conftest.py)
    return Path(shared) if shared else tmp_path_factory.mktemp("tokenizers")


@pytest.fixture(autouse=True)
def _cost_cache_dir(tmp_path_factory, monkeypatch, _shared_tokenizers):
    """Every test its own round-cost cache (engine/cost_cache.py): none writes to ~/.cache or
    reads a file an earlier run left. Tokenizers built from GGUF files (io/gguf_file.py) are
    shared by the session instead: they depend on the file only, and building SmolLM2's takes 8 s."""
    cache = tmp_path_factory.mktemp("specjax-cache")
    (cache / "tokenizers").symlink_to(_shared_tokenizers, target_is_directory=True)
    monkeypatch.setenv("SPECJAX_CACHE_DIR", str(cache))


RAGGED_PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [7], [30, 31]]


def adam_steps(loss, target_params, params, tokens, steps: int = 6, learning_rate: float = 3e-2):
    """A head's loss (target_params, params, tokens) -> (value, parts) minimised by Adam for a
    few jitted steps on one batch -> (params, [value per step], last parts): "the loss falls"."""
    import optax

    optimizer = optax.adam(learning_rate)

    @jax.jit
    def step(params, opt_state):
        (value, parts), grads = jax.value_and_grad(lambda p: loss(target_params, p, tokens), has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value, parts

    opt_state, values, parts = optimizer.init(params), [], None
    for _ in range(steps):
        params, opt_state, value, parts = step(params, opt_state)
        values.append(float(value))
    return params, values, parts


def kill_after_checkpoint(command: list[str], checkpoints, min_step: int, total_steps: int) -> None:
    """Start a `specjax` run, SIGKILL it once a checkpoint >= min_step exists, then rerun it to the end."""
    import os
    import signal
    import subprocess
    import time

    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while time.time() < deadline and process.poll() is None:
        if checkpoints.exists() and any(p.name.isdigit() and int(p.name) >= min_step for p in checkpoints.iterdir()):
            break
        time.sleep(0.05)
    assert process.poll() is None, "the run finished before it could be killed; make it longer"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    completed = [int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()]
    assert completed and max(completed) < total_steps
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
