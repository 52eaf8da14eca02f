"""The kinds of head `specjax train-head` trains: each kind's initial params, drafter and loss.

`head_kind(config, target, out_dir)` is the dispatch; training/train_heads.py runs whatever
it returns (the run directory, batches, steps, evaluation and saving are the same for all).

EAGLE (Li et al. 2024): the head at position p reads (token p, the target's feature at
p - 1) and is trained to regress the target's feature at p (smooth L1) plus a
distillation term, KL(p_target || q_head) for the token at p + 1, weighted as in the paper
(features 1.0, tokens 0.1 by default).

EAGLE-3 as published (`eagle.eagle3.enabled`; training/eagle3_objective.py): fc over three
target layers' raw states, its own LM head over a draft vocabulary picked by frequency in
the training data (training/draft_vocab.py, saved as OUT/draft_vocab.json), trained by the
multi-step training-time test.

DFlash-style block heads (kind: block; training/block_objective.py), DSpark heads, a block
head plus a low-rank Markov head and a confidence head (kind: dspark;
training/dspark_objective.py), and DFlash 2 heads, a block head plus a two-tap dynamic
convolution and a selector over the block's top paths (kind: dflash2;
training/dflash2_objective.py), train on the same windows.

Medusa (Cai et al. 2024): head k at position t is trained toward the target's own
distribution for the token at t + 1 + k, i.e. the target's prediction at position t + k
given the true prefix (self-distillation: KL(p_target || q_head)),
on corpus windows. The target's features and logits are computed on the fly inside the
jitted step: one frozen forward per batch, no backward through it.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import optax

from specjax.drafters.eagle import Eagle
from specjax.drafters.formats.published import eagle3_layers
from specjax.drafters.medusa import Medusa
from specjax.io.model import Model
from specjax.models import ModelConfig, feature_layers, full_forward
from specjax.models.heads import (
    init_eagle_params,
    init_medusa_params,
    medusa_hidden,
    target_logits,
    teacher_forced,
    unrolled,
)
from specjax.training.block_objective import block_head_start
from specjax.training.dflash2_objective import PART_NAMES as DFLASH2_PARTS
from specjax.training.dflash2_objective import dflash2_head_start
from specjax.training.draft_vocab import draft_vocab_for_run, select, token_counts
from specjax.training.dspark_objective import PART_NAMES as DSPARK_PARTS
from specjax.training.dspark_objective import dspark_head_start
from specjax.training.eagle3_objective import (
    StoredTTTLoss,
    TTTLoss,
    eagle3_options,
    init_eagle3_params,
)
from specjax.training.run_data import train_examples

if TYPE_CHECKING:  # train_heads imports this module
    from specjax.training.train_heads import HeadTrainConfig

KINDS = ("medusa", "eagle", "block", "dspark", "dflash2")
BLOCK_KINDS = ("block", "dspark", "dflash2")  # block heads: their config is HeadTrainConfig.<kind>, a BlockHeadConfig


def _mean(values, weights):
    """The mean of values [..] over weights [..] (a loss mask), or the plain mean without one."""
    if weights is None:
        return jnp.mean(values)
    weights = jnp.broadcast_to(weights, values.shape).astype(values.dtype)
    return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def medusa_loss(target_config: ModelConfig, target_params, head_params, tokens, mask=None):
    """Mean over heads and positions of KL(target p at t + k || head k at t): tokens [B, T]
    -> (loss, per-head losses [H]).

    KL is the soft cross-entropy minus the target's entropy, so 0 means a perfect head.
    mask [B, T] over predicted positions (mask[:, q]: the token at q + 1 is a target), or
    None for every position; head k at t predicts the token at t + 1 + k, so it weighs
    mask[:, t + k].

    One head's [B, T, V] logits are alive at a time: a scan over the heads whose body is
    rematerialised (jax.checkpoint), so the backward pass recomputes each head's logits
    rather than keeping all H of them (every head's at once was 17.6 GB on SmolLM2's 49,152
    tokens at the default 16 x 256 batch). Same value and gradient as the per-head formula
    (tests/test_heads.py compares them).
    """
    logits, features = full_forward(target_config, target_params, tokens, features=True)
    teacher = jax.lax.stop_gradient(jax.nn.log_softmax(logits, axis=-1))  # [B, T, V]
    features = jax.lax.stop_gradient(features)  # [B, T, D]
    b, t, d = features.shape
    weights = jnp.ones((b, t), jnp.float32) if mask is None else mask.astype(jnp.float32)  # [B, T]
    positions = jnp.arange(t)

    @jax.checkpoint
    def one_head(carry, head):
        w, bias, k = head  # w [D, D] (or [L, D, D]), bias [D] (or [L, D]), k the head's offset
        # Head k at t guesses the token at t + 1 + k, whose target distribution is teacher[t + k]:
        # shifting its inputs right by k puts that guess at s = t + k. The first k positions
        # wrap around and weigh 0.
        shifted = jnp.roll(features, k, axis=1).reshape(b * t, d)
        hidden = medusa_hidden({"w": w[None], "b": bias[None]}, shifted)[:, 0].reshape(b, t, d)
        student = jax.nn.log_softmax(target_logits(target_config, target_params, hidden), axis=-1)  # [B, T, V]
        kl = jnp.sum(jnp.exp(teacher) * (teacher - student), axis=-1)  # [B, T]
        valid = weights * (positions >= k)
        return carry, jnp.sum(kl * valid) / jnp.maximum(jnp.sum(valid), 1.0)

    num_heads = head_params["w"].shape[0]
    heads = (head_params["w"], head_params["b"], jnp.arange(1, num_heads + 1))
    _, losses = jax.lax.scan(one_head, None, heads)  # [H]
    return jnp.mean(losses), losses


def eagle_loss(
    config: ModelConfig, target_config: ModelConfig, target_params, head_params, tokens, weights, layers=(), mask=None
):
    """EAGLE's loss on tokens [B, T]: (total, [feature smooth-L1, token KL]). A multi-layer
    head (`layers`) averages both over its two unrolled passes ([2, B, T, ..] broadcasts).
    mask [B, T] over predicted positions, or None (`eagle_objective`)."""
    if layers:
        logits, features, head_logits, predicted = unrolled(
            config, head_params, target_config, target_params, tokens, layers
        )
    else:
        logits, features, head_logits, predicted = teacher_forced(
            config, head_params, target_config, target_params, tokens
        )
    return eagle_objective(logits, features, head_logits, predicted, weights, mask)


def eagle_objective(logits, features, head_logits, predicted, weights, mask=None):
    """The loss from the target's logits [B, T, V] and final-norm features [B, T, D] and the
    head's ([B, T, ..] or [2, B, T, ..] unrolled) -> (total, [feature smooth-L1, token KL]).

    The head at p predicts f_p and, from it, the token at p + 1 (the target's logits[p]), so
    both terms at p weigh mask[:, p] (mask [B, T] over predicted positions); None: every one."""
    huber = optax.huber_loss(predicted, features, delta=1.0)
    feature_loss = jnp.mean(huber) if mask is None else _mean(jnp.mean(huber, axis=-1), mask)
    teacher = jax.nn.log_softmax(logits, axis=-1)
    token_kl = _mean(jnp.sum(jnp.exp(teacher) * (teacher - jax.nn.log_softmax(head_logits, axis=-1)), axis=-1), mask)
    feature_weight, token_weight = weights
    return feature_weight * feature_loss + token_weight * token_kl, jnp.stack([feature_loss, token_kl])


@dataclasses.dataclass(frozen=True)
class Kind:
    """What differs between head kinds: initial params, the drafter, the loss and its parts."""

    initial: dict
    as_head: Any  # params -> Drafter
    loss: Any  # (target_params, head_params, tokens, mask=None) -> (loss, parts); hashable (a jit static)
    part_names: tuple[str, ...]


def head_kind(config: HeadTrainConfig, target: Model, out_dir: Path) -> Kind:
    """The initial params, drafter and loss of `config.kind` for `target` (a Model), checked
    before any training; out_dir: the run's (EAGLE-3 keeps its draft vocabulary there)."""
    if config.kind == "medusa":
        dtype = jnp.dtype(target.config.dtype)
        return Kind(
            initial=init_medusa_params(target.config.hidden_size, config.num_heads, config.seed, dtype),
            as_head=lambda params: Medusa(params=params, vocab_size=target.config.vocab_size),
            loss=functools.partial(medusa_loss, target.config),
            part_names=("loss_per_head",),
        )
    if config.kind == "block":
        return _block_kind(config, target)
    if config.kind == "dspark":
        initial, as_head, loss = dspark_head_start(config.dspark, target, config.seed)
        return Kind(initial, as_head, loss, part_names=DSPARK_PARTS)
    if config.kind == "dflash2":
        initial, as_head, loss = dflash2_head_start(config.dflash2, target, config.seed)
        return Kind(initial, as_head, loss, part_names=DFLASH2_PARTS)
    e = config.eagle
    if e.eagle3.enabled:
        return _eagle3_kind(config, target, out_dir)
    layer = e.layer(target.config)
    # Checked before any training: a bad index is a ValueError naming it.
    layers = feature_layers(e.feature_layers, target.config.num_hidden_layers) if e.feature_layers else ()
    weights = (e.feature_weight, e.token_weight)
    return Kind(
        initial=init_eagle_params(layer, target.params, config.seed, target.config, layers),
        as_head=lambda params: Eagle(params=params, config=layer, feature_layers=layers),
        loss=functools.partial(eagle_loss, layer, target.config, weights=weights, layers=layers),
        part_names=("feature_loss", "token_kl"),
    )


def eagle3_setup(config: HeadTrainConfig, target: Model, out_dir: Path | None):
    """(head layer config, feature layers, draft vocabulary) of an EAGLE-3 run. The vocabulary
    is the run's (OUT/draft_vocab.json, or counted and written there), or with out_dir None
    counted afresh (a feature store's: what a new run of this config counts)."""
    e, s, target_config = config.eagle, config.eagle.eagle3, target.config
    num = target_config.num_hidden_layers
    layers = feature_layers(e.feature_layers, num) if e.feature_layers else eagle3_layers({}, num)
    v = target_config.vocab_size
    examples = None if config.dataset is None else train_examples(config.dataset, target.tokenizer)
    size = s.draft_vocab_size or v
    if out_dir is None:
        vocab = select(token_counts(config.data, config.seed, config.steps, v, examples), size)
    else:
        vocab = draft_vocab_for_run(out_dir, config.data, config.seed, config.steps, v, size, examples)
    return e.layer(target_config), layers, vocab


def _eagle3_kind(config: HeadTrainConfig, target: Model, out_dir: Path) -> Kind:
    """The published EAGLE-3 network (training/eagle3_objective.py): the drafter is the one a
    loaded published head is (same HeadOptions), with the run's draft vocabulary's d2t. With
    features.store the loss reads the target's side from the batch (StoredTTTLoss)."""
    s, target_config = config.eagle.eagle3, target.config
    layer, layers, vocab = eagle3_setup(config, target, out_dir)
    options = eagle3_options(vocab.size)
    start = (target_config, target.params) if s.lm_head_init == "target" else None  # its LM head and final norm
    mapping = {} if vocab.is_identity else {"d2t": jnp.asarray(vocab.d2t)}  # not trained: added to the drafter's
    names = (
        "loss_per_step",
        "kl_per_step",
        "accuracy_per_step",
        *(("feature_loss_per_step",) if s.feature_weight else ()),
    )
    return Kind(
        initial=init_eagle3_params(layer, len(layers), vocab, config.seed, start),
        as_head=lambda p: Eagle(params={**p, **mapping}, config=layer, feature_layers=layers, options=options),
        loss=(
            TTTLoss(layer, target_config, options, layers, vocab, s)
            if config.features.store is None
            else StoredTTTLoss(layer, target_config, options, vocab, s)
        ),
        part_names=names,
    )


def _block_kind(config: HeadTrainConfig, target: Model) -> Kind:
    initial, as_head, loss = block_head_start(config.block, target, config.seed)
    return Kind(initial, as_head, loss, part_names=("kl_per_position", "accuracy_per_position"))
