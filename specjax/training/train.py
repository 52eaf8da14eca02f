"""Pretraining on the stdlib corpus: optax AdamW, orbax checkpoints, exact resume.

`train(config, out_dir)` is restartable at any moment: a run killed (even with SIGKILL)
resumes from the newest complete checkpoint, and since every batch is a pure function of
(seed, step), the resumed run reaches the same parameters as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from specjax.io.model import Model
from specjax.io.tokenizer import ByteTokenizer
from specjax.models import ModelConfig, full_forward, init_params
from specjax.training.data import DataConfig, evaluation_windows, training_batch
from specjax.training.run_dirs import open_run, resume_or_start


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    learning_rate: float = 3e-3
    warmup_steps: int = 100
    min_learning_rate_ratio: float = 0.1  # cosine decays to this fraction of the peak
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    b1: float = 0.9
    b2: float = 0.95


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    steps: int = 1000
    seed: int = 0
    checkpoint_every: int = 100
    keep_checkpoints: int = 1  # the newest checkpoints kept in OUT/checkpoints (training/run_dirs.py)
    eval_every: int = 250
    eval_windows: int = 32  # held-out windows per domain for validation bits/byte
    log_every: int = 10

    def __post_init__(self):
        for name in ("steps", "checkpoint_every", "keep_checkpoints", "eval_every", "eval_windows", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


# One optimizer object per (settings, steps): the jitted steps take it as a static argument, so a
# run resumed in the same process (or an equal one) reuses the compiled step instead of
# recompiling it for a new but equal set of optax functions.
@functools.lru_cache(maxsize=8)
def make_optimizer(optim: OptimConfig, steps: int) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=optim.learning_rate,
        warmup_steps=min(optim.warmup_steps, steps - 1),  # the cosine needs at least one step
        decay_steps=steps,
        end_value=optim.learning_rate * optim.min_learning_rate_ratio,
    )
    # Decay matrices only: norms' scales are not regularised toward zero.
    decay_mask = lambda params: jax.tree.map(lambda x: x.ndim > 1, params)  # noqa: E731
    return optax.chain(
        optax.clip_by_global_norm(optim.grad_clip),
        optax.adamw(schedule, b1=optim.b1, b2=optim.b2, weight_decay=optim.weight_decay, mask=decay_mask),
    )


def next_token_loss(config: ModelConfig, params, windows, byte_only: bool = False):
    """Mean cross-entropy in nats of windows [B, T+1]: predict windows[:, 1:] from windows[:, :-1]."""
    logits = full_forward(config, params, windows[:, :-1])  # [B, T, V]
    targets = windows[:, 1:]
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)[..., 0]
    if not byte_only:
        return jnp.mean(nll)
    mask = targets < 256  # bits per *byte*: special tokens are not bytes
    return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1)


def _train_step(config, optimizer, params, opt_state, windows):
    loss, grads = jax.value_and_grad(lambda p: next_token_loss(config, p, windows))(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


_eval_loss = jax.jit(next_token_loss, static_argnums=(0, 3))


def bits_per_byte(config: ModelConfig, params, windows: np.ndarray, batch_size: int = 16) -> float:
    losses = [
        float(_eval_loss(config, params, jnp.asarray(windows[i : i + batch_size]), True))
        for i in range(0, len(windows), batch_size)
    ]
    return float(np.mean(losses)) / math.log(2)


def train(config: TrainConfig, out_dir: str | Path, progress: bool = True, stop_after: int | None = None) -> Model:
    """Train (or resume) the run in `out_dir`; returns the model at the last step run.

    `stop_after` ends this invocation after that many steps (a controlled interruption,
    used by tests and for chunked runs); rerunning continues from the checkpoint.
    """
    out_dir = open_run(out_dir, config, "train_config.yaml")
    optimizer = make_optimizer(config.optim, config.steps)
    params, opt_state, start, checkpoints, metrics = resume_or_start(
        out_dir, init_params(config.model, config.seed), optimizer, config.checkpoint_every, config.keep_checkpoints
    )
    step_fn = jax.jit(_train_step, static_argnums=(0, 1), donate_argnums=(2, 3))
    held_out = {
        d: evaluation_windows(d, "validation", config.data.seq_len, config.eval_windows) for d in ("code", "prose")
    }

    end = config.steps if stop_after is None else min(config.steps, start + stop_after)
    bar = tqdm(range(start, end), initial=start, total=config.steps, disable=not progress, desc="train")
    tokens_per_step = config.data.batch_size * config.data.seq_len
    clock = time.perf_counter()
    for step in bar:
        windows = jnp.asarray(training_batch(config.data, config.seed, step))
        params, opt_state, loss = step_fn(config.model, optimizer, params, opt_state, windows)
        done = step + 1
        if done % config.log_every == 0 or done == config.steps:
            loss = float(loss)  # the only host sync, every log_every steps
            rate = tokens_per_step * (done - max(start, done - config.log_every)) / (time.perf_counter() - clock)
            clock = time.perf_counter()
            row = {"step": done, "loss": loss, "bits_per_byte_train": loss / math.log(2), "tokens_per_second": rate}
            if done % config.eval_every == 0 or done == config.steps:
                for domain, windows_held_out in held_out.items():
                    row[f"val_bits_per_byte_{domain}"] = bits_per_byte(config.model, params, windows_held_out)
                clock = time.perf_counter()
            metrics.write(row)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:.0f}")
        checkpoints.save(done, {"params": params, "opt_state": opt_state}, force=done == end)
    checkpoints.close()
    return Model(config.model, params, tokenizer=ByteTokenizer(), trained_context=config.data.seq_len)


def evaluate(model: Model, seq_len: int = 256, windows: int = 64, split: str = "validation") -> dict:
    """Held-out bits/byte of a model on each domain."""
    return {
        domain: bits_per_byte(model.config, model.params, evaluation_windows(domain, split, seq_len, windows))
        for domain in ("code", "prose")
    }
