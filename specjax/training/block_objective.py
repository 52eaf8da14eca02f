"""Training a DFlash-style block head (`specjax train-head` with kind: block).

The network is models/block_net.py, the one the drafter (drafters/block_head.py) runs. A
step takes one frozen target forward over a window [B, T] (its logits and the outputs of the
feature layers, on the fly, no gradient) and one head forward over `anchors` blocks per row,
packed: the context K/V of all T positions at slots 0..T-1, then G blocks of K + 1 tokens,
block g = [token a_g, MASK x K] at positions a_g .. a_g + K. A per-row TreeMask lets block g
see the context at positions below a_g (what decoding with a_g as the anchor would have
written) and its own K + 1 tokens, all of them (bidirectional), and nothing else.

Mask j (j = 1..K) of block g guesses the token at a_g + j; its teacher is the target's
distribution for that token, softmax(logits[a_g + j - 1]) (self-distillation: the loss is
KL(p_target || q_head), as for Medusa). Position j weighs position_decay**(j - 1) (DFlash
weighs early positions more: a later guess counts only if every earlier one was accepted).

With features.store (a block store, training/block_store.py) the target does not run: the
loss takes a stored batch instead of the tokens, its states as stored and as teacher the
target's top-k log-probabilities renormalised, KL(p_topk || q_head) (k = V: the live loss).

Anchors are drawn without replacement among the positions whose first guess is a scored
token (a user dataset's mask: training/run_data.py predicted_mask) and that leave room for
K guesses, by Gumbel top-k from a key fixed by the batch itself: a resumed run draws the
same anchors for the same batch.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.drafters.block_head import BlockHead
from specjax.models import ModelConfig, TreeMask, feature_layers, full_forward, init_cache
from specjax.models.block_net import block_head_states, block_logits_of, init_block_head_params
from specjax.models.config import LLAMA_FAMILY
from specjax.models.heads import head_config
from specjax.training.block_store import stored_teacher, topk_kl

LAYER_INITS = ("random", "target")
# The head's decoder layers: "llama" (specjax's default), or "qwen3": the same with a per-head
# q/k RMSNorm, the layers every DFlash engine serves (z-lab, vLLM, SGLang, speculators), so the
# trained head exports with `save-head --format dflash` (docs/head_formats_block.md).
LAYER_TYPES = ("llama", "qwen3")


@dataclasses.dataclass(frozen=True)
class BlockHeadConfig:
    """`block` of a HeadTrainConfig with kind: block."""

    num_layers: int = 1
    # The layers' shape (their width is the target's); layer_init "target" takes the target's own.
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    intermediate_size: int = 256
    # "random": fresh layers; "target": copies of the target's first num_layers layers (which,
    # like the block, read token embeddings), a start that trains in far fewer steps.
    layer_init: str = "random"
    # "llama" or "qwen3" (LAYER_TYPES); with layer_init target a qwen3 head copies the target's
    # layers and starts its q/k norms at ones.
    layer_type: str = "llama"
    # Target blocks whose outputs make the context; () takes EAGLE-3's default (HF 2, L//2, L-3),
    # or for a target of fewer than 7 layers the first, middle and last.
    feature_layers: tuple[int, ...] = ()
    block_size: int = 4  # K: drafts per block (the largest K it serves)
    anchors: int = 16  # blocks per row per step
    position_decay: float = 0.8  # guess j weighs position_decay**(j - 1)
    mask_token_id: int | None = None  # None: the target tokenizer's default (parallel_objective)

    def __post_init__(self):
        if self.layer_init not in LAYER_INITS:
            raise ValueError(f"block.layer_init must be one of {', '.join(LAYER_INITS)}, got {self.layer_init!r}")
        if self.layer_type not in LAYER_TYPES:
            raise ValueError(f"block.layer_type must be one of {', '.join(LAYER_TYPES)}, got {self.layer_type!r}")
        for name in ("num_layers", "block_size", "anchors"):
            if getattr(self, name) < 1:
                raise ValueError(f"block.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.position_decay <= 1:
            raise ValueError(f"block.position_decay must be in (0, 1], got {self.position_decay}")
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))

    def check_window(self, seq_len: int) -> None:
        if seq_len < self.block_size + 2:
            raise ValueError(f"windows of {seq_len} tokens leave no room for a block of {self.block_size} guesses")


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's default blocks (HF hidden_states 2, L//2, L-3), or the first, middle and
    last block of a target too shallow for them."""
    layers = (1, num_layers // 2 - 1, num_layers - 4)
    if len(set(layers)) == 3 and min(layers) >= 0:
        return layers
    return tuple(sorted({0, num_layers // 2, num_layers - 1}))


def draw_anchors(tokens, mask, block_size: int, anchors: int):
    """(anchors [B, G] int32, usable [B, G] bool): a_g with room for K guesses (a + K <= T - 1)
    whose first guess is scored (mask[:, a], mask[:, q] scoring the token at q + 1), distinct,
    by Gumbel top-k from a key that is a function of the batch alone. A row with fewer than G
    such positions marks the rest unusable and anchors them at 0: in range, so the gathers at
    a + i stay finite (an index past T gathers NaN, and NaN x weight 0 is NaN)."""
    b, t = tokens.shape
    valid = jnp.broadcast_to(jnp.arange(t) <= t - 1 - block_size, (b, t))
    if mask is not None:
        valid = valid & (mask > 0)
    fingerprint = jnp.sum(tokens.astype(jnp.uint32) * (jnp.arange(t, dtype=jnp.uint32) * jnp.uint32(2654435761) + 1))
    key = jax.random.fold_in(jax.random.key(0x5EED), fingerprint)
    scores = jnp.where(valid, jax.random.gumbel(key, (b, t)), -jnp.inf)
    top, chosen = jax.lax.top_k(scores, min(anchors, t))  # [B, G]
    usable = jnp.isfinite(top)
    return jnp.where(usable, chosen, 0).astype(jnp.int32), usable


def packed_blocks(config: ModelConfig, params, target_params, states, tokens, anchors, k: int, mask_token_id: int):
    """The head's guesses for G blocks per row in one forward -> logits [B, G, K, V]
    (`packed_states` then the head's final norm and LM head)."""
    hidden = packed_states(config, params, target_params, states, tokens, anchors, k, mask_token_id)
    return block_logits_of(config, params, target_params, hidden)


def packed_states(config: ModelConfig, params, target_params, states, tokens, anchors, k: int, mask_token_id: int):
    """The head's states for G blocks per row in one forward -> h [B, G, K, D] (before the
    final norm: DSpark adds its Markov term there).

    states [B, T, n * D]: the target's block outputs over tokens [B, T]; anchors [B, G]:
    block g is [token a_g, MASK x K] at positions a_g .. a_g + K and sees the context below
    a_g and itself, as a decoding round at length a_g + 1 sees it (drafters/block_head.py).
    """
    b, t = tokens.shape
    g = anchors.shape[1]
    offsets = jnp.arange(k + 1)
    positions = (anchors[:, :, None] + offsets).reshape(b, g * (k + 1))  # [B, G(K+1)]
    first = jnp.take_along_axis(tokens, anchors, axis=1)  # [B, G]: the anchors' tokens
    block = jnp.where(offsets == 0, first[:, :, None], mask_token_id).reshape(b, g * (k + 1))
    # Slots: the context at 0..T-1 (slot = position), block g's tokens at T + g(K+1) + i.
    slots = jnp.broadcast_to(t + jnp.arange(g * (k + 1)), (b, g * (k + 1)))
    group = jnp.repeat(jnp.arange(g), k + 1)  # [G(K+1)]: each block token's block
    sees_context = jnp.arange(t)[None, None, :] < jnp.repeat(anchors, k + 1, axis=1)[:, :, None]
    sees_block = jnp.broadcast_to(group[:, None] == group[None, :], (b, g * (k + 1), g * (k + 1)))
    visible = jnp.concatenate([sees_context, sees_block], axis=2)  # [B, G(K+1), T + G(K+1)]
    tree = TreeMask(start=jnp.zeros((b,), jnp.int32), slots=slots, visible=visible)
    # One block of slots: attention over the whole cache at once (the blockwise path's
    # fori_loop has traced bounds, which reverse-mode differentiation cannot go through).
    cache = init_cache(config, b, t + g * (k + 1), block_size=t + g * (k + 1))
    context = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    hidden, _ = block_head_states(config, params, target_params, states, context, block, positions, cache, tree)
    return hidden.reshape(b, g, k + 1, -1)[:, :, 1:]  # [B, G, K, D]: the masks' states


@dataclasses.dataclass(frozen=True)
class BlockBatch:
    """What every block objective (block head, DSpark, DFlash 2) starts from. The teacher is
    the target's whole distribution (live), or its top k renormalised (a stored batch:
    teacher_ids says which tokens); `kl` and `labels` read either."""

    tokens: jax.Array  # [B, T] int32: the window
    anchors: jax.Array  # [B, G] int32: block g is [token a_g, MASK x K] at positions a_g ..
    usable: jax.Array  # [B, G] bool: blocks with room and a scored first guess (draw_anchors)
    at: jax.Array  # [B, G K]: guess i of block g is the token at a_g + i + 1, teacher logits[a_g + i]
    teacher: jax.Array  # [B, G, K, V] the target's log-probabilities there, or [B, G, K, k] stored
    hidden: jax.Array  # [B, G, K, D] the head's states for the guesses (packed_states)
    teacher_ids: jax.Array | None = None  # [B, G, K, k] a stored teacher's token ids; None: all V in order

    def kl(self, logits):
        """KL(teacher || softmax(logits)) [B, G, K] of the head's logits [B, G, K, V]."""
        if self.teacher_ids is None:
            return guess_kl(self.teacher, logits)
        return topk_kl(self.teacher, self.teacher_ids, logits)

    @property
    def labels(self):
        """[B, G, K] int32: the target's argmax at each guess (a stored teacher's first id)."""
        if self.teacher_ids is None:
            return jnp.argmax(self.teacher, axis=-1)
        return self.teacher_ids[..., 0]


def block_batch(config, target_config, layers, target_params, params, inputs, mask, k: int, g: int, mask_token_id: int):
    """G blocks of K guesses per row drawn from the scored positions (mask [B, T] or None),
    the head's states for them and the teacher -> BlockBatch. inputs: tokens [B, T], the
    frozen target run over them here, or a stored batch (training/block_store.py STORED:
    "tokens" [B, T], "states", "top_logprobs", "top_ids"), the target not run."""
    stored = isinstance(inputs, dict)
    tokens = inputs["tokens"] if stored else inputs
    b = tokens.shape[0]
    if stored:
        states = inputs["states"].astype(jnp.dtype(target_config.dtype))  # [B, T, n * D]
    else:
        logits, states = jax.lax.stop_gradient(full_forward(target_config, target_params, tokens, layers))
    anchors, usable = draw_anchors(tokens, mask, k, g)  # [B, G]
    g = anchors.shape[1]
    hidden = packed_states(config, params, target_params, states, tokens, anchors, k, mask_token_id)
    at = (anchors[:, :, None] + jnp.arange(k)).reshape(b, g * k)  # [B, G K]
    ids = None
    if stored:
        teacher, ids = stored_teacher(inputs, at)  # [B, G K, k] each
        ids = ids.reshape(b, g, k, -1)
    else:
        teacher = jax.nn.log_softmax(jnp.take_along_axis(logits, at[:, :, None], axis=1), axis=-1)
    teacher = teacher.reshape(b, g, k, -1)
    return BlockBatch(tokens, anchors, usable, at, teacher, hidden, ids)


@dataclasses.dataclass(frozen=True)
class BlockLoss:
    """(target_params, head_params, tokens [B, T] or a stored batch, mask=None) -> (loss, (kl
    per guess [K], accuracy per guess [K])): the jitted step's loss, hashable (a static argument)."""

    config: ModelConfig  # the head's N-layer config
    target_config: ModelConfig
    layers: tuple[int, ...]
    block: BlockHeadConfig
    mask_token_id: int

    def __call__(self, target_params, params, tokens, mask=None):
        k = self.block.block_size
        batch = block_batch(self.config, self.target_config, self.layers, target_params, params, tokens, mask, k,
                            self.block.anchors, self.mask_token_id)  # fmt: skip
        usable, at = batch.usable, batch.at
        head = block_logits_of(self.config, params, target_params, batch.hidden)  # [B, G, K, V]
        kl = batch.kl(head)  # [B, G, K]
        scored, weights = guess_weights(usable, mask, at, k, self.block.position_decay)
        loss = jnp.sum(kl * weights) / jnp.maximum(jnp.sum(weights), 1e-6)
        count = jnp.maximum(jnp.sum(scored, axis=(0, 1)), 1.0)  # [K]
        agree = (jnp.argmax(head, axis=-1) == batch.labels).astype(kl.dtype)
        return loss, (jnp.sum(kl * scored, axis=(0, 1)) / count, jnp.sum(agree * scored, axis=(0, 1)) / count)


def guess_kl(teacher, logits):
    """KL(teacher || softmax(logits)) over the last axis [.., V] -> [..]; teacher is already
    log-softmaxed; a draft vocabulary's -inf logits count as -1e9 (no NaN where p = 0)."""
    student = jax.nn.log_softmax(logits, axis=-1)
    return jnp.sum(jnp.exp(teacher) * (teacher - jnp.where(jnp.isfinite(student), student, -1e9)), axis=-1)


def guess_weights(usable, mask, at, k: int, position_decay: float):
    """(scored, weights) [B, G, K] float32 of each block's K guesses: scored = 1 where the
    block is usable (usable [B, G]) and the guessed token is a trained one (mask [B, T] at
    at [B, G K], None: all); weights = scored x position_decay ** i."""
    b, g = usable.shape
    scored = usable[:, :, None].astype(jnp.float32)  # [B, G, 1]
    if mask is not None:
        scored = scored * jnp.take_along_axis(mask, at, axis=1).reshape(b, g, k).astype(jnp.float32)
    scored = jnp.broadcast_to(scored, (b, g, k))
    decay = jnp.asarray(position_decay, jnp.float32) ** jnp.arange(k, dtype=jnp.float32)
    return scored, scored * decay


def init_block_params(head: ModelConfig, block: BlockHeadConfig, target_config, target_params, layers, seed: int):
    """The head's initial params: fresh, or with the target's first layers (layer_init target)."""
    params = init_block_head_params(head, len(layers), seed, target_params)
    if block.layer_init == "target":
        copied = {i: jax.tree.map(jnp.array, target_params["layers"][i]) for i in range(block.num_layers)}
        params["layers"] = _overlay(params["layers"], copied)  # a qwen3 head keeps its fresh q/k norms
    return params


def _overlay(fresh: dict, copied: dict) -> dict:
    """fresh's tree, each leaf that copied also has taken from copied (the params only fresh has,
    e.g. a qwen3 head's q/k norms over a Llama target's layers, stay fresh)."""
    return {
        key: (_overlay(value, copied[key]) if isinstance(value, dict) else copied[key]) if key in copied else value
        for key, value in fresh.items()
    }


def head_layer_shape(block: BlockHeadConfig, target_config: ModelConfig) -> tuple[int, int, int]:
    """(heads, kv heads, intermediate size) of the head's layers: the target's own with
    layer_init target (its layers are copied), else the configured ones."""
    if block.layer_init == "target":
        c = target_config
        if c.model_type not in LLAMA_FAMILY or c.attention_bias or c.o_proj_bias or c.mlp_bias:
            raise ValueError(
                f"block.layer_init target copies plain Llama layers; a {c.model_type} target's "
                "(biases, other norms) are not the head's: use layer_init random"
            )
        if block.num_layers > target_config.num_hidden_layers:
            raise ValueError(
                f"block.layer_init target copies {block.num_layers} layers of a "
                f"{target_config.num_hidden_layers}-layer target"
            )
        return c.num_attention_heads, c.num_key_value_heads, c.intermediate_size
    return block.num_attention_heads, block.num_key_value_heads, block.intermediate_size


def head_feature_layers(block: BlockHeadConfig, target_config: ModelConfig) -> tuple[int, ...]:
    """The target blocks a head reads (block.feature_layers, or the default); a bad index raises."""
    num = target_config.num_hidden_layers
    return feature_layers(block.feature_layers, num) if block.feature_layers else default_feature_layers(num)


def block_head_parts(block: BlockHeadConfig, target, kind: type[BlockHead] = BlockHead):
    """(head config, feature layers, mask token id, params -> drafter) of a block head (or a
    subclass, `kind`) of `target` (a Model), checked before any training: a bad mask id or
    layer fails here."""
    from specjax.training.parallel_objective import default_mask_token_id

    target_config = target.config
    layers = head_feature_layers(block, target_config)
    heads, kv, intermediate = head_layer_shape(block, target_config)
    head = head_config(target_config, heads, kv, intermediate, model_type=block.layer_type)
    head = head.replace(num_hidden_layers=block.num_layers)
    mask_id = block.mask_token_id
    if mask_id is None:
        mask_id = default_mask_token_id(target.tokenizer, target_config.vocab_size)

    def as_head(params):
        fields = {"config": head, "feature_layers": layers, "mask_token_id": mask_id, "block_size": block.block_size}
        return kind(params=params, **fields)

    as_head(None).check(target_config, block.block_size)
    return head, layers, mask_id, as_head


def block_head_start(block: BlockHeadConfig, target, seed: int):
    """(initial params, params -> BlockHead, the loss) for training a block head of `target`
    (a Model); the drafter is the one the saved head loads as (drafters/formats/native.py)."""
    head, layers, mask_id, as_head = block_head_parts(block, target)
    initial = init_block_params(head, block, target.config, target.params, layers, seed)
    return initial, as_head, BlockLoss(head, target.config, layers, block, mask_id)
