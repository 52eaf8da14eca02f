"""A token tree's nodes laid at their positions, for the fixed-order formats' sums.

A tree verify writes node i at window slot start + i, but its position is start + depth(i):
siblings share a position. In the bfloat16 and int8 formats a position's logits must be the
same bits however it is computed (models/fixed_order.py), and attention's sums group a
query's terms by where its keys sit: a node whose ancestors sit at other slots than a plain
step of the same token would read gets other bits (up to 1.1 in SmolLM2's int8 logits,
scripts/tree_attention_check.py), and greedy output leaves plain output.

So attention reads the window once per root-to-leaf path: path l's nodes laid at slots
start + depth, as a chain of them would sit, and every query on that path (each node lies on
at least one) attends over that layout. A tree of L leaves costs L gathers of a cache block
and L dots whose query rows together are the call's (`PathLayout.groups`), not one each per
node. Static: the layout is part of the compiled program, as the tree is.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class PathLayout:
    """Root-to-leaf paths of a tree's window, and which of a call's queries read each.

    paths[l]: window indices from the root to a leaf, in depth order (paths[l][d] sits at
    depth d). groups[l]: the indices into the call's T queries that attend over path l;
    every query is in exactly one group.
    """

    paths: tuple[tuple[int, ...], ...]
    groups: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, parents, nodes=None) -> PathLayout:
        """parents [W]: each window node's parent (node 0, the root, its own or < 0), a parent
        before its children; nodes [T]: the window node of each of the call's queries (default
        every node, in order). A query reads the path of the first leaf below it."""
        parents = [int(p) for p in np.asarray(parents)]
        width = len(parents)
        if any(not 0 <= p < i for i, p in enumerate(parents) if i):
            raise ValueError(f"a tree's parents must come before their children, got {parents}")
        children = [[] for _ in range(width)]
        for i in range(1, width):
            children[parents[i]].append(i)
        nodes = range(width) if nodes is None else [int(n) for n in np.asarray(nodes)]
        paths, groups = [], []
        for t, node in enumerate(nodes):
            leaf = node
            while children[leaf]:
                leaf = children[leaf][0]
            path = [leaf]
            while path[0]:
                path.insert(0, parents[path[0]])
            if tuple(path) not in paths:
                paths.append(tuple(path))
                groups.append([])
            groups[paths.index(tuple(path))].append(t)
        return cls(tuple(paths), tuple(tuple(g) for g in groups))

    @property
    def order(self) -> np.ndarray:
        """[T]: the call's queries grouped path by path (what the grouped dots produce)."""
        return np.concatenate([np.asarray(g, np.int32) for g in self.groups])

    @property
    def bounds(self) -> tuple[tuple[int, int], ...]:
        """(first, end) of each path's queries in `order`."""
        ends = np.cumsum([len(g) for g in self.groups])
        return tuple((int(e - len(g)), int(e)) for e, g in zip(ends, self.groups, strict=True))

    @property
    def inverse(self) -> np.ndarray:
        """[T]: where each of the call's queries lands in `order`, to put results back."""
        return np.argsort(self.order).astype(np.int32)

    def lay(self, path: int, cache, layer: int, block, start, offset):
        """A cache block (keys, values) [B, block, n_kv, d] from slot `offset` as a chain of
        path `path` would hold it: the path's node at depth d written at slot start + d.
        Slots past the leaf keep what they hold (no query of the path sees that deep); so
        does the prefix. start [B]: the root's slot."""
        rows = jnp.arange(start.shape[0])[:, None]  # [B, 1]
        nodes = start[:, None] + jnp.asarray(self.paths[path], jnp.int32)  # [B, D + 1]: where they sit
        at = start[:, None] + jnp.arange(len(self.paths[path]), dtype=jnp.int32) - offset  # their block index
        at = jnp.where(at < 0, block[0].shape[1], at)  # outside the block: dropped (not wrapped)
        sources = (cache.k[layer, rows, nodes], cache.v[layer, rows, nodes])  # [B, D + 1, n_kv, d]
        return tuple(part.at[rows, at].set(node, mode="drop") for part, node in zip(block, sources, strict=True))
