"""One training step, float32 against bfloat16 compute (training/mixed_precision.py).

EAGLE-3 (a train-head config, `eagle3.compute_dtype`): the jitted step (loss, gradient, AdamW
update) on a batch shaped as the config's store gives it (random states and logits: the
step's cost does not depend on their values); the target is loaded only for the embedding
the head shares. PARD (`--pard`, a distill config with `parallel`, `compute_dtype`): the
packed step on the run's first batch. Both ways round-robin in one process, with the two
losses on that batch.

    python scripts/mixed_precision_step.py --config configs/smollm2_eagle3_v2.yaml \\
        --repeats 5 --out results/feature_store/mixed_precision.json
    python scripts/mixed_precision_step.py --pard --config configs/smollm2_pard_v2.yaml \\
        --repeats 5 --out results/feature_store/mixed_precision_pard.json
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
from specjax.training.distill import DistillConfig, _start_draft, distillation_batch
from specjax.training.head_kinds import head_kind
from specjax.training.parallel_objective import parallel_step, resolve_mask_token_id, split_points
from specjax.training.train_heads import HeadTrainConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/smollm2_eagle3_v2.yaml", help="an EAGLE-3 HeadTrainConfig")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="results/feature_store/mixed_precision.json")
    parser.add_argument("--pard", action="store_true", help="--config is a distill config with parallel.enabled")
    args = parser.parse_args()
    steps, params, opt_state, inputs, shape = (_pard if args.pard else _eagle3)(args.config)
    losses, seconds = {}, {k: [] for k in steps}
    for name, step in steps.items():  # compile, and the loss of the first step
        losses[name] = float(jax.block_until_ready(step(params, opt_state, *inputs))[2])
    for _ in range(args.repeats):
        for name, step in steps.items():
            began = time.perf_counter()
            jax.block_until_ready(step(params, opt_state, *inputs))
            seconds[name].append(time.perf_counter() - began)
    median = {k: statistics.median(v) for k, v in seconds.items()}
    result = {
        "command": f"python scripts/mixed_precision_step.py {'--pard ' * args.pard}--config {args.config} "
        f"--repeats {args.repeats}",
        "environment": environment(),
        "batch": shape,
        "loss": losses,
        "seconds": seconds,
        "median_s": median,
        "bfloat16_over_float32": median["bfloat16"] / median["float32"],
    }
    print(json.dumps({k: result[k] for k in ("loss", "median_s", "bfloat16_over_float32")}, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


def _pard(path: str):
    """(steps by dtype, params, opt_state, the step's other inputs, batch shape) of a PARD run."""
    config = load_config(DistillConfig, path)
    target = resolve_model(config.target)
    draft = _start_draft(config, target)
    mask_id = resolve_mask_token_id(config.parallel, target.tokenizer, draft.config.vocab_size)
    tokens, mask = distillation_batch(config, target, draft, 0)
    anchors = split_points(config.parallel, mask, config.seed, 0)
    optimizer = optax.adamw(config.optim.learning_rate)
    base = (config.objective, config.temperature, config.beta, config.parallel, mask_id)

    def step_of(dtype):
        static = (*base, dataclasses.replace(draft.config, dtype=dtype), target.config)

        @jax.jit
        def step(params, opt_state, target_params, tokens, mask, anchors):
            return parallel_step(static, optimizer, target_params, params, opt_state, tokens, mask, anchors)

        return step

    inputs = (target.params, *map(jnp.asarray, (tokens, mask, anchors)))
    steps = {dtype: step_of(dtype) for dtype in ("float32", "bfloat16")}
    return steps, draft.params, optimizer.init(draft.params), inputs, list(tokens.shape)


def _eagle3(path: str):
    """(steps by dtype, params, opt_state, the step's other inputs, batch shape) of an EAGLE-3 run."""
    # features.store only selects the stored loss here: nothing is read from it.
    config = load_config(HeadTrainConfig, path, ["features.store=unused"])
    target = resolve_model(config.target)
    kind = head_kind(config, target, Path(tempfile.mkdtemp()))
    # A dataset store's windows are seq_len + 1 tokens (the last one only predicted).
    rows, length = config.batch_size, config.dataset.seq_len + 1 if config.dataset else config.data.seq_len
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
    return steps, params, opt_state, (target.params, batch), [rows, length]


if __name__ == "__main__":
    main()
