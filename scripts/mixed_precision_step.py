"""One EAGLE-3 training step from a stored-format batch, float32 against bfloat16 compute.

`eagle3.compute_dtype: bfloat16` runs the head on a bfloat16 copy of its float32 weights
(mixed precision). This times the jitted step (loss, gradient, AdamW update) both ways,
round-robin in one process, on a batch shaped as the config's store gives it (random
states and logits: the step's cost does not depend on their values), and the two losses on
that batch. The target is loaded only for the embedding the head shares.

    python scripts/mixed_precision_step.py --config configs/smollm2_eagle3_v2.yaml \\
        --repeats 5 --out results/feature_store/mixed_precision.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.bench.timing import environment
from specjax.configs import load_config
from specjax.io.presets import resolve_model
from specjax.training.head_kinds import head_kind
from specjax.training.train_heads import HeadTrainConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/smollm2_eagle3_v2.yaml", help="an EAGLE-3 HeadTrainConfig")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="results/feature_store/mixed_precision.json")
    args = parser.parse_args()

    # features.store only selects the stored loss here: nothing is read from it.
    config = load_config(HeadTrainConfig, args.config, ["features.store=unused"])
    target = resolve_model(config.target)
    kind = head_kind(config, target, Path(tempfile.mkdtemp()))
    rows, length = config.batch_size, config.dataset.seq_len if config.dataset else config.data.seq_len
    rng = np.random.default_rng(0)
    d, vd = target.config.hidden_size, config.eagle.eagle3.draft_vocab_size or target.config.vocab_size
    n = len(config.eagle.feature_layers) if config.eagle.feature_layers else 3
    batch = {
        "tokens": jnp.asarray(rng.integers(0, target.config.vocab_size, (rows, length)), jnp.int32),
        "multi": jnp.asarray(rng.standard_normal((rows, length, n * d)), jnp.bfloat16),
        "logits": jnp.asarray(4 * rng.standard_normal((rows, length, vd)), jnp.bfloat16),
        "in_draft": jnp.asarray(rng.random((rows, length)) < 0.9),
    }
    optimizer = optax.adamw(config.optim.learning_rate)
    params = kind.initial
    opt_state = optimizer.init(params)

    def step_of(loss):
        @jax.jit
        def step(params, opt_state, target_params, batch):
            (value, _), grads = jax.value_and_grad(lambda p: loss(target_params, p, batch), has_aux=True)(params)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, value

        return step

    settings = kind.loss.settings
    steps = {
        dtype: step_of(dataclasses.replace(kind.loss, settings=dataclasses.replace(settings, compute_dtype=dtype)))
        for dtype in ("float32", "bfloat16")
    }
    losses, seconds = {}, {k: [] for k in steps}
    for name, step in steps.items():  # compile, and the loss of the first step
        losses[name] = float(jax.block_until_ready(step(params, opt_state, target.params, batch))[2])
    for _ in range(args.repeats):
        for name, step in steps.items():
            began = time.perf_counter()
            jax.block_until_ready(step(params, opt_state, target.params, batch))
            seconds[name].append(time.perf_counter() - began)
    median = {k: statistics.median(v) for k, v in seconds.items()}
    result = {
        "command": f"python scripts/mixed_precision_step.py --config {args.config} --repeats {args.repeats}",
        "environment": environment(),
        "batch": [rows, length],
        "loss": losses,
        "seconds": seconds,
        "median_s": median,
        "bfloat16_over_float32": median["bfloat16"] / median["float32"],
    }
    print(json.dumps({k: result[k] for k in ("loss", "median_s", "bfloat16_over_float32")}, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
