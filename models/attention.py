"""Cache write + causal attention by absolute position, shared by every model family.

Two paths compute the same thing:
  full:      scores against all S cache slots at once, masked (caches of one block or less);
  blockwise: the cache in fixed blocks of `cache.block_size` slots, an online softmax
             (flash-decoding) over them, and a `fori_loop` whose trip count is the number
             of blocks below the highest query position of the call. Slots past that
             position are never read, so a forward costs what is filled, not what was
             preallocated, and the shapes stay static (one block is the unit of work).

Per-layer options: a sliding `window` (a query at position p sees slots s with
p - s < window, one more rule ANDed into the visibility; the blockwise loop also starts at
the first block any query can still see), and `softcap` (Gemma 2: scores become
softcap * tanh(scores / softcap) before the mask).

Two masks replace plain causality for a call: a TreeMask (token-tree verification: nodes
off their positions, each seeing its ancestors) and a BlockMask (parallel drafting: a
block of tokens at slot = position, causal or bidirectional within the block).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from . import fixed_order
from .cache import KVCache
from .tree_layout import PathLayout


@struct.dataclass
class TreeMask:
    """Visibility for a call whose tokens are nodes of a token tree (tree verification).

    Siblings share a position, so tree tokens cannot live at slot = position. A tree of W
    tokens (root first) occupies the window of W slots from `start`; the call writes its
    tokens at `slots`, and query t sees every slot before `start` (the committed prefix)
    plus the window slots w with `visible[t, w]` (its ancestors and itself). A chain is the
    special case visible = lower triangle, slots = positions.

    `visible` may also differ per row, [B, T, W]: with start 0 and W the whole call, any
    visibility at all over nodes at explicit positions (PARD's packed mask-token training,
    training/parallel_objective.py).
    """

    start: jax.Array  # [B] int32: the slot of window index 0 (the root)
    slots: jax.Array  # [B, T] int32: where this call's tokens are written
    visible: jax.Array  # [T, W] (or per row [B, T, W]) bool: query t of this call sees window index w
    # The fixed-order formats (bfloat16, int8) lay a tree's nodes at their positions for each
    # query's sums (models/tree_layout.py): without it a node's logits differ from a plain
    # step's by an ulp or more. Static; None: read the window where it sits (float32, where
    # nothing is promised bit for bit, and masks that are not token trees).
    layout: PathLayout | None = struct.field(pytree_node=False, default=None)

    def mask(self, slots: jax.Array) -> jax.Array:
        """slots [S'] of the cache -> [B, T, S'] visibility."""
        width = self.width
        rel = slots[None, :] - self.start[:, None]  # [B, S']
        in_window = (rel >= 0) & (rel < width)
        index = jnp.clip(rel, 0, width - 1)  # [B, S']
        if self.visible.ndim == 2:
            seen = jnp.transpose(jnp.take(self.visible, index, axis=1), (1, 0, 2))  # [B, T, S']
        else:
            b, t, _ = self.visible.shape
            seen = jnp.take_along_axis(self.visible, jnp.broadcast_to(index[:, None, :], (b, t, index.shape[1])), 2)
        return (rel < 0)[:, None, :] | (in_window[:, None, :] & seen)

    @property
    def width(self) -> int:
        """Window slots from `start` whose visibility this mask rules."""
        return self.visible.shape[-1]

    # Tree tokens are not at slot = position, so a sliding window cannot judge them by slot.
    slots_are_positions = False


BLOCK_MODES = ("causal", "bidirectional")


def block_visibility(slots, positions, start, width: int, mode: str = "causal"):
    """slots [S'] of the cache -> [B, T, S']: what a call ending in a block of `width`
    tokens at slots (= positions) start..start+width-1 sees (`BlockMask`).

    positions [B, T] (this call's tokens, at slot = position); start [B]. A query at
    position p sees slot s iff s <= p (causal), or, with mode "bidirectional", also when
    both p and s lie in the block. Queries before the block never see into it.
    """
    if mode not in BLOCK_MODES:
        raise ValueError(f"block mode must be one of {BLOCK_MODES}, got {mode!r}")
    causal = slots[None, None, :] <= positions[:, :, None]  # [B, T, S']
    if mode == "causal":
        return causal
    query_in = (positions >= start[:, None]) & (positions < start[:, None] + width)  # [B, T]
    slot_in = (slots[None, :] >= start[:, None]) & (slots[None, :] < start[:, None] + width)  # [B, S']
    return causal | (query_in[:, :, None] & slot_in[:, None, :])


@struct.dataclass
class BlockMask:
    """Visibility for a call whose last `width` tokens are drafted together as one block:
    parallel drafting feeds [context..., MASK, ..., MASK] and reads every block output.

    Unlike a tree's, the call's tokens sit at slot = position (`slots`), as in a plain call,
    and see the committed prefix and the call's earlier tokens. `mode` is what the block adds:
    "causal" nothing (PARD: a mask token sees the context and the masks before it, the
    same visibility as passing no mask at all), "bidirectional" every block token sees every
    other block token (a DFlash-style block head). Like a tree call, a block call leaves
    `cache.lengths` to its caller: the block's slots hold K/V of no committed token.
    """

    start: jax.Array  # [B] int32: the slot (= position) of the block's first token
    slots: jax.Array  # [B, T] int32: this call's slots, equal to its positions
    width: int = struct.field(pytree_node=False)  # block slots start..start+width-1
    mode: str = struct.field(pytree_node=False, default="causal")

    slots_are_positions = True

    def mask(self, slots: jax.Array) -> jax.Array:
        """slots [S'] of the cache -> [B, T, S'] visibility."""
        return block_visibility(slots, self.slots, self.start, self.width, self.mode)


@struct.dataclass
class Packed:
    """A call that computes only some of its [B, T] tokens (a per-row verify width, rows
    that are done): the admitted tokens `index` [N] (flat, row-major into B * T) run every
    per-token product as one row [1, N, ...], so a call's matrix work is N tokens, not
    B * T. Attention alone is laid out [B, T] again (each row reads its own cache): q, k and
    v are scattered there, zeros at the tokens left out, which are written to their slots
    like any call's tokens (a round's slots past what it commits are rewritten before they
    are read) and attend to nothing they may corrupt: every admitted token must see only
    admitted tokens of its row, i.e. each row's admitted tokens are a prefix of its call.
    `index` may repeat an admitted token to fill a bucket (the same values are written).
    """

    index: jax.Array  # [N] int32 in [0, B * T)
    shape: tuple[int, int] = struct.field(pytree_node=False)  # (B, T) of the call

    def gather(self, x: jax.Array) -> jax.Array:
        """x [B, T, ...] -> [1, N, ...]: the admitted tokens as one row."""
        b, t = self.shape
        return x.reshape(b * t, *x.shape[2:])[self.index][None]

    def scatter(self, x: jax.Array) -> jax.Array:
        """x [1, N, ...] -> [B, T, ...]: back to the call's layout, zeros where left out."""
        b, t = self.shape
        flat = jnp.zeros((b * t, *x.shape[2:]), x.dtype).at[self.index].set(x[0])
        return flat.reshape(b, t, *x.shape[2:])


def _visibility(slots, positions, tree: TreeMask | BlockMask | None, window: int | None = None):
    """slots [S'] -> [B, T, S']: slot s is visible iff s <= position, or by the tree's (or
    block's) rule, and, with a sliding window, only if position - s < window."""
    visible = slots[None, None, :] <= positions[:, :, None] if tree is None else tree.mask(slots)
    if window is None:
        return visible
    # The window is a rule on positions. Committed slots and a block's tokens hold slot =
    # position; a tree's window slots hold its nodes, whose slots are not their positions, but
    # every node a query sees is an ancestor at most W - 1 positions above it, and attend
    # checks W <= window.
    near = positions[:, :, None] - slots[None, None, :] < window  # [B, T, S']
    if tree is not None and not tree.slots_are_positions:
        near = near | (slots[None, :] >= tree.start[:, None])[:, None, :]
    return visible & near


def _softcap(scores, softcap: float | None):
    return scores if softcap is None else softcap * jnp.tanh(scores / softcap)


def write_kv(cache: KVCache, layer: int, slots, k, v) -> KVCache:
    """Write k, v [B, T, n_kv, d_head] into `layer` of the cache at slots [B, T].

    One scatter per tensor; slots past the cache end are dropped (a row's padding, a move
    nothing needs). The cache may hold a narrower dtype than the params. `attend` writes
    through it; a block head writes its context K/V, which have no queries, through it alone.
    """
    rows = jnp.arange(k.shape[0])[:, None]  # [B, 1]
    cache_k = cache.k.at[layer, rows, slots].set(cache.encode(k), mode="drop")
    cache_v = cache.v.at[layer, rows, slots].set(cache.encode(v), mode="drop")
    return cache.replace(k=cache_k, v=cache_v)


def attend(
    q,
    k,
    v,
    positions,
    cache: KVCache,
    layer: int,
    tree: TreeMask | BlockMask | None = None,
    *,
    window: int | None = None,
    softcap: float | None = None,
    fixed: bool = False,
):
    """Write k, v into `cache`, then attend causally by absolute position (or by `tree`).

    q: [B, T, H, d_head]; k, v: [B, T, n_kv, d_head]; positions: [B, T]. Without a tree the
    tokens are written at slot = position; with one, at `tree.slots`. Scores are
    q.k / sqrt(d_head); `window` (static) limits each query to the last `window` positions,
    `softcap` (static) caps the scores; `fixed` (static) sums the softmax in a fixed order
    (models/fixed_order.py), lays the dots out so a row's sums do not depend on T (_scores),
    and reads a tree's nodes laid at their positions (`TreeMask.layout`): a
    position's output is then the same bits in a plain step, a verify of any width or a tree.
    Returns (out [B, T, H, d_head] in q's dtype, cache with this layer written).
    """
    if window is not None and tree is not None and not tree.slots_are_positions and tree.width > window:
        raise ValueError(
            f"a token tree of {tree.width} slots is wider than the sliding window ({window}): an "
            "ancestor could lie outside the window; use a smaller tree"
        )
    write = positions if tree is None else tree.slots  # [B, T]
    cache = write_kv(cache, layer, write, k, v)
    cache_k, cache_v = cache.k, cache.v

    # Grouped-query attention: the H query heads are n_kv groups of G heads.
    b, t, h, hd = q.shape
    n_kv = cache_k.shape[3]
    q = q.reshape(b, t, n_kv, h // n_kv, hd)  # [B, T, n_kv, G, d_head]
    if cache.max_length <= cache.block_size and not fixed:  # fixed: blockwise, whatever the length (cache.py)
        keys, values = cache.decode(cache_k[layer]), cache.decode(cache_v[layer])
        out = _full(q, keys, values, positions, tree, window, softcap, fixed)
    else:
        out = _blockwise(q, cache, layer, positions, write, tree, window, softcap, fixed)
    return out.reshape(b, t, h, hd).astype(q.dtype), cache


def _full(q, keys, values, positions, tree, window=None, softcap=None, fixed=False):
    """q [B, T, n_kv, G, d]; keys, values [B, S, n_kv, d] -> [B, T, n_kv, G, d]."""
    scores = _scores(q, keys.astype(q.dtype), fixed) / jnp.sqrt(q.shape[-1])
    scores = _softcap(scores, softcap)
    # Slot s is visible to a query at position p iff s <= p. Slots beyond the committed
    # sequence are stale and always masked.
    visible = _visibility(jnp.arange(keys.shape[1]), positions, tree, window)  # [B, T, S]
    scores = jnp.where(visible[:, None, None], scores, -jnp.inf)
    weights = (fixed_order.softmax(scores) if fixed else jax.nn.softmax(scores, axis=-1)).astype(q.dtype)
    return _weighted(weights, values.astype(q.dtype), fixed)


def _scores(q, keys, fixed: bool):
    """q [B, T, n_kv, G, d] . keys [B, S, n_kv, d] -> [B, n_kv, G, T, S] float32.

    fixed: the query rows (G x T of them) are the dot's left operand. XLA:CPU picks a dot's
    kernel by its shapes, and the order it sums an output over d_head with it: with the keys
    on the left (as einsum lays out "btngk,bsnk->bngts") T was the right operand's width, and
    at SmolLM2-135M's shapes T = 9, 10 and 17 summed otherwise than T = 1, enough to move a
    bfloat16 or int8 position's logits and flip a greedy token; with the queries on the left
    a row's sums come out the same at every T (tests/test_weight_formats.py, widths 1-33)."""
    if not fixed:
        return jnp.einsum("btngk,bsnk->bngts", q, keys).astype(jnp.float32)
    per_position = jax.vmap(lambda q_t: jnp.einsum("bngk,bsnk->bngs", q_t, keys), in_axes=1, out_axes=3)
    return per_position(q).astype(jnp.float32)


def _weighted(weights, values, fixed: bool):
    """weights [B, n_kv, G, T, S] . values [B, S, n_kv, d] -> [B, T, n_kv, G, d]; `fixed`: the
    weights' rows on the left, as in _scores and for the same reason."""
    if not fixed:
        return jnp.einsum("bngts,bsnk->btngk", weights, values)
    return jax.vmap(lambda w_t: jnp.einsum("bngs,bsnk->bngk", w_t, values), in_axes=3, out_axes=1)(weights)


def _blockwise(q, cache: KVCache, layer: int, positions, written, tree, window=None, softcap=None, fixed=False):
    """Online softmax over cache blocks below max(written) + 1 (the highest slot this call wrote).

    q [B, T, n_kv, G, d]; cache.k, cache.v [layers, B, S, n_kv, d] -> [B, T, n_kv, G, d].
    """
    b, t, n_kv, g, hd = q.shape
    s, block = cache.max_length, cache.block_size
    # Blocks holding any slot a query may see; the last block of a cache whose length is
    # not a multiple of `block` is read from s - block, and slots an earlier block already
    # covered are masked out of it.
    num_blocks = jnp.minimum(jnp.max(written) // block + 1, -(-s // block))
    # With a sliding window, blocks wholly below the lowest query's window are skipped: no
    # query sees a slot below min(position) - window + 1 (tree window slots lie above it).
    first = 0 if window is None else jnp.maximum(jnp.min(positions) - window + 1, 0) // block
    # A tree's nodes read their ancestors laid at their positions (models/tree_layout.py).
    # Its queries run grouped path by path (contiguous), and are put back in order at the end.
    layout = tree.layout if fixed and isinstance(tree, TreeMask) else None
    if layout is not None:
        q, positions = q[:, layout.order], positions[:, layout.order]

    def read(i, laid: bool):
        """Block i -> (scores [B, n_kv, G, T, block], visible [B, T, block], weighted: weights ->
        [B, T, n_kv, G, d]); `laid`: per path, the block as a chain of that path holds it."""
        start = jnp.minimum(i * block, s - block)
        slots = start + jnp.arange(block)
        keys = jax.lax.dynamic_slice(cache.k, (layer, 0, start, 0, 0), (1, b, block, n_kv, hd))[0]
        values = jax.lax.dynamic_slice(cache.v, (layer, 0, start, 0, 0), (1, b, block, n_kv, hd))[0]
        # Laid or not, visibility is by position where there is a layout (a block that no
        # window overlaps holds only prefix slots, seen by all, and slots past every node).
        visible = _visibility(slots, positions, None if layout else tree, window) & (slots >= i * block)
        if not laid:
            keys, values = cache.decode(keys).astype(q.dtype), cache.decode(values).astype(q.dtype)
            return _scores(q, keys, fixed), visible, lambda w: _weighted(w, values, fixed)
        chains = [layout.lay(p, cache, layer, (keys, values), tree.start, start) for p in range(len(layout.paths))]
        keys = [cache.decode(k).astype(q.dtype) for k, _ in chains]  # per path [B, block, n_kv, d]
        values = [cache.decode(v).astype(q.dtype) for _, v in chains]
        scores = jnp.concatenate([_scores(q[:, a:z], keys[p], fixed) for p, (a, z) in enumerate(layout.bounds)], axis=3)

        def weighted(w):  # queries path by path, as `scores`
            return jnp.concatenate(
                [_weighted(w[:, :, :, a:z], values[p], fixed) for p, (a, z) in enumerate(layout.bounds)], axis=1
            )

        return scores, visible, weighted

    def accumulate(i, carry, laid: bool):
        running_max, total, acc = carry  # [B, n_kv, G, T], [B, n_kv, G, T], [B, T, n_kv, G, d] f32
        scores, visible, weighted = read(i, laid)
        scores = jnp.where(visible[:, None, None], _softcap(scores / jnp.sqrt(hd), softcap), -jnp.inf)
        new_max = jnp.maximum(running_max, jnp.max(scores, axis=-1))
        # A row that sees nothing yet keeps max -inf; subtracting 0 then leaves exp(-inf) = 0.
        shift = jnp.where(jnp.isfinite(new_max), new_max, 0.0)
        weights = jnp.exp(scores - shift[..., None])  # [B, n_kv, G, T, block]
        rescale = jnp.exp(running_max - shift)  # [B, n_kv, G, T]
        total = total * rescale + (fixed_order.tree_sum(weights) if fixed else jnp.sum(weights, axis=-1))
        update = weighted(weights.astype(q.dtype))
        acc = acc * jnp.transpose(rescale, (0, 3, 1, 2))[..., None] + update.astype(jnp.float32)
        return new_max, total, acc

    def body_fn(i, carry):
        if layout is None:
            return accumulate(i, carry, False)
        # Only a block that some row's window overlaps needs the paths laid out.
        begin = jnp.minimum(i * block, s - block)
        overlaps = (begin <= jnp.max(tree.start) + tree.width - 1) & (begin + block > jnp.min(tree.start))
        return jax.lax.cond(overlaps, lambda c: accumulate(i, c, True), lambda c: accumulate(i, c, False), carry)

    init = (
        jnp.full((b, n_kv, g, t), -jnp.inf, jnp.float32),
        jnp.zeros((b, n_kv, g, t), jnp.float32),
        jnp.zeros((b, t, n_kv, g, hd), jnp.float32),
    )
    _, total, acc = jax.lax.fori_loop(first, num_blocks, body_fn, init)
    # Every query sees at least its own slot, so total > 0.
    out = acc / jnp.transpose(total, (0, 3, 1, 2))[..., None]
    return out if layout is None else out[:, layout.inverse]
