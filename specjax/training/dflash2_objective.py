"""Training a DFlash 2 head (`specjax train-head` with kind: dflash2).

The network is models/dflash2_net.py, the one the drafter (drafters/dflash2.py) runs; the
batches, anchors and packing are the block head's (training/block_objective.py): one frozen
target forward over a window, G blocks [token a, MASK x K] per row in one head forward.
Output i (i = 0..K-1) of the block at a guesses the token at a + i + 1, whose teacher is the
target's softmax(logits[a + i]). The loss has two terms:

  block     KL(p_target || q_i) of the convolved outputs, weighted position_decay**i, as
            BlockLoss: the layers and the convolution train together (the convolution is
            part of what the outputs are);
  selector  selector_weight x a cross-entropy over the block's P top paths (the beam the
            drafter runs, on the outputs' log-probabilities): the target is the set of
            paths with the longest prefix equal to the target's greedy tokens y_i =
            argmax logits[a + i] (teacher-forced: how many tokens greedy verification
            would keep, given the earlier ones were kept), and the loss is
            -log sum_{p in best} softmax(s)_p. Blocks where no path gets even y_0 right
            carry no signal and weigh 0. The selector reads the unary scores and the
            states with their gradient stopped: it learns to choose, never bends the
            outputs it chooses among.

From a block store (features.store, training/block_store.py) the KL's teacher is the
target's top-k renormalised and the greedy labels y_i its first stored ids (exact).

Reported per step: the block KL per position, top-1 agreement per position, and two
numbers of the selector: the mean accepted-prefix length (teacher-forced) of the path it
selects and of path 0 (the block head's own proposal, the per-position argmax).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from specjax.drafters.dflash2 import DFlash2
from specjax.models import ModelConfig
from specjax.models.dflash2_net import dflash2_outputs, init_dflash2_extras, path_candidates
from specjax.training.block_objective import (
    BlockHeadConfig,
    block_batch,
    block_head_parts,
    guess_weights,
    init_block_params,
)


@dataclasses.dataclass(frozen=True)
class DFlash2HeadConfig(BlockHeadConfig):
    """`dflash2` of a HeadTrainConfig with kind: dflash2: the block head's fields plus DFlash 2's."""

    rank: int = 32  # r of the selector's pairwise term (3 D r parameters)
    conv_groups: int = 4  # channel groups of the dynamic convolution's kernel (2 D G + 2 G + D parameters)
    paths: int = 16  # P: the candidate paths the selector chooses among
    branch: int = 4  # the top tokens per position the beam extends each path by
    selector_weight: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        for name in ("rank", "conv_groups", "paths", "branch"):
            if getattr(self, name) < 1:
                raise ValueError(f"dflash2.{name} must be >= 1, got {getattr(self, name)}")
        if self.selector_weight < 0:
            raise ValueError(f"dflash2.selector_weight must be >= 0, got {self.selector_weight}")


def accepted_prefix(paths, labels):
    """[.., P] int32: how many leading tokens of each path paths [.., P, K] equal labels [.., K]."""
    same = (paths == labels[..., None, :]).astype(jnp.int32)
    return jnp.sum(jnp.cumprod(same, axis=-1), axis=-1)


@dataclasses.dataclass(frozen=True)
class DFlash2Loss:
    """(target_params, head_params, tokens [B, T] or a stored batch, mask=None) -> (loss, (KL [K], accuracy [K],
    selected prefix [], path-0 prefix [], selector CE [])): the jitted step's loss, hashable."""

    config: ModelConfig  # the head's N-layer config
    target_config: ModelConfig
    layers: tuple[int, ...]
    head: DFlash2HeadConfig
    mask_token_id: int

    def __call__(self, target_params, params, tokens, mask=None):
        k = self.head.block_size
        batch = block_batch(self.config, self.target_config, self.layers, target_params, params, tokens, mask, k,
                            self.head.anchors, self.mask_token_id)  # fmt: skip
        usable, at, hidden = batch.usable, batch.at, batch.hidden
        head, normed = dflash2_outputs(self.config, params, target_params, hidden)  # [B, G, K, V], [B, G, K, D]
        scored, weights = guess_weights(usable, mask, at, k, self.head.position_decay)  # [B, G, K]

        def weighted(x, w):
            return jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1e-6)

        kl = batch.kl(head)  # [B, G, K]
        # The selector over the beam's paths, on stopped unary scores and states.
        lp = jax.lax.stop_gradient(jax.nn.log_softmax(head, axis=-1))
        anchor_tokens = jnp.take_along_axis(batch.tokens, batch.anchors, axis=1)  # [B, G]
        paths, s = path_candidates(
            params,
            target_params,
            lp,
            jax.lax.stop_gradient(normed),
            anchor_tokens,
            self.head.paths,
            self.head.branch,
        )  # [B, G, P, K], [B, G, P]
        labels = batch.labels  # [B, G, K]: the target's greedy tokens
        kept = accepted_prefix(paths, labels)  # [B, G, P]
        best = kept == jnp.max(kept, axis=-1, keepdims=True)
        log_pi = jax.nn.log_softmax(s, axis=-1)
        ce = -jax.nn.logsumexp(jnp.where(best, log_pi, -jnp.inf), axis=-1)  # [B, G]
        informative = scored[..., 0] * (jnp.max(kept, axis=-1) > 0)  # [B, G]
        ce = jnp.where(informative > 0, ce, 0.0)  # no NaN/inf from rows that weigh 0
        loss = weighted(kl, weights) + self.head.selector_weight * weighted(ce, informative)

        count = jnp.maximum(jnp.sum(scored, axis=(0, 1)), 1.0)  # [K]
        agree = (jnp.argmax(head, axis=-1) == labels).astype(kl.dtype)
        selected = jnp.take_along_axis(kept, jnp.argmax(s, axis=-1)[..., None], axis=-1)[..., 0]  # [B, G]
        blocks = scored[..., 0]
        parts = (
            jnp.sum(kl * scored, axis=(0, 1)) / count,
            jnp.sum(agree * scored, axis=(0, 1)) / count,
            weighted(selected.astype(jnp.float32), blocks),
            weighted(kept[..., 0].astype(jnp.float32), blocks),
            weighted(ce, informative),
        )
        return loss, parts


PART_NAMES = (
    "kl_per_position",
    "accuracy_per_position",
    "selected_prefix",
    "greedy_path_prefix",
    "selector_ce",
)


def dflash2_head_start(head_cfg: DFlash2HeadConfig, target, seed: int):
    """(initial params, params -> DFlash2, the loss) for training a DFlash 2 head of `target`
    (a Model), as block_objective.block_head_start for a block head."""
    kind = functools.partial(DFlash2, paths=head_cfg.paths, branch=head_cfg.branch)  # the run's selector settings
    head, layers, mask_id, as_head = block_head_parts(head_cfg, target, kind)
    initial = init_block_params(head, head_cfg, target.config, target.params, layers, seed)
    initial = {**initial, **init_dflash2_extras(head, head_cfg.rank, head_cfg.conv_groups, seed)}
    return initial, as_head, DFlash2Loss(head, target.config, layers, head_cfg, mask_id)
