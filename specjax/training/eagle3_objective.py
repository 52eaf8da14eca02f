"""EAGLE-3 as published (Li et al. 2025; SafeAILab/EAGLE `traineagle3/`): the network's init,
the multi-step training-time test (TTT) and its loss.

The network is specjax's EAGLE head with HeadOptions(eagle3=True) (models/heads.py), the
same one a loaded published EAGLE-3 head runs: fc [n * D, D] over the raw concatenated
target states, attention over [input_norm(embed); hidden_norm(g)] with 2D-wide q/k/v, the
residual on g, its own final norm and LM head [D, Vd] over a draft vocabulary
(training/draft_vocab.py).

Training-time test (`traineagle3/cnets.py` Model.forward). Entry e of a window [B, T] is the
head's input at position p = e + 1: (token p, target states at p - 1), W = T - 1 entries.
Step 0 feeds them with the target's states through fc; step k >= 1 feeds entry e the token
at p + k and, as g, the layer's own output (before the norm) of step k - 1 at that entry,
at position p + k. So step k at entry e is draft step k of a chain rooted at position p,
and it attends as decoding would: to step-0 entries at or before e (the verified prefix)
and to its own chain, steps 1..k at entry e (`_visible`). Every step predicts the token at
p + k + 1, and the loss is taken at every step, step k weighing step_decay**k (0.8 in the
published main.py); the gradient flows through the fed-back outputs and the cached keys,
as the published code, which detaches neither (`detach_feedback` stops the first).

Targets over the draft vocabulary, as published: the target's logits restricted to the
draft vocabulary's tokens and renormalised there (softmax over logits[..., t2d]), and the
position dropped from the loss when the target's own top token is outside the draft
vocabulary (t2d[argmax]); the loss is the cross-entropy to that distribution, summed over
the kept positions and divided by all B * W (the published `.mean()`). With a loss mask
(a user dataset's: training/run_data.py predicted_mask), a prediction whose token is not a
target (a prompt, padding) is dropped too, and the division is by the window's scored
positions, which is B * W again when every position is one. The feature loss
(smooth L1 of each step's fed-back output to the target's final-norm feature at its
position) is specjax's option, off by default: the published code computes none.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from specjax.models import ModelConfig, TreeMask, full_forward, graphdef, init_cache, init_params
from specjax.models.heads import SPECJAX_HEAD, HeadOptions, eagle_forward
from specjax.training.draft_vocab import DraftVocab
from specjax.training.mixed_precision import check_compute_dtype, compute_copy


@dataclasses.dataclass(frozen=True)
class Eagle3Config:
    """`eagle.eagle3` of a HeadTrainConfig: train the published EAGLE-3 network instead of
    specjax's reduce-matrix EAGLE-3 mode (which `eagle.feature_layers` alone selects)."""

    enabled: bool = False
    draft_vocab_size: int = 0  # 0: the target's full vocabulary; else the most frequent tokens of the training data
    ttt_steps: int = 7  # steps the head is unrolled on its own outputs (published: Model.length = 7)
    step_decay: float = 0.8  # step k's loss weighs step_decay**k (published: 0.8**k)
    feature_weight: float = 0.0  # the feature loss's weight; 0 as published (no feature loss)
    detach_feedback: bool = False  # stop the gradient through fed-back outputs; False as published
    # "random": lm_head and final_norm drawn fresh, as published. "target": the target's LM head
    # rows of the draft vocabulary and its final norm, so the head starts out reading its own
    # output as the target reads its last state (EAGLE-1's frozen LM head, here trainable): a
    # head trained for hundreds of steps on a CPU, not for epochs, starts much closer.
    lm_head_init: str = "random"
    # "float32", or "bfloat16": mixed precision (training/mixed_precision.py). On the Xeon with
    # AMX a SmolLM2 step took 0.67 of its float32 time (results/feature_store).
    compute_dtype: str = "float32"
    # Which positions of a dataset's windows the loss scores: "targets" (the dataset's: the
    # assistant turns of chats, as SpecForge masks them) or "all" (the prompts too: the
    # target's distribution teaches at every position up to a window's last target, so never
    # the padding). The draft vocabulary is counted over the targets either way: it is what
    # the head proposes.
    score: str = "targets"

    def __post_init__(self):
        if self.draft_vocab_size < 0:
            raise ValueError(
                f"eagle3.draft_vocab_size must be >= 0 (0: the full vocabulary), got {self.draft_vocab_size}"
            )
        if self.ttt_steps < 1:
            raise ValueError(f"eagle3.ttt_steps must be >= 1, got {self.ttt_steps}")
        if self.lm_head_init not in ("random", "target"):
            raise ValueError(f"eagle3.lm_head_init must be 'random' or 'target', got {self.lm_head_init!r}")
        check_compute_dtype("eagle3.compute_dtype", self.compute_dtype)
        if self.score not in ("targets", "all"):
            raise ValueError(f"eagle3.score must be 'targets' or 'all', got {self.score!r}")
        if self.step_decay <= 0 or self.feature_weight < 0:
            raise ValueError(
                f"eagle3.step_decay must be > 0 and feature_weight >= 0, got {self.step_decay}, {self.feature_weight}"
            )


def eagle3_options(draft_vocab_size: int) -> HeadOptions:
    """What a published EAGLE-3 head runs with (as drafters/formats/published._eagle3 loads one):
    fed back before the norm, the first entry hidden (the published head never sees it)."""
    return HeadOptions(eagle3=True, feed_normed=False, hide_first=True, draft_vocab_size=draft_vocab_size)


def init_eagle3_params(
    config: ModelConfig, num_layers: int, vocab: DraftVocab, seed: int = 0, target: tuple | None = None
) -> dict:
    """fc [n * D, D], one layer with q/k/v [2D, heads, d_head], hidden_norm, final_norm and
    lm_head [D, Vd] (trainable: d2t is added by the drafter, never trained). Norms start at
    ones and fc / lm_head uniform in +-1/sqrt(fan_in), as torch's nn.Linear, which the
    published code keeps; the layer's kernels at std 0.02, as every specjax layer.
    target: (target ModelConfig, target params) to start lm_head and final_norm from the
    target's (Eagle3Config.lm_head_init "target"): lm_head [D, Vd] = its LM head's columns
    of the draft vocabulary's tokens.

    Drawn with numpy from the layer's abstract shapes: eager jax.random would compile one
    small program per shape (seconds, for a head that trains for minutes or a test)."""
    d, dtype = config.hidden_size, np.dtype(config.dtype)
    rng = np.random.default_rng([seed, 3])
    shapes = jax.eval_shape(lambda: init_params(config, seed))  # the Block's layout, nothing allocated
    ((_, layer),) = shapes["layers"].items()

    def fresh(path, leaf):
        name = path[-1].key
        if name == "scale":  # a norm: identity
            return np.ones(leaf.shape, dtype)
        if name == "bias":
            return np.zeros(leaf.shape, dtype)
        shape = (
            (2 * d, *leaf.shape[1:]) if name in ("q_proj", "k_proj", "v_proj") else leaf.shape
        )  # [2D, heads, d_head]
        return (0.02 * rng.standard_normal(shape)).astype(dtype)

    def linear(fan_in, fan_out):
        bound = 1.0 / np.sqrt(fan_in)
        return rng.uniform(-bound, bound, (fan_in, fan_out)).astype(dtype)

    params = {
        "fc": linear(num_layers * d, d),  # [n * D, D]
        "layers": {"0": jax.tree_util.tree_map_with_path(fresh, layer)},  # as a saved head loads back
        "hidden_norm": {"scale": np.ones((d,), dtype)},
        "final_norm": jax.tree.map(lambda leaf: np.ones(leaf.shape, dtype), shapes["final_norm"]),
        "lm_head": linear(d, vocab.size),  # [D, Vd]
    }
    if target is not None:
        target_config, target_params = target
        ids = np.asarray(vocab.tokens)
        if target_config.tie_word_embeddings:
            lm_head = np.asarray(target_params["embed"])[ids].T  # embed [V, D] -> [D, Vd]
        else:
            lm_head = np.asarray(target_params["lm_head"])[:, ids]  # [D, V] -> [D, Vd]
        params["lm_head"] = lm_head.astype(dtype)
        params["final_norm"] = jax.tree.map(lambda x: np.asarray(x).astype(dtype), target_params["final_norm"])
    return jax.tree.map(jnp.asarray, params)


def _visible(width: int, step: int) -> np.ndarray:
    """[W, (step + 1) * W]: entry e at TTT step `step` sees step-0 entries <= e and its own
    entry at steps 1..step (the cache holds step m's entries at slots m * W ..)."""
    causal = np.tril(np.ones((width, width), bool))
    return np.concatenate([causal] + [np.eye(width, dtype=bool)] * step, axis=1)


def _ahead(x, k: int, width: int):
    """x [B, T, ..] -> [B, W, ..]: x at entry e's position p + k = e + 1 + k, zeros past the end."""
    part = x[:, 1 + k : 1 + k + width]
    pad = jnp.zeros((x.shape[0], width - part.shape[1], *x.shape[2:]), x.dtype)
    return jnp.concatenate([part, pad], axis=1)


def ttt_passes(
    config, options: HeadOptions, params, target_params, tokens, multi, steps: int, detach=False, draft_ids=None
):
    """The head unrolled `steps` TTT steps: tokens [B, T], target states multi [B, T, n * D]
    -> (logits [N, B, W, V], fed-back outputs [N, B, W, D]), W = T - 1. `draft_ids` [Vd]:
    the logits over the draft vocabulary only, [N, B, W, Vd] (N V-wide arrays would not fit
    for a large vocabulary)."""
    b, t = tokens.shape
    width = t - 1
    # This call lays out its own slots (step m's entries at m * W + e) and never feeds
    # position 0, so the first-entry shift of hide_first is not needed; the math is the same.
    options = dataclasses.replace(options, hide_first=False)
    # One block as wide as the cache: attention takes the masked full path (differentiable,
    # one einsum), not the block loop.
    cache = init_cache(config, b, steps * width, block_size=steps * width)
    entry = jnp.arange(width, dtype=jnp.int32)
    previous = multi[:, :width]  # [B, W, n * D]: the target states at p - 1
    # A head with its own draft vocabulary gives its logits over it directly: draft id i is
    # draft_ids[i] (ascending, as DraftVocab.d2t is built), so this equals the gather below
    # of its logits scattered to the target's vocabulary, without the 49k-wide arrays.
    own = draft_ids is not None and bool(options.draft_vocab_size) and options != SPECJAX_HEAD
    all_logits, fed = [], []
    for k in range(steps):
        tree = TreeMask(
            start=jnp.zeros((b,), jnp.int32),
            slots=jnp.broadcast_to(k * width + entry, (b, width)),
            visible=jnp.asarray(_visible(width, k)),
        )
        positions = jnp.broadcast_to(entry + 1 + k, (b, width))  # [B, W]
        step_tokens = _ahead(tokens, k, width)  # [B, W]: the token at p + k (0 past the end, masked)
        logits, cache, out = eagle_forward(
            config, params, target_params, step_tokens, previous, positions, cache, tree, k == 0, options, own
        )
        if draft_ids is not None and not own:
            logits = logits[..., draft_ids]  # [B, W, V] -> [B, W, Vd]
        all_logits.append(logits)  # [B, W, V] or [B, W, Vd]
        fed.append(out)  # [B, W, D]
        previous = jax.lax.stop_gradient(out) if detach else out
    return jnp.stack(all_logits), jnp.stack(fed)


def _target_states(target_config: ModelConfig, target_params, tokens, layers, final: bool):
    """(logits [B, T, V], multi-layer states [B, T, n * D], final-norm features [B, T, D] or
    None) of the frozen target; no gradient."""
    last = target_config.num_hidden_layers - 1
    asked = layers if not final or last in layers else (*layers, last)
    logits, hidden = jax.lax.stop_gradient(full_forward(target_config, target_params, tokens, features=asked))
    d = target_config.hidden_size
    features = None
    if final:
        top = hidden[..., asked.index(last) * d : (asked.index(last) + 1) * d]  # [B, T, D]
        features = nnx.merge(graphdef(target_config), target_params).final_norm(top)
    return logits, hidden[..., : len(layers) * d], features


def target_side(target_config: ModelConfig, target_params, tokens, layers, vocab: DraftVocab, final: bool) -> dict:
    """What the TTT loss reads of the frozen target for tokens [B, T] (no gradient): the
    layers' states "multi" [B, T, n * D], the logits over the draft vocabulary "logits"
    [B, T, Vd], "in_draft" bool [B, T] (the target's own top token, over the full
    vocabulary, is in the draft vocabulary) and with `final` the final-norm features "final"
    [B, T, D]. The same dict a feature store holds (training/feature_store.py), so a stored
    batch and a live one go through the one loss (`ttt_loss_from`)."""
    logits, multi, features = _target_states(target_config, target_params, tokens, layers, final)
    ids = jnp.asarray(vocab.tokens, jnp.int32)  # [Vd]: the draft vocabulary's target ids
    side = {"multi": multi, "logits": logits[..., ids], "in_draft": jnp.asarray(vocab.t2d)[jnp.argmax(logits, -1)]}
    return {**side, "final": features} if final else side


def ttt_loss(
    config: ModelConfig,
    target_config: ModelConfig,
    options: HeadOptions,
    layers: tuple[int, ...],
    vocab: DraftVocab,
    settings: Eagle3Config,
    target_params,
    head_params,
    tokens,
    mask=None,
):
    """The TTT loss on tokens [B, T], the target run here -> (total, parts [P, N]): per step
    the draft-vocabulary cross-entropy (what is minimised), the same as a KL (minus the
    target's entropy: 0 is a perfect head), the top-1 agreement with the target (over
    positions in the window), and with feature_weight > 0 the feature loss (module docstring).

    mask [B, T] over predicted positions (mask[:, q] scores the prediction of the token at
    q + 1, the target's logits[q]), or None: every position, the published loss as it was.
    Step k at entry e predicts from logits[e + 1 + k], so its weight is mask[:, e + 1 + k]."""
    side = target_side(target_config, target_params, tokens, layers, vocab, settings.feature_weight > 0)
    return ttt_loss_from(config, options, vocab, settings, target_params, head_params, tokens, side, mask)


def ttt_loss_from(
    config: ModelConfig,
    options: HeadOptions,
    vocab: DraftVocab,
    settings: Eagle3Config,
    target_params,
    head_params,
    tokens,
    side: dict,
    mask=None,
):
    """`ttt_loss` from the target's side already computed (`target_side`, or read from a
    feature store): target_params is read only for the embedding the head shares."""
    final = settings.feature_weight > 0
    if settings.score == "all" and mask is not None:
        # Every position up to the window's last scored one: the prompts too, never the padding
        # that ends a split's last window (or, unpacked, every record's row). In a packed
        # window the next chat's prompt after its last answer token is left out too.
        mask = jnp.flip(jax.lax.cummax(jnp.flip(mask, axis=1), axis=1), axis=1)
    # Mixed precision (training/mixed_precision.py): the head and the states it reads in compute_dtype.
    config, head_params = compute_copy(settings.compute_dtype, config, head_params)
    if settings.compute_dtype != "float32":
        side = {**side, "multi": side["multi"].astype(settings.compute_dtype)}
    params = {**head_params, **({} if vocab.is_identity else {"d2t": jnp.asarray(vocab.d2t)})}
    ids = jnp.asarray(vocab.tokens, jnp.int32)  # [Vd]: the draft vocabulary's target ids
    steps, detach = settings.ttt_steps, settings.detach_feedback
    multi = side["multi"]
    logits, fed = ttt_passes(config, options, params, target_params, tokens, multi, steps, detach, ids)  # [N, B, W, Vd]
    b, t = tokens.shape
    width = t - 1
    # The published denominator B * W; with a mask, the window's scored positions (step 0's),
    # so a batch with few assistant tokens is not worth less than one with many.
    scored = b * width if mask is None else jnp.maximum(jnp.sum(_ahead(mask, 0, width)), 1.0)
    total, parts = 0.0, []
    for k in range(settings.ttt_steps):
        valid = jnp.broadcast_to(jnp.arange(width) < width - k, (b, width))  # that token is in the window
        if mask is not None:
            valid = valid & (_ahead(mask, k, width) > 0)  # [B, W]: and it is a target
        # As published, only where the target's top-1 (over the full vocabulary) is in the draft vocabulary.
        keep = valid & _ahead(side["in_draft"], k, width)  # [B, W]
        # [B, W, Vd]: the target's guess for token p + k + 1, restricted to the draft vocabulary and renormalised
        teacher = jax.nn.log_softmax(_ahead(side["logits"], k, width), axis=-1)
        student = jax.nn.log_softmax(logits[k], axis=-1)  # [B, W, Vd]
        ce = -jnp.sum(jnp.exp(teacher) * student, axis=-1)  # [B, W]
        entropy = -jnp.sum(jnp.exp(teacher) * teacher, axis=-1)  # [B, W]: ce's floor, for the KL logged beside it
        step_loss = jnp.sum(jnp.where(keep, ce, 0.0)) / scored
        kl = jnp.sum(jnp.where(keep, ce - entropy, 0.0)) / scored
        agree = keep & (jnp.argmax(student, axis=-1) == jnp.argmax(teacher, axis=-1))
        row = [step_loss, kl, jnp.sum(agree) / jnp.maximum(jnp.sum(valid), 1)]
        weight = settings.step_decay**k
        if final:
            target_f = _ahead(side["final"], k, width)  # [B, W, D]: the target's f at p + k
            per = jnp.mean(optax.huber_loss(fed[k], target_f, delta=1.0), axis=-1)  # [B, W]
            feature_loss = jnp.sum(jnp.where(valid, per, 0.0)) / jnp.maximum(jnp.sum(valid), 1)
            row.append(feature_loss)
            step_loss = step_loss + settings.feature_weight * feature_loss
        total = total + weight * step_loss
        parts.append(jnp.stack(row))
    return total, jnp.stack(parts, axis=1)  # [], [P, N]


@dataclasses.dataclass(frozen=True)
class TTTLoss:
    """`ttt_loss` with its settings bound: (target_params, head_params, tokens, mask=None) ->
    (loss, parts). Equal settings make equal objects, so the jitted training step, which takes
    the loss as a static argument, compiles once per process for them (a resume, or tests, in
    one process)."""

    config: ModelConfig
    target_config: ModelConfig
    options: HeadOptions
    layers: tuple[int, ...]
    vocab: DraftVocab
    settings: Eagle3Config

    def __call__(self, target_params, head_params, tokens, mask=None):
        bound = (self.config, self.target_config, self.options, self.layers, self.vocab, self.settings)
        return ttt_loss(*bound, target_params, head_params, tokens, mask)


@dataclasses.dataclass(frozen=True)
class StoredTTTLoss:
    """`ttt_loss_from` with its settings bound, reading the target's side from a stored batch:
    (target_params, head_params, batch, mask=None) -> (loss, parts), batch a dict of "tokens"
    [B, T] and `target_side`'s arrays as a feature store holds them (bfloat16 or float32),
    cast here to what the live target computes in. Hashable, as TTTLoss (a jit static)."""

    config: ModelConfig
    target_config: ModelConfig
    options: HeadOptions
    vocab: DraftVocab
    settings: Eagle3Config

    def __call__(self, target_params, head_params, batch, mask=None):
        dtype = jnp.dtype(self.target_config.dtype)
        side = {
            "multi": batch["multi"].astype(dtype),  # [B, T, n * D]
            "logits": batch["logits"].astype(jnp.float32),  # [B, T, Vd]
            "in_draft": batch["in_draft"].astype(bool),  # [B, T]
            **({"final": batch["final"].astype(dtype)} if "final" in batch else {}),
        }
        bound = (self.config, self.options, self.vocab, self.settings)
        return ttt_loss_from(*bound, target_params, head_params, batch["tokens"], side, mask)
