"""Training draft heads on a frozen target's hidden states (`specjax train-head`).

The kinds (Medusa, EAGLE, EAGLE-3, block heads, DSpark, DFlash 2) differ in their initial
params, drafter and loss only: training/head_kinds.py builds those; this module runs any of
them.

With `dataset` (a user file, tokenized with the target's tokenizer: training/run_data.py)
the windows are the dataset's, and every loss takes its mask over predicted positions
(mask[:, q]: the token at q + 1 is a target, e.g. an assistant token), so a head is scored
only where the target would generate; held-out acceptance is measured on the dataset's
validation prompts. Without one the losses get no mask and compute what they always did.

The run directory is the same machinery as `train` and `distill`: the resolved config,
orbax checkpoints (exact resume after a kill), metrics.jsonl with held-out acceptance every
`eval.every` steps, and the trained head saved with `save_drafter` under OUT/head.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import jax
import numpy as np
import optax
from tqdm.auto import tqdm

from specjax.api import generate
from specjax.config import GenerationConfig, SpeculativeConfig
from specjax.drafters.formats.native import save_drafter
from specjax.io.model import Model
from specjax.models import ModelConfig
from specjax.models.heads import head_config
from specjax.training.block_objective import BlockHeadConfig
from specjax.training.data import DataConfig, training_batch
from specjax.training.datasets import DatasetConfig
from specjax.training.dflash2_objective import DFlash2HeadConfig
from specjax.training.draft_vocab import FILE as DRAFT_VOCAB_FILE
from specjax.training.dspark_objective import DSparkHeadConfig
from specjax.training.eagle3_objective import Eagle3Config
from specjax.training.feature_store import FeatureStoreConfig

# The kinds' losses and builders, importable from here as before the split (scripts, tests).
from specjax.training.head_kinds import (
    BLOCK_KINDS,
    KINDS,
    Kind,
    eagle3_setup,
    eagle_loss,
    eagle_objective,
    head_kind,
    medusa_loss,
)
from specjax.training.run_data import dataset_batches, eval_prompts, predicted_mask, report_dataset
from specjax.training.run_dirs import open_run, resume_or_start
from specjax.training.sharded_steps import MeshSteps, check_mesh
from specjax.training.stored_features import build_store, check_storable, stored_batches
from specjax.training.train import OptimConfig, make_optimizer

__all__ = ["EagleHeadConfig", "HeadTrainConfig", "Kind", "eagle_loss", "eagle_objective", "medusa_loss", "train_head"]
_kind, _eagle3_setup = head_kind, eagle3_setup  # the names tests and scripts import
# The jitted step's static arguments, make_optimizer's cached optimizer and a loss that compares
# by value (TTTLoss), make it compile once for equal runs in a process.


_LAYER_SIZES = ("num_attention_heads", "num_key_value_heads", "intermediate_size")  # head_config's order


@dataclasses.dataclass(frozen=True)
class EagleHeadConfig:
    """The EAGLE head's one decoder layer (its width is the target's) and its loss weights.

    num_attention_heads, num_key_value_heads, intermediate_size: 0 keeps the target's value
    (as distill's draft_config), so one config sizes the head for any target; the defaults
    are sized for the embedded 5M target."""

    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    intermediate_size: int = 256
    feature_weight: float = 1.0
    token_weight: float = 0.1
    # () reads the final-norm feature (EAGLE); block indices (low, mid, high) read those
    # blocks' outputs concatenated (EAGLE-3), and training unrolls one step (models/heads.py unrolled).
    feature_layers: tuple[int, ...] = ()
    # enabled: the published EAGLE-3 network and its training-time test instead
    # (training/eagle3_objective.py); feature_layers then default to the published (HF 2, L//2,
    # L-3), and feature_weight / token_weight above are not used (eagle3 has its own).
    eagle3: Eagle3Config = dataclasses.field(default_factory=Eagle3Config)

    def __post_init__(self):
        sizes = {name: getattr(self, name) for name in _LAYER_SIZES}
        if min(sizes.values()) < 0:
            raise ValueError(f"eagle head sizes must be >= 0 (0: the target's): {sizes}")

    def layer(self, target: ModelConfig) -> ModelConfig:
        """The head's one-layer config for `target`, a size of 0 taken from the target."""
        sizes = [getattr(self, name) or getattr(target, name) for name in _LAYER_SIZES]
        return head_config(target, *sizes)


@dataclasses.dataclass(frozen=True)
class HeadEvalConfig:
    every: int = 100
    prompts: int = 16  # held-out prompts from the validation split (the corpus's code, or the dataset's)
    prompt_bytes: int = 64  # corpus prompts; a text dataset's prompts are this many tokens (chats: their own)
    max_new_tokens: int = 48
    num_speculative_tokens: int = 4


@dataclasses.dataclass(frozen=True)
class HeadTrainConfig:
    target: str = "stdlib-target"  # embedded name or HF directory; frozen
    kind: str = "medusa"
    num_heads: int = 4  # Medusa only
    eagle: EagleHeadConfig = dataclasses.field(default_factory=EagleHeadConfig)
    # kind block: a DFlash-style block head (training/block_objective.py)
    block: BlockHeadConfig = dataclasses.field(default_factory=BlockHeadConfig)
    # kind dspark: a DSpark head, the block head plus a Markov and a confidence head
    # (training/dspark_objective.py); `dspark` takes `block`'s fields and its own.
    dspark: DSparkHeadConfig = dataclasses.field(default_factory=DSparkHeadConfig)
    # kind dflash2: a DFlash 2 head, the block head plus a two-tap dynamic convolution and a
    # selector over the block's top paths (training/dflash2_objective.py).
    dflash2: DFlash2HeadConfig = dataclasses.field(default_factory=DFlash2HeadConfig)
    data: DataConfig = dataclasses.field(default_factory=lambda: DataConfig(seq_len=128, batch_size=16))
    # A user dataset to train on instead of the corpus (`--data FILE`); its seq_len and
    # batch_size then shape the batches, and `data` is not read.
    dataset: DatasetConfig | None = None
    optim: OptimConfig = dataclasses.field(
        default_factory=lambda: OptimConfig(learning_rate=1e-3, warmup_steps=20, weight_decay=0.0)
    )
    eval: HeadEvalConfig = dataclasses.field(default_factory=HeadEvalConfig)
    steps: int = 300
    seed: int = 0
    checkpoint_every: int = 50
    keep_checkpoints: int = 1  # the newest checkpoints kept in OUT/checkpoints (training/run_dirs.py)
    log_every: int = 10
    # Train over a device mesh, "data=8" or "data=2,model=4" (specjax.make_mesh): the target
    # tensor parallel over "model", each batch's rows split over "data" (it must divide the
    # batch size); the head replicated (training/sharded_steps.py). None: one device.
    mesh: str | None = None
    # features.store: train from a feature store (training/feature_store.py, built by `specjax
    # store-features`) instead of running the target every step; EAGLE-3 (eagle.eagle3) and the
    # block kinds (block, dspark, dflash2: training/block_store.py) only.
    features: FeatureStoreConfig = dataclasses.field(default_factory=FeatureStoreConfig)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown head kind {self.kind!r}; choose one of {', '.join(KINDS)}")
        for name in ("num_heads", "steps", "checkpoint_every", "keep_checkpoints", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.eagle.eagle3.enabled and self.kind != "eagle":
            raise ValueError(f"eagle.eagle3.enabled trains an EAGLE head: set kind=eagle (got kind={self.kind})")
        if self.features.store is not None:
            check_storable(self)
        check_mesh(self.mesh, self.batch_size)
        if self.kind in BLOCK_KINDS:
            seq_len = self.data.seq_len if self.dataset is None else self.dataset.seq_len
            getattr(self, self.kind).check_window(seq_len)

    @property
    def batch_size(self) -> int:
        """Rows per batch: the dataset's with one, else the corpus's."""
        return self.data.batch_size if self.dataset is None else self.dataset.batch_size


def _step(loss_fn, optimizer, target_params, params, opt_state, tokens, mask=None):
    # No mask (the corpus): the loss is called as it always was, and computes the same.
    masked = {} if mask is None else {"mask": mask}
    (loss, parts), grads = jax.value_and_grad(lambda p: loss_fn(target_params, p, tokens, **masked), has_aux=True)(
        params
    )
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, parts


def _batches(config: HeadTrainConfig, target: Model):
    """step -> (tokens int32 [B, L], mask float32 [B, L] over predicted positions, or None for
    the corpus, whose every position is scored)."""
    if config.dataset is None:
        return lambda step: (training_batch(config.data, config.seed, step), None)
    batches = dataset_batches(config.dataset, target.tokenizer, config.seed)

    def batch(step):
        tokens, mask = batches(step)  # mask aligned with the tokens
        return tokens, predicted_mask(mask)

    return batch


def _stored_batches(config: HeadTrainConfig, target: Model, out_dir: Path):
    """`_batches` read from the run's feature store (training/stored_features.py)."""
    return stored_batches(config, target, out_dir, _batches(config, target))


def store_features(config: HeadTrainConfig, out_dir: str | Path, progress: bool = True, stop_after=None) -> dict:
    """Build (or finish, after a kill) the feature store of `config`'s run in `out_dir`
    (`specjax store-features`). stop_after: at most that many new shards (tests)."""
    from specjax.io.presets import resolve_model

    check_storable(config)  # before the target loads
    return build_store(config, resolve_model(config.target), out_dir, progress, stop_after)


def _parts(names: tuple[str, ...], parts) -> dict:
    values = [np.asarray(x).tolist() for x in parts]  # a float, or a list per head / TTT step
    return {names[0]: values} if len(names) == 1 else dict(zip(names, values, strict=True))


def head_acceptance(config: HeadTrainConfig, target: Model, head, prompts: list[str]) -> dict:
    """Held-out greedy mean acceptance length and rate of `head` at eval K."""
    k = min(config.eval.num_speculative_tokens, getattr(head, "num_heads", 10**6), getattr(head, "block_size", 10**6))
    settings = GenerationConfig(max_new_tokens=config.eval.max_new_tokens, seed=config.seed, ignore_eos=True)
    stats = generate(
        target, prompts, settings, draft=head, speculative=SpeculativeConfig(num_speculative_tokens=k)
    ).stats
    return {
        "mean_acceptance_length_greedy": stats.mean_acceptance_length,
        "acceptance_rate_greedy": stats.acceptance_rate,
    }


def train_head(config: HeadTrainConfig, out_dir: str | Path, progress: bool = True, stop_after: int | None = None):
    """Train (or resume training) a head into `out_dir`; returns the results dict."""
    from specjax.io.presets import resolve_model

    out_dir = open_run(out_dir, config, "head_config.yaml")
    mesh = MeshSteps(config.mesh, config.batch_size)  # first: a mesh of devices that do not exist fails now
    target = resolve_model(config.target)  # as loaded: the saved head fingerprints this one
    if config.dataset is not None:
        report_dataset(config.dataset, target.tokenizer, out_dir)
    placed = mesh.target(target)  # on the mesh (`target` without one): steps and evaluation run on it
    kind = head_kind(config, placed, out_dir)
    as_head, initial = kind.as_head, kind.initial
    optimizer = make_optimizer(config.optim, config.steps)
    params, opt_state, start, checkpoints, metrics = resume_or_start(
        out_dir, initial, optimizer, config.checkpoint_every, config.keep_checkpoints
    )
    # The head replicated on a mesh. Without one, restored arrays are made uncommitted as fresh
    # ones are (jit keys on that), so a run resumed in this process reuses the programs compiled here.
    params, opt_state = mesh.state(params, opt_state, restored=bool(start))
    prompts = eval_prompts(config.dataset, target.tokenizer, config.eval.prompts, config.eval.prompt_bytes)
    if start == 0:
        metrics.write({"step": 0, **head_acceptance(config, placed, as_head(initial), prompts)})

    step_fn = mesh.jit(_step, params, opt_state, metrics=2)
    end = config.steps if stop_after is None else min(config.steps, start + stop_after)
    clock = time.perf_counter()
    batches = _batches(config, target) if config.features.store is None else _stored_batches(config, target, out_dir)
    bar = tqdm(range(start, end), initial=start, total=config.steps, disable=not progress, desc="train-head")
    for step in bar:
        tokens, mask = batches(step)
        if isinstance(tokens, dict):  # a stored batch: the tokens and the target's side, [B, ..] each
            *values, mask = mesh.rows(*tokens.values(), mask)
            tokens = dict(zip(tokens, values, strict=True))
        else:
            tokens, mask = mesh.rows(tokens, mask)
        params, opt_state, loss, parts = step_fn(kind.loss, optimizer, placed.params, params, opt_state, tokens, mask)
        done = step + 1
        if done % config.log_every == 0 or done % config.eval.every == 0 or done == config.steps:
            row = {
                "step": done,
                "loss": float(loss),
                **_parts(kind.part_names, parts),
                "seconds": time.perf_counter() - clock,
            }
            if done % config.eval.every == 0 or done == config.steps:
                row.update(head_acceptance(config, placed, as_head(params), prompts))
            metrics.write(row)
            bar.set_postfix(loss=f"{float(loss):.3f}")
        checkpoints.save(done, {"params": params, "opt_state": opt_state}, force=done == end)
    checkpoints.close()
    if end < config.steps:
        return {"completed_steps": end}
    rows = metrics.rows()
    final = next(r for r in reversed(rows) if "mean_acceptance_length_greedy" in r)
    # The Model, not its config: its weights are fingerprinted so the head refuses another target.
    head_dir = save_drafter(as_head(params), out_dir / "head", target_name=config.target, target=target)
    results = {
        "kind": config.kind,
        "steps": config.steps,
        **_shape_summary(config),
        # The sizes the head got (a 0 in the config is the target's): what the saved head has.
        **({"eagle_layer": _layer_sizes(config.eagle.layer(target.config))} if config.kind == "eagle" else {}),
        "head_parameters": int(sum(x.size for x in jax.tree.leaves(params))),
        "mean_acceptance_length_before": rows[0]["mean_acceptance_length_greedy"],
        "mean_acceptance_length_after": final["mean_acceptance_length_greedy"],
        "head": str(head_dir),
        **({"dataset": config.dataset.path} if config.dataset is not None else {}),
        **({"draft_vocab": _vocab_summary(out_dir)} if config.eagle.eagle3.enabled else {}),
        **({"features": dataclasses.asdict(config.features)} if config.features.store is not None else {}),
        "eval": dataclasses.asdict(config.eval),
    }
    (out_dir / "results.json").write_text(json.dumps(results, indent=2))
    return results


def _shape_summary(config: HeadTrainConfig) -> dict:
    if config.kind == "medusa":
        return {"num_heads": config.num_heads}
    return {config.kind: dataclasses.asdict(getattr(config, config.kind))}


def _layer_sizes(layer: ModelConfig) -> dict:
    return {name: getattr(layer, name) for name in ("hidden_size", *_LAYER_SIZES)}


def _vocab_summary(out_dir: Path) -> dict:
    saved = json.loads((out_dir / DRAFT_VOCAB_FILE).read_text())
    # "counted": what the vocabulary was counted over ("counted_steps" in runs before it)
    keys = ("draft_vocab_size", "vocab_size", "coverage", "counted", "counted_steps")
    return {k: saved[k] for k in keys if k in saved}
