"""PARD's mask-token training (An et al. 2025), packed: one draft forward per batch.

A parallel draft (drafters/parallel_draft.py) is fed [x_0 .. x_{L-1}, MASK x (K - 1)] at
positions 0..L+K-2 and reads K proposals off one forward: the output at position L - 1 + i
is its distribution for x_{L+i} (i = 0: the last real token, ordinary next-token
prediction; i >= 1: the i-th mask). Training teaches it what follows the masks.

For a window x [T + 1] the draft sees, in ONE forward of T + G (K - 1) tokens:
  - the real tokens x_0..x_{T-1} at positions 0..T-1, causal as usual: the output at t
    predicts x_{t+1} (every ordinary next-token term of the window);
  - G mask groups, group j anchored at a split point L_j: K - 1 MASK tokens at positions
    L_j..L_j+K-2, written after the real tokens, each seeing x_0..x_{L_j - 1} and the
    earlier masks of its own group only (a per-row TreeMask over the whole call: start 0,
    window = every slot). Mask i of the group predicts x_{L_j + i}.
So every output, real or mask, at position p predicts x_{p+1}, and its teacher (distill's
objectives) is the target's distribution at position p given the true prefix: the target's
logits at p of one plain forward over the window. The dataset's loss mask weighs each
prediction as distill's does (mask[t]: the prediction of x_{t+1}), and split points are
drawn, from (seed, step) alone, among those where some mask's prediction is scored.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.models import ModelConfig, TreeMask, forward, full_forward, init_cache
from specjax.training.divergences import get_divergence
from specjax.training.mixed_precision import cast_floats


@dataclasses.dataclass(frozen=True)
class ParallelTrainConfig:
    """`parallel:` of `specjax distill`: train the draft into a parallel (PARD) drafter."""

    enabled: bool = False
    num_masks: int = 3  # K - 1 masks per group: the draft proposes K = num_masks + 1 tokens a forward
    groups: int = 8  # mask groups per row, each at its own random split point
    # The id the draft reads as "a token to guess"; None: `default_mask_token_id` (PAD 258 for
    # the byte-level embedded pair; for a Hugging Face tokenizer its pad token when that is not
    # EOS/BOS, else the first id past the tokenizer, else its unk token). Recorded in the saved
    # draft's config.json (specjax_mask_token_id), so ParallelDraft(model) needs no id.
    mask_token_id: int | None = None
    # Weight of each ordinary next-token prediction (output 0, at every real position)
    # against one mask prediction; the loss is their weighted mean.
    next_token_weight: float = 1.0

    def __post_init__(self):
        if self.num_masks < 1 or self.groups < 1:
            raise ValueError(
                f"parallel.num_masks and parallel.groups must be >= 1, got {self.num_masks}, {self.groups}"
            )
        if self.next_token_weight < 0:
            raise ValueError(f"parallel.next_token_weight must be >= 0, got {self.next_token_weight}")
        if self.mask_token_id is not None and (isinstance(self.mask_token_id, bool) or self.mask_token_id < 0):
            raise ValueError(f"parallel.mask_token_id must be a token id >= 0 (or null), got {self.mask_token_id!r}")

    def check_window(self, seq_len: int) -> None:
        """Windows of `seq_len` tokens (T = seq_len - 1 inputs) must hold one split point L
        with 1 <= L <= T - num_masks (a real token before the masks, a token after the last)."""
        if self.enabled and seq_len - 1 - self.num_masks < 1:
            raise ValueError(
                f"parallel.num_masks {self.num_masks} leaves no split point in windows of {seq_len} tokens: "
                f"need seq_len >= num_masks + 2"
            )


def default_mask_token_id(tokenizer, vocab_size: int) -> int:
    """A mask id no context generation feeds: the pad token (the byte vocabulary's PAD 258)
    unless it doubles as EOS/BOS (SmolLM2's pad is <|im_end|>), else the first id past the
    tokenizer's when the vocabulary is padded, else the unk token (SmolLM2: 0,
    <|endoftext|>, which its chat template never writes). Raises when none fits."""
    special = {getattr(tokenizer, name, None) for name in ("eos_token_id", "bos_token_id")} - {None}
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is not None and pad not in special and 0 <= pad < vocab_size:
        return int(pad)
    try:
        size = len(tokenizer)
    except TypeError:
        size = vocab_size
    if size < vocab_size:
        return int(size)
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and unk not in special and 0 <= unk < vocab_size:
        return int(unk)
    raise ValueError(
        "found no mask token for parallel training (no pad token apart from EOS/BOS, no id past the tokenizer's, "
        "no unk token): set parallel.mask_token_id to an id the model's inputs never hold"
    )


def resolve_mask_token_id(parallel: ParallelTrainConfig, tokenizer, vocab_size: int) -> int:
    """parallel.mask_token_id, checked against the vocabulary, or the default one."""
    if parallel.mask_token_id is None:
        return default_mask_token_id(tokenizer, vocab_size)
    if not parallel.mask_token_id < vocab_size:
        raise ValueError(f"parallel.mask_token_id {parallel.mask_token_id} is not an id of the draft's {vocab_size}")
    return parallel.mask_token_id


def split_points(parallel: ParallelTrainConfig, mask: np.ndarray, seed: int, step: int) -> np.ndarray:
    """Split points L [B, groups] int32 for loss mask [B, T] (mask[:, t]: the prediction of
    x_{t+1}): 1 <= L <= T - num_masks, distinct within a row where there are enough, drawn
    among those whose masks predict at least one scored token (any of mask[L..L+M-1]); a
    row with none draws from all. A pure function of (seed, step, mask)."""
    mask = np.asarray(mask) > 0
    b, t = mask.shape
    m, g = parallel.num_masks, parallel.groups
    count = t - m  # candidates L = 1..T-M
    sums = np.concatenate([np.zeros((b, 1), np.int64), np.cumsum(mask, axis=1)], axis=1)  # [B, T + 1]
    starts = np.arange(1, count + 1)
    scored = sums[:, starts + m] - sums[:, starts] > 0  # [B, count]: any of mask[L..L+M-1]
    rng = np.random.default_rng([seed, step, 0x9A4D])  # a stream of its own: batches keep theirs
    out = np.empty((b, g), np.int32)
    for row in range(b):
        candidates = starts[scored[row]] if scored[row].any() else starts
        out[row] = np.sort(rng.choice(candidates, size=g, replace=len(candidates) < g))
    return out


def packed_layout(anchors, length: int, num_masks: int):
    """The packed call for split points anchors [B, G] over `length` real tokens: (positions
    [B, N], visible [B, N, N]) with N = length + G * num_masks. Slots 0..length-1 hold the
    real tokens (slot = position), then group j's masks at positions L_j..L_j+M-1. A real
    token sees the real slots up to its own; a mask sees the real slots below its group's L
    and its group's masks up to itself."""
    b, g = anchors.shape
    m = num_masks
    n = length + g * m
    real = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
    masks = (anchors[:, :, None] + jnp.arange(m, dtype=jnp.int32)).reshape(b, g * m)
    positions = jnp.concatenate([real, masks], axis=1)  # [B, N]
    horizon = jnp.concatenate([real, jnp.repeat(anchors - 1, m, axis=1)], axis=1)  # [B, N]: last real slot seen
    slot = jnp.arange(n)
    sees_real = (slot[None, None, :] <= horizon[:, :, None]) & (slot < length)[None, None, :]  # [B, N, N]
    group = jnp.where(slot >= length, (slot - length) // m, -1)  # [N]: -1 for real tokens
    own = (group[:, None] == group[None, :]) & (group[:, None] >= 0) & (slot[None, :] <= slot[:, None])  # [N, N]
    return positions, sees_real | own[None]


def packed_logits(config: ModelConfig, params, tokens, anchors, num_masks: int, mask_token_id: int):
    """Draft logits [B, N, V] of the packed call, and positions [B, N]: tokens [B, T + 1]
    (the last one is only predicted), anchors [B, G]."""
    b, t = tokens.shape[0], tokens.shape[1] - 1
    positions, visible = packed_layout(anchors, t, num_masks)
    n = positions.shape[1]
    if config.sliding_window is not None and n > config.sliding_window:  # the call is one window of n slots
        raise ValueError(
            f"a packed row of {n} tokens (seq_len - 1 + groups x num_masks) is wider than the draft's sliding "
            f"window ({config.sliding_window}): use shorter windows or fewer mask groups"
        )
    inputs = jnp.concatenate([tokens[:, :t], jnp.full((b, n - t), mask_token_id, tokens.dtype)], axis=1)
    slots = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
    tree = TreeMask(start=jnp.zeros((b,), jnp.int32), slots=slots, visible=visible)
    # One block as wide as the cache: attention takes the masked full path (differentiable).
    cache = init_cache(config, b, n, block_size=n)
    logits, _ = forward(config, params, inputs, positions, cache, tree)
    return logits, positions


def parallel_loss(
    objective,
    temperature,
    beta,
    parallel: ParallelTrainConfig,
    mask_token_id: int,
    draft_config,
    target_config,
    draft_params,
    target_params,
    tokens,
    mask,
    anchors,
):
    """(loss, per-offset losses [K]) of the packed call: tokens [B, T + 1], mask [B, T]
    (distill's: the prediction of x_{t+1} at t), anchors [B, G]. The loss is the weighted
    mean of every scored prediction (ordinary ones weighing next_token_weight, masks 1);
    offset 0 of the metrics is the ordinary next-token term, offset i the i-th masks'."""
    b, t = tokens.shape[0], tokens.shape[1] - 1
    m = parallel.num_masks
    draft_params = cast_floats(draft_params, draft_config.dtype)  # mixed precision: distill's compute_dtype
    logits, positions = packed_logits(draft_config, draft_params, tokens, anchors, m, mask_token_id)
    # Every output at position p predicts x_{p+1}, taught by the target's output at p.
    if objective == "next_token":
        labels = jnp.take_along_axis(tokens, positions + 1, axis=1)
        per_position = optax.softmax_cross_entropy_with_integer_labels(logits, labels)  # [B, N]
    else:
        target_logits = jax.lax.stop_gradient(full_forward(target_config, target_params, tokens[:, :t]))
        teacher = jnp.take_along_axis(target_logits, positions[:, :, None], axis=1)  # [B, N, V]
        per_position = get_divergence(objective, temperature, beta)(teacher, logits)
    weights = jnp.take_along_axis(mask.astype(jnp.float32), positions, axis=1)  # [B, N]
    scale = jnp.concatenate([jnp.full((t,), parallel.next_token_weight), jnp.ones((positions.shape[1] - t,))])
    total = jnp.sum(weights * scale)
    loss = jnp.sum(per_position * weights * scale) / jnp.maximum(total, 1e-9)
    # Per offset: the real outputs, then the masks by their index within a group.
    scored = (per_position * weights)[:, t:].reshape(b, -1, m).sum(axis=(0, 1))  # [M]
    counted = weights[:, t:].reshape(b, -1, m).sum(axis=(0, 1))
    first = jnp.sum(per_position[:, :t] * weights[:, :t]) / jnp.maximum(jnp.sum(weights[:, :t]), 1.0)
    per_offset = jnp.concatenate([first[None], scored / jnp.maximum(counted, 1.0)])  # [K]
    return loss, per_offset


def parallel_step(static, optimizer, target_params, draft_params, opt_state, tokens, mask, anchors):
    """distill's step on the packed objective: static = parallel_loss's first seven arguments.
    Returns (params, opt_state, loss, per-offset losses [K])."""
    (loss, per_offset), grads = jax.value_and_grad(
        lambda p: parallel_loss(*static, p, target_params, tokens, mask, anchors), has_aux=True
    )(draft_params)
    updates, opt_state = optimizer.update(grads, opt_state, draft_params)
    return optax.apply_updates(draft_params, updates), opt_state, loss, per_offset
