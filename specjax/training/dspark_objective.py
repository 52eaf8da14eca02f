"""Training a DSpark head (`specjax train-head` with kind: dspark).

The network is models/dspark_net.py, the one the drafter (drafters/dspark.py) runs; the
batches, anchors and packing are the block head's (training/block_objective.py): one frozen
target forward over a window, G blocks [token a, MASK x K] per row in one head forward.
Output i (i = 0..K-1) of the block at a guesses the token at a + i + 1, whose teacher is the
target's softmax(logits[a + i]). The loss has three terms:

  block    KL(p_target || q_plain_i), q_plain the outputs without the Markov term (as
           BlockLoss), weighted position_decay**i: the block head DSpark extends;
  markov   markov_weight x the same KL for the Markov-conditioned outputs, i >= 1 (at i = 0
           they are the plain ones), teacher-forced: the previous token is the window's own
           token at a + i (regenerated data: the target's), as DSpark trains;
  confidence  confidence_weight x BCE(c_i, label_i), label_i = [argmax of the Markov output
           i == the target's argmax at a + i]: whether the greedy draft at i survives greedy
           verification given that the ones before it did (teacher forcing is exactly that
           condition). Every position weighs the same (a schedule reads the late ones too),
           and the confidence head reads the state with its gradient stopped: it learns to
           read the state, never bends it.

From a block store (features.store, training/block_store.py) the teacher is the target's
top-k renormalised and the labels' argmax its first stored id (exact): nothing else of the
target is read.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from specjax.drafters.dspark import DSpark
from specjax.models import ModelConfig
from specjax.models.block_net import block_logits_of, final_state, head_logits
from specjax.models.dspark_net import confidence_logit, init_dspark_extras, markov_state
from specjax.training.block_objective import (
    BlockHeadConfig,
    block_batch,
    block_head_parts,
    guess_weights,
    init_block_params,
)


@dataclasses.dataclass(frozen=True)
class DSparkHeadConfig(BlockHeadConfig):
    """`dspark` of a HeadTrainConfig with kind: dspark: the block head's fields plus DSpark's."""

    rank: int = 32  # r of the Markov head (2 D r parameters)
    markov_weight: float = 1.0  # the Markov-conditioned KL's weight beside the block head's
    confidence_weight: float = 0.1  # the confidence head's BCE weight

    def __post_init__(self):
        super().__post_init__()
        if self.rank < 1:
            raise ValueError(f"dspark.rank must be >= 1, got {self.rank}")
        for name in ("markov_weight", "confidence_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"dspark.{name} must be >= 0, got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class DSparkLoss:
    """(target_params, head_params, tokens [B, T] or a stored batch, mask=None) -> (loss, (block KL [K], Markov
    KL [K], Markov accuracy [K], mean confidence [K], confidence BCE [K])) per output: the
    jitted step's loss, hashable (a static argument)."""

    config: ModelConfig  # the head's N-layer config
    target_config: ModelConfig
    layers: tuple[int, ...]
    head: DSparkHeadConfig
    mask_token_id: int

    def __call__(self, target_params, params, tokens, mask=None):
        k = self.head.block_size
        batch = block_batch(self.config, self.target_config, self.layers, target_params, params, tokens, mask, k,
                            self.head.anchors, self.mask_token_id)  # fmt: skip
        usable, at, hidden = batch.usable, batch.at, batch.hidden
        b, g = usable.shape
        previous = jnp.take_along_axis(batch.tokens, at, axis=1).reshape(b, g, k)  # [B, G, K]
        use = jnp.arange(k) >= 1  # [K]: output 0 follows the anchor, no Markov term

        plain = block_logits_of(self.config, params, target_params, hidden)  # [B, G, K, V]
        z = markov_state(params, target_params, hidden, previous, use)
        normed = final_state(self.config, params, target_params, z)  # [B, G, K, D]
        markov = head_logits(self.config, params, target_params, normed)  # [B, G, K, V]
        c_logit = confidence_logit(params, jax.lax.stop_gradient(normed))  # [B, G, K]

        scored, weights = guess_weights(usable, mask, at, k, self.head.position_decay)  # [B, G, K]

        def weighted(x, w):
            return jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1e-6)

        kl_plain, kl_markov = batch.kl(plain), batch.kl(markov)  # [B, G, K]
        survives = jax.lax.stop_gradient(jnp.argmax(markov, axis=-1) == batch.labels)
        bce = optax.sigmoid_binary_cross_entropy(c_logit, survives.astype(jnp.float32))  # [B, G, K]
        loss = (
            weighted(kl_plain, weights)
            + self.head.markov_weight * weighted(kl_markov, weights * use)
            + self.head.confidence_weight * weighted(bce, scored)
        )
        count = jnp.maximum(jnp.sum(scored, axis=(0, 1)), 1.0)  # [K]

        def per_output(x):
            return jnp.sum(x * scored, axis=(0, 1)) / count

        parts = (
            per_output(kl_plain),
            per_output(kl_markov),
            per_output(survives.astype(jnp.float32)),
            per_output(jax.nn.sigmoid(c_logit)),
            per_output(bce),
        )
        return loss, parts


PART_NAMES = (
    "kl_per_position",
    "markov_kl_per_position",
    "accuracy_per_position",
    "confidence_per_position",
    "confidence_bce_per_position",
)


def dspark_head_start(head_cfg: DSparkHeadConfig, target, seed: int):
    """(initial params, params -> DSpark, the loss) for training a DSpark head of `target`
    (a Model), as block_objective.block_head_start for a block head."""
    head, layers, mask_id, as_head = block_head_parts(head_cfg, target, DSpark)
    initial = init_block_params(head, head_cfg, target.config, target.params, layers, seed)
    initial = {**initial, **init_dspark_extras(head, head_cfg.rank, seed)}
    return initial, as_head, DSparkLoss(head, target.config, layers, head_cfg, mask_id)
