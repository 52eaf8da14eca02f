"""Draft distillation (DistillSpec-style): train the draft toward the target's distribution.

Acceptance is set by how close q is to p at the positions the draft actually proposes,
so the draft is trained on a divergence to the frozen target (forward/reverse KL,
generalized JSD, or TV = 1 - acceptance) at the temperature it will be used with, on a
mix of fixed corpus windows, target-generated sequences and the draft's own samples
(on-policy, DistillSpec's main finding). "next_token" is the baseline objective: plain
cross-entropy on the same data, no target involved.

Any target specjax loads can be distilled for, on a user dataset (`dataset`, `--data FILE`:
training/run_data.py): the fixed windows are then the dataset's, tokenized with the
target's tokenizer and masked to its targets (a chat's assistant tokens), generated rows
start from their first `prompt_len` tokens, and held-out acceptance is measured on the
dataset's validation prompts. A draft must share the target's vocabulary: a smaller
pretrained one of the same family (`draft`), or `draft_init: config`, a fresh draft of the
target's architecture and tokenizer sized by `draft_config`.

`parallel.enabled` trains the draft into a parallel (PARD) drafter instead: every batch is
one packed forward of real tokens plus mask groups (training/parallel_objective.py), on the
same objectives and data; held-out acceptance is ParallelDraft's at K = num_masks + 1, and
the saved draft records its mask token.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from specjax.api import generate
from specjax.config import GenerationConfig, SpeculativeConfig
from specjax.drafters.layer_skip import early_exit
from specjax.drafters.parallel_draft import ParallelDraft
from specjax.io.model import Model
from specjax.models import ModelConfig, full_forward, init_params
from specjax.training.data import DataConfig, training_batch
from specjax.training.datasets import DatasetConfig, dataset_batch
from specjax.training.divergences import DIVERGENCES, get_divergence
from specjax.training.mixed_precision import cast_floats, check_compute_dtype, compute_copy
from specjax.training.parallel_objective import ParallelTrainConfig, parallel_step, resolve_mask_token_id, split_points
from specjax.training.run_data import eval_prompts, report_dataset
from specjax.training.run_dirs import open_run, resume_or_start
from specjax.training.sharded_steps import MeshSteps, check_mesh
from specjax.training.train import OptimConfig, make_optimizer

OBJECTIVES = (*DIVERGENCES, "next_token")
DRAFT_INITS = ("pretrained", "random", "config", "target_layers")
FROZEN_WITHOUT_EMBEDDING = ("embed", "lm_head")  # the params train_embedding: false leaves as they start


@functools.lru_cache(maxsize=8)
def _optimizer_without_embedding(optim: OptimConfig, steps: int) -> optax.GradientTransformation:
    """`make_optimizer`, with the embedding and LM head frozen (updates of zero, no moments):
    one object per (settings, steps), as the jitted step takes it as a static argument."""

    def labels(params):
        label = {k: "frozen" if k in FROZEN_WITHOUT_EMBEDDING else "train" for k in params}
        return {k: jax.tree.map(lambda _, name=label[k]: name, v) for k, v in params.items()}

    return optax.multi_transform({"train": make_optimizer(optim, steps), "frozen": optax.set_to_zero()}, labels)


@dataclasses.dataclass(frozen=True)
class DistillDataConfig:
    """Where training sequences come from; the three fractions are normalised to sum to 1."""

    corpus: float = 1.0  # fixed windows of the training split (the corpus's, or the dataset's)
    target_generated: float = 0.0  # prompts from those windows continued by the target
    draft_generated: float = 0.0  # ... continued by the current draft (on-policy)
    seq_len: int = 128  # tokens per row; with a dataset, dataset.seq_len + 1 instead (DistillConfig.stream)
    prompt_len: int = 32  # window prefix that generated continuations start from
    batch_size: int = 16  # rows per batch; with a dataset, dataset.batch_size instead
    generation_temperature: float = 1.0

    def __post_init__(self):
        fractions = (self.corpus, self.target_generated, self.draft_generated)
        if min(fractions) < 0 or sum(fractions) <= 0:
            raise ValueError(f"data fractions must be >= 0 with a positive sum, got {fractions}")
        if not 1 <= self.prompt_len < self.seq_len:
            raise ValueError(f"need 1 <= prompt_len < seq_len, got {self.prompt_len} and {self.seq_len}")
        if self.batch_size < 1 or self.generation_temperature < 0:
            raise ValueError("batch_size must be >= 1 and generation_temperature >= 0")

    def rows(self) -> dict[str, int]:
        """Rows per source in each batch (largest remainder, deterministic)."""
        fractions = np.array([self.corpus, self.target_generated, self.draft_generated], np.float64)
        exact = fractions / fractions.sum() * self.batch_size
        counts = np.floor(exact).astype(int)
        for i in np.argsort(-(exact - counts))[: self.batch_size - counts.sum()]:
            counts[i] += 1
        return dict(zip(("corpus", "target", "draft"), counts.tolist(), strict=True))


@dataclasses.dataclass(frozen=True)
class DistillEvalConfig:
    every: int = 100
    prompts: int = 16  # held-out prompts from the validation split (the corpus's code, or the dataset's)
    prompt_bytes: int = 64  # corpus prompts; a text dataset's prompts are this many tokens (chats: their own)
    max_new_tokens: int = 48
    num_speculative_tokens: int = 4  # with parallel enabled, K = parallel.num_masks + 1 instead


@dataclasses.dataclass(frozen=True)
class DraftShapeConfig:
    """`draft_config` of draft_init "config": the target's ModelConfig (family, vocabulary,
    rotary settings, context) with these sizes; 0 keeps the target's value."""

    num_hidden_layers: int = 1
    hidden_size: int = 0
    intermediate_size: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0

    def __post_init__(self):
        values = dataclasses.asdict(self)
        if self.num_hidden_layers < 1 or min(values.values()) < 0:
            raise ValueError(f"draft_config sizes must be >= 0 (0: the target's) and num_hidden_layers >= 1: {values}")

    def model_config(self, target: ModelConfig) -> ModelConfig:
        changes = {name: value for name, value in dataclasses.asdict(self).items() if value}
        if target.layer_types is not None:  # per-layer attention kinds: the target's pattern, cut or repeated
            kinds = target.layer_types
            changes["layer_types"] = tuple(kinds[i % len(kinds)] for i in range(self.num_hidden_layers))
        try:
            return target.replace(**changes)
        except (TypeError, ValueError) as e:
            raise ValueError(f"draft_config {changes} makes no valid draft of the target's architecture: {e}") from None


@dataclasses.dataclass(frozen=True)
class DistillConfig:
    target: str = "stdlib-target"  # anything load_model reads (embedded name, HF directory, GGUF file); frozen
    draft: str = "stdlib-draft-pretrained"  # starting draft: embedded name or HF directory (not with draft_init config)
    # "pretrained" (the draft's weights), "random" (its architecture only), "config": a fresh
    # draft of the target's architecture and tokenizer sized by draft_config, or
    # "target_layers": the target's own first draft_config.num_hidden_layers layers with its
    # embedding, final norm and LM head (layer skip's network, copied, then trained)
    draft_init: str = "pretrained"
    draft_config: DraftShapeConfig = dataclasses.field(default_factory=DraftShapeConfig)
    # A user dataset to train on instead of the corpus (`--data FILE`, training/run_data.py)
    dataset: DatasetConfig | None = None
    objective: str = "forward_kl"  # forward_kl | reverse_kl | jsd | tv | next_token
    beta: float = 0.5  # jsd only
    temperature: float = 1.0  # distil toward the target at the temperature the draft will sample with
    data: DistillDataConfig = dataclasses.field(default_factory=DistillDataConfig)
    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(learning_rate=1e-3, warmup_steps=20))
    eval: DistillEvalConfig = dataclasses.field(default_factory=DistillEvalConfig)
    steps: int = 300
    seed: int = 0
    checkpoint_every: int = 50
    keep_checkpoints: int = 1  # the newest checkpoints kept in OUT/checkpoints (training/run_dirs.py)
    log_every: int = 10
    # Train over a device mesh, "data=8" or "data=2,model=4" (specjax.make_mesh): the target,
    # and the draft when its heads split, tensor parallel over "model"; each batch's rows split
    # over "data" (it must divide the batch size) (training/sharded_steps.py). None: one device.
    mesh: str | None = None
    # false: the draft's embedding and LM head stay as they start (with draft_init
    # target_layers, the target's own), and OUT/draft_shared is also written: the draft less
    # those tensors, which load_model takes from the target (io/shared_weights.py)
    train_embedding: bool = True
    # Mask-token training into a parallel (PARD) drafter (training/parallel_objective.py); disabled: plain distillation
    parallel: ParallelTrainConfig = dataclasses.field(default_factory=ParallelTrainConfig)
    # "float32", or "bfloat16": the draft's products in bfloat16, its weights and optimizer
    # float32 (mixed precision, training/mixed_precision.py); the target as it is.
    compute_dtype: str = "float32"

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; choose one of {', '.join(OBJECTIVES)}")
        if self.draft_init not in DRAFT_INITS:
            raise ValueError(f"draft_init must be one of {', '.join(DRAFT_INITS)}, got {self.draft_init!r}")
        for name in ("steps", "checkpoint_every", "keep_checkpoints", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        get_divergence("tv" if self.objective == "next_token" else self.objective, self.temperature, self.beta)
        check_compute_dtype("compute_dtype", self.compute_dtype)
        check_mesh(self.mesh, self.stream().batch_size)  # stream(): checks prompt_len against a dataset's rows
        self.parallel.check_window(self.stream().seq_len)

    def stream(self) -> DistillDataConfig:
        """`data` with the rows batches really have: with a dataset, its windows (seq_len + 1
        tokens, seq_len predicted) and batch_size rows. Without generated rows prompt_len is
        not used, so it is cut to fit a short window rather than refused."""
        if self.dataset is None:
            return self.data
        data, length = self.data, self.dataset.seq_len + 1
        if not (data.target_generated or data.draft_generated):
            data = dataclasses.replace(data, prompt_len=min(data.prompt_len, length - 1))
        elif not data.prompt_len < length:
            raise ValueError(
                f"data.prompt_len {data.prompt_len} must be < dataset.seq_len + 1 = {length}: generated rows "
                "continue the first prompt_len tokens of a dataset window"
            )
        return dataclasses.replace(data, seq_len=length, batch_size=self.dataset.batch_size)


def distillation_loss(
    objective, temperature, beta, draft_config, target_config, draft_params, target_params, tokens, mask
):
    """Mean objective over masked positions of tokens [B, T]; mask [B, T-1] marks predicted
    positions. The draft runs in draft_config.dtype (its float32 weights cast: mixed precision)."""
    inputs = tokens[:, :-1]
    draft_logits = full_forward(draft_config, cast_floats(draft_params, draft_config.dtype), inputs)  # [B, T-1, V]
    if objective == "next_token":
        per_position = optax.softmax_cross_entropy_with_integer_labels(draft_logits, tokens[:, 1:])
    else:
        target_logits = jax.lax.stop_gradient(full_forward(target_config, target_params, inputs))
        per_position = get_divergence(objective, temperature, beta)(target_logits, draft_logits)
    return jnp.sum(per_position * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _step(static, optimizer, target_params, draft_params, opt_state, tokens, mask):
    objective, temperature, beta, draft_config, target_config = static
    loss, grads = jax.value_and_grad(
        lambda p: distillation_loss(
            objective, temperature, beta, draft_config, target_config, p, target_params, tokens, mask
        )
    )(draft_params)
    updates, opt_state = optimizer.update(grads, opt_state, draft_params)
    return optax.apply_updates(draft_params, updates), opt_state, loss


def distillation_batch(config: DistillConfig, target: Model, draft: Model, step: int):
    """tokens [B, seq_len] and loss mask [B, seq_len - 1] for `step`; a pure function of (seed, step, draft).
    (B, seq_len) are `config.stream()`'s; mask[:, t] weighs the prediction at t of token t + 1.

    Generated rows are masked to their continuation: the draft learns where it will
    propose, not on the prompt it is given. Dataset rows keep the dataset's mask (the
    corpus has none: every position).
    """
    data = config.stream()
    rows = data.rows()
    if config.dataset is None:
        corpus_config = DataConfig(seq_len=data.seq_len - 1, batch_size=data.batch_size, prose_fraction=0.0)
        windows = training_batch(corpus_config, config.seed, step)  # [B, seq_len]
        masks = np.ones((data.batch_size, data.seq_len - 1), np.float32)
    else:
        windows, targets = dataset_batch(config.dataset, target.tokenizer, config.seed, step)  # [B, seq_len] both
        windows = np.array(windows)  # its own copy: generated rows are written into it
        masks = targets[:, 1:].astype(np.float32)  # [B, seq_len - 1]: aligned mask -> predicted positions
    start = rows["corpus"]
    for source, model in (("target", target), ("draft", draft)):
        count = rows[source]
        if not count:
            continue
        prompts = windows[start : start + count, : data.prompt_len].tolist()
        seed = (config.seed * 1_000_003 + step * 2 + (source == "draft")) % 2**31
        settings = dict(max_new_tokens=data.seq_len - data.prompt_len, seed=seed, ignore_eos=True)  # fixed windows
        out = generate(model, prompts, GenerationConfig.at_temperature(data.generation_temperature, **settings))
        windows[start : start + count, data.prompt_len :] = np.asarray(out.tokens, np.int32)
        masks[start : start + count] = 1.0  # the continuation is the model's: all of it is learned
        masks[start : start + count, : data.prompt_len - 1] = 0.0
        start += count
    return windows, masks


def acceptance(config: DistillConfig, target: Model, draft: Model, prompts: list[str]) -> dict:
    """Held-out mean acceptance length and rate of `draft` against `target`, greedy and sampled
    (with parallel enabled: as a ParallelDraft, its mask the one `draft` records, K = num_masks + 1)."""
    drafter, k = draft, config.eval.num_speculative_tokens
    if config.parallel.enabled:
        drafter, k = ParallelDraft(draft), config.parallel.num_masks + 1
    out = {}
    for name, temperature in (("greedy", 0.0), ("sampled", config.temperature)):
        settings = GenerationConfig.at_temperature(
            temperature, max_new_tokens=config.eval.max_new_tokens, seed=config.seed, ignore_eos=True
        )
        speculative = SpeculativeConfig(num_speculative_tokens=k)
        stats = generate(target, prompts, settings, draft=drafter, speculative=speculative).stats
        out[f"mean_acceptance_length_{name}"] = stats.mean_acceptance_length
        out[f"acceptance_rate_{name}"] = stats.acceptance_rate
    return out


def _start_draft(config: DistillConfig, target: Model) -> Model:
    """The draft training starts from: `draft` (its weights, or its architecture freshly
    drawn), with draft_init "config" one of the target's architecture and tokenizer, or with
    "target_layers" a copy of the target's first layers."""
    from specjax.io.presets import resolve_model

    if config.draft_init == "config":
        draft_config = config.draft_config.model_config(target.config)
        # trained_context: the rows it learns from, so generation warns past them.
        trained = config.stream().seq_len
        return Model(draft_config, init_params(draft_config, config.seed), target.tokenizer, trained)
    if config.draft_init == "target_layers":
        shape, n = config.draft_config, config.draft_config.num_hidden_layers
        if any(v for k, v in dataclasses.asdict(shape).items() if k != "num_hidden_layers"):
            raise ValueError(
                f"draft_init target_layers keeps the target's sizes: set only draft_config.num_hidden_layers ({shape})"
            )
        if not n < target.config.num_hidden_layers:
            raise ValueError(
                f"draft_config.num_hidden_layers {n} must be < the target's {target.config.num_hidden_layers}"
            )
        _, params = early_exit(target.config, target.params, n)
        params = jax.tree.map(jnp.array, params)  # copies: the step donates the draft's buffers, never the target's
        return Model(shape.model_config(target.config), params, target.tokenizer, target.trained_context)
    start = resolve_model(config.draft)
    if target.config.vocab_size != start.config.vocab_size:
        raise ValueError(
            f"draft vocab_size {start.config.vocab_size} != target vocab_size {target.config.vocab_size}: "
            "the draft must share the target's tokenizer; set draft_init=config for a fresh draft of the "
            "target's architecture (sized by draft_config), or draft=<a model with its vocabulary>"
        )
    params = start.params if config.draft_init == "pretrained" else init_params(start.config, config.seed)
    return Model(start.config, params, tokenizer=start.tokenizer, trained_context=start.trained_context)


def distill(config: DistillConfig, out_dir: str | Path, progress: bool = True, stop_after: int | None = None) -> dict:
    """Distil (or resume distilling) into `out_dir`; returns the results dict.

    Writes checkpoints, metrics.jsonl (loss, and held-out acceptance every eval.every
    steps), the distilled draft in HF format under `draft/`, and results.json.
    """
    from specjax.io.hf import save_model
    from specjax.io.presets import resolve_model
    from specjax.io.shared_weights import save_model_sharing

    out_dir = open_run(out_dir, config, "distill_config.yaml")
    mesh = MeshSteps(config.mesh, config.stream().batch_size)  # first: a mesh of devices that do not exist fails now
    target = loaded = resolve_model(config.target)
    if config.dataset is not None:
        report_dataset(config.dataset, target.tokenizer, out_dir)
    start_draft = _start_draft(config, target)  # from the target as loaded (its kv heads, not the mesh's)
    draft_config: ModelConfig = start_draft.config
    parallel = config.parallel
    if parallel.enabled:  # the draft carries its mask token: the eval's ParallelDraft and the saved config.json read it
        mask_id = resolve_mask_token_id(parallel, target.tokenizer or start_draft.tokenizer, draft_config.vocab_size)
        start_draft = dataclasses.replace(start_draft, mask_token_id=mask_id)
    as_draft = lambda params: dataclasses.replace(start_draft, params=params)  # noqa: E731
    initial = start_draft.params
    target = mesh.target(target)  # on the mesh (unchanged without one): steps, batches and evaluation run on it
    optimizer = (make_optimizer if config.train_embedding else _optimizer_without_embedding)(config.optim, config.steps)
    params, opt_state, start, checkpoints, metrics = resume_or_start(
        out_dir, initial, optimizer, config.checkpoint_every, config.keep_checkpoints
    )
    # On a mesh: the draft laid out as the target when it splits (else replicated), its
    # optimizer state alike. Without one, restored arrays are made uncommitted as fresh ones are
    # (jit keys on that), so a run resumed in this process reuses the programs compiled here.
    params, opt_state = mesh.state(params, opt_state, restored=bool(start), layout=mesh.layout(draft_config))
    # Validation prompts: the test split stays untouched for the final quality report.
    prompts = eval_prompts(config.dataset, target.tokenizer, config.eval.prompts, config.eval.prompt_bytes)
    if start == 0:
        metrics.write({"step": 0, **acceptance(config, target, as_draft(initial), prompts)})

    # The losses run the draft in its config's dtype: compute_dtype's copy of it (mixed precision).
    computed, _ = compute_copy(config.compute_dtype, draft_config, {})
    static = (config.objective, config.temperature, config.beta, computed, target.config)
    step_fn = mesh.jit(_step, params, opt_state, metrics=1)
    if parallel.enabled:
        static = (*static[:3], parallel, start_draft.mask_token_id, *static[3:])
        step_fn = mesh.jit(parallel_step, params, opt_state, metrics=2)
    end = config.steps if stop_after is None else min(config.steps, start + stop_after)
    clock = time.perf_counter()
    for step in tqdm(range(start, end), initial=start, total=config.steps, disable=not progress, desc="distill"):
        batch = distillation_batch(config, target, as_draft(params), step)
        if parallel.enabled:  # + split points, then (loss, per-offset losses)
            batch = (*batch, split_points(parallel, batch[1], config.seed, step))
        params, opt_state, loss, *offsets = step_fn(
            static, optimizer, target.params, params, opt_state, *mesh.rows(*batch)
        )
        done = step + 1
        if done % config.log_every == 0 or done % config.eval.every == 0 or done == config.steps:
            row = {"step": done, "loss": float(loss), "seconds": time.perf_counter() - clock}
            if offsets:  # offset 0: the ordinary next-token term; i: the i-th mask's
                row["loss_per_offset"] = [round(float(x), 6) for x in offsets[0]]
            if done % config.eval.every == 0 or done == config.steps:
                row.update(acceptance(config, target, as_draft(params), prompts))
            metrics.write(row)
        checkpoints.save(done, {"params": params, "opt_state": opt_state}, force=done == end)
    checkpoints.close()
    if end < config.steps:
        return {"completed_steps": end}

    rows = metrics.rows()
    before = rows[0]
    after = next(r for r in reversed(rows) if "mean_acceptance_length_greedy" in r)
    draft_dir = save_model(as_draft(params), out_dir / "draft")
    if not config.train_embedding and config.draft_init == "target_layers":
        save_model_sharing(as_draft(params), out_dir / "draft_shared", config.target, loaded, dtype="bfloat16")
    results = {
        "objective": config.objective,
        "steps": config.steps,
        "mean_acceptance_length_before": before["mean_acceptance_length_greedy"],
        "mean_acceptance_length_after": after["mean_acceptance_length_greedy"],
        "mean_acceptance_length_sampled_before": before["mean_acceptance_length_sampled"],
        "mean_acceptance_length_sampled_after": after["mean_acceptance_length_sampled"],
        "acceptance_rate_before": before["acceptance_rate_greedy"],
        "acceptance_rate_after": after["acceptance_rate_greedy"],
        "draft": str(draft_dir),
        **({"dataset": config.dataset.path} if config.dataset is not None else {}),
        **(
            {"parallel_k": parallel.num_masks + 1, "mask_token_id": start_draft.mask_token_id}
            if parallel.enabled
            else {}
        ),
        "eval": dataclasses.asdict(config.eval),
    }
    (out_dir / "results.json").write_text(json.dumps(results, indent=2))
    return results
