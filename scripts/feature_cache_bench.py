"""Head training with the target's features computed on the fly vs cached to disk (issue 12).

    python scripts/feature_cache_bench.py --config configs/eagle_head.yaml --steps 30 \\
        --out results/feature_cache/feature_cache.json

Both paths train the same head from the same initial weights on the same N batches
(training_batch(seed, step)), so their losses must agree step for step (reported):
  on the fly: the current `specjax train-head` step, one frozen target forward per batch;
  cached:     a one-off pass writes every batch's target features to an np.memmap on disk
              (the final-norm feature [B, T, D], plus [B, T, n * D] for a multi-layer head);
              training then reads them back and only runs the target's LM head (for the
              distillation logits) and the head itself.
Compile time is timed apart from the steady state. The cache file is read while the OS
page cache still holds it (just written, smaller than memory): the best case for reading.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from specjax.models import full_forward, graphdef
from specjax.models.heads import head_config, head_passes, target_logits

from specjax.configs import load_config
from specjax.io.presets import resolve_model
from specjax.training.data import training_batch
from specjax.training.train import make_optimizer
from specjax.training.train_heads import HeadTrainConfig, _kind, _step, eagle_objective


def target_side(target_config, layers, target_params, tokens):
    """tokens [B, T] -> what the cache stores: final-norm features [B, T, D], and for a
    multi-layer head the selected blocks' outputs [B, T, n * D] after them ([B, T, (n + 1) * D])."""
    if not layers:
        return full_forward(target_config, target_params, tokens, features=True)[1]
    last = target_config.num_hidden_layers - 1
    asked = layers if last in layers else (*layers, last)
    hidden = full_forward(target_config, target_params, tokens, features=asked)[1]
    d = target_config.hidden_size
    top = hidden[..., asked.index(last) * d : (asked.index(last) + 1) * d]
    features = nnx.merge(graphdef(target_config), target_params).final_norm(top)
    return jnp.concatenate([features, hidden[..., : len(layers) * d]], axis=-1)


def cached_loss(layer, target_config, weights, layers, target_params, head_params, batch):
    """The train-head EAGLE loss from cached features: batch = (tokens [B, T], cached [B, T, W])."""
    tokens, cached = batch
    d = target_config.hidden_size
    features, multi = cached[..., :d].astype(jnp.float32), (cached[..., d:].astype(jnp.float32) if layers else None)
    logits = target_logits(target_config, target_params, features)  # the target's LM head: cheap
    head = head_passes(layer, head_params, target_params, tokens, features, multi)
    return eagle_objective(logits, features, *head, weights)


def cache_features(forward, target_params, tokens, path, shape, dtype) -> tuple[float, float]:
    """Write every batch's target features to an .npy memmap -> (first batch seconds, rest seconds)."""
    clock = time.perf_counter()
    memmap = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    for step, batch in enumerate(tokens):
        memmap[step] = np.asarray(forward(target_params, jnp.asarray(batch)))
        if step == 0:
            first, clock = time.perf_counter() - clock, time.perf_counter()  # compile (round 0) + 1 batch
    memmap.flush()
    del memmap
    return first, time.perf_counter() - clock


def timed_steps(step_fn, loss_fn, optimizer, target_params, initial, batches) -> tuple[float, float, list[float]]:
    """(compile + first step seconds, seconds for the remaining steps, losses); batches() yields per step."""
    params, opt_state = jax.tree.map(jnp.array, initial), optimizer.init(initial)
    losses, clock, first = [], time.perf_counter(), None
    for i, batch in enumerate(batches()):
        params, opt_state, loss, _ = step_fn(loss_fn, optimizer, target_params, params, opt_state, batch)
        losses.append(float(loss))  # blocks: each step is finished before the next is timed
        if i == 0:
            first, clock = time.perf_counter() - clock, time.perf_counter()
    return first, time.perf_counter() - clock, losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/eagle_head.yaml")
    parser.add_argument("--set", action="append", default=[], help="config override, as train-head --set")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the three phases; medians are reported")
    parser.add_argument("--cache-dtype", default="float32", choices=["float32", "float16"])
    parser.add_argument("--cache-dir", default=None, help="where the memmap goes (default: a temporary directory)")
    parser.add_argument("--out", default="results/feature_cache/feature_cache.json")
    args = parser.parse_args()

    config = load_config(HeadTrainConfig, args.config, args.set)
    if config.kind != "eagle":
        raise SystemExit("this bench times the EAGLE head (its features are what a cache would hold)")
    target = resolve_model(config.target)
    kind = _kind(config, target)
    layers = tuple(config.eagle.feature_layers)
    optimizer = make_optimizer(config.optim, config.steps)
    n = args.steps
    tokens = [training_batch(config.data, config.seed, step) for step in range(n)]  # the same batches both ways
    step_fn = jax.jit(_step, static_argnums=(0, 1), donate_argnums=(3, 4))

    directory = Path(args.cache_dir or tempfile.mkdtemp(prefix="feature_cache_"))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "features.npy"
    forward = jax.jit(functools.partial(target_side, target.config, layers))
    loss = functools.partial(cached_loss, kind_layer(config, target), target.config, weights(config), layers)
    shape = (n, *tokens[0].shape, target.config.hidden_size * (1 + len(layers)))  # [N, B, T, W]
    rounds = []
    # The machine is shared: each round times the three phases back to back, and the summary
    # takes medians over rounds (round 0's first steps include compilation).
    for _ in range(args.repeats):
        fly = timed_steps(step_fn, kind.loss, optimizer, target.params, kind.initial, lambda: map(jnp.asarray, tokens))
        caching = cache_features(forward, target.params, tokens, path, shape, args.cache_dtype)
        stored = np.load(path, mmap_mode="r")
        cached = timed_steps(
            step_fn,
            loss,
            optimizer,
            target.params,
            kind.initial,
            lambda stored=stored: ((jnp.asarray(tokens[s]), jnp.asarray(np.asarray(stored[s]))) for s in range(n)),
        )
        del stored
        fly_rate, cached_rate, caching_rate = (n - 1) / fly[1], (n - 1) / cached[1], (n - 1) / caching[1]
        rounds.append(
            {
                "on_the_fly": {"first_step_seconds": fly[0], "steady_seconds": fly[1], "steps_per_second": fly_rate},
                "caching": {"first_batch_seconds": caching[0], "steady_seconds": caching[1]},
                "cached": {
                    "first_step_seconds": cached[0],
                    "steady_seconds": cached[1],
                    "steps_per_second": cached_rate,
                },
                # train-head sees every batch once: caching then only moves the target forward out of the
                # step. Steady seconds per batch: one on-the-fly step against caching it + a cached step.
                "one_pass_seconds_per_step": {
                    "on_the_fly": 1 / fly_rate,
                    "cache_then_train": 1 / caching_rate + 1 / cached_rate,
                },
                "max_abs_loss_difference": float(np.max(np.abs(np.asarray(fly[2]) - np.asarray(cached[2])))),
            }
        )

    def median(*keys):
        values = [functools.reduce(lambda d, k: d[k], keys, r) for r in rounds]
        return float(np.median(values))

    fly_rate, cached_rate = median("on_the_fly", "steps_per_second"), median("cached", "steps_per_second")
    caching_per_batch = float(np.median([r["caching"]["steady_seconds"] / (n - 1) for r in rounds]))
    saved_per_step = 1 / fly_rate - 1 / cached_rate
    results = {
        "command": "python scripts/feature_cache_bench.py " + " ".join(_quoted(a) for a in _argv()),
        "config": args.config,
        "overrides": args.set,
        "steps": n,
        "repeats": args.repeats,
        "batch": list(tokens[0].shape),
        "feature_layers": list(layers),
        "cache_dtype": args.cache_dtype,
        "cache_bytes": int(path.stat().st_size),
        "median": {
            "on_the_fly_steps_per_second": fly_rate,
            "cached_steps_per_second": cached_rate,
            "caching_batches_per_second": 1 / caching_per_batch,
            "speedup_steady": cached_rate / fly_rate,
            "one_pass_seconds_per_step_on_the_fly": median("one_pass_seconds_per_step", "on_the_fly"),
            "one_pass_seconds_per_step_cache_then_train": median("one_pass_seconds_per_step", "cache_then_train"),
            # Caching a batch pays once the time its cached steps save covers its caching: after this
            # many uses of each batch (epochs over a fixed pool, or a sweep of heads over one cache).
            "break_even_uses_per_batch": caching_per_batch / saved_per_step if saved_per_step > 0 else None,
        },
        "max_abs_loss_difference": max(r["max_abs_loss_difference"] for r in rounds),
        "rounds": rounds,
        "losses_on_the_fly": fly[2],  # the last round's
        "losses_cached": cached[2],
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "backend": jax.default_backend()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    summary = {k: v for k, v in results.items() if not k.startswith("losses") and k != "rounds"}
    print(json.dumps(summary, indent=2))
    if args.cache_dir is None:
        path.unlink()
        directory.rmdir()


def kind_layer(config: HeadTrainConfig, target):
    e = config.eagle
    return head_config(target.config, e.num_attention_heads, e.num_key_value_heads, e.intermediate_size)


def weights(config: HeadTrainConfig) -> tuple[float, float]:
    return (config.eagle.feature_weight, config.eagle.token_weight)


def _argv() -> list[str]:
    return sys.argv[1:]


def _quoted(arg: str) -> str:
    return arg if all(c.isalnum() or c in "-_./=:,[]" for c in arg) else repr(arg)


if __name__ == "__main__":
    main()
