"""A static token tree: which candidates a tree round drafts and verifies.

Nodes are named by their path from the root in Medusa's "choices" format: `(0, 1)` is the
rank-1 child of the rank-0 child of the root. The rank r of a child is the drafter's r-th
candidate at its parent (the r-th most likely token when greedy; the r-th i.i.d. draw under
sampling). The root is the last committed token; it is not a path.

Everything here is static (hashable, part of the jit key): the round turns the structure
into small constant index arrays. Node 0 is the root; nodes 1..N follow in canonical order
(by depth, then lexicographically), so a parent always precedes its children.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq

import numpy as np
import yaml


@dataclasses.dataclass(frozen=True)
class Tree:
    """The shape of a token tree: N nodes below the root, up to `depth` levels deep."""

    paths: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        paths = tuple(tuple(int(r) for r in p) for p in self.paths)
        object.__setattr__(self, "paths", tuple(sorted(paths, key=lambda p: (len(p), p))))

    @classmethod
    def from_paths(cls, paths) -> Tree:
        """A tree from Medusa-style choices, e.g. `[(0,), (1,), (0, 0)]`.

        Every prefix of a path must be listed too; anything else raises ValueError.
        """
        try:
            paths = [tuple(p) for p in paths]
        except TypeError as e:
            raise ValueError(f"tree paths must be a list of tuples of child ranks, got {paths!r}") from e
        if not paths:
            raise ValueError("a tree needs at least one node: pass a non-empty list of paths")
        seen = set()
        for p in paths:
            if not p:
                raise ValueError("the root is implicit: a tree path must have at least one rank")
            if not all(isinstance(r, int | np.integer) and not isinstance(r, bool) and r >= 0 for r in p):
                raise ValueError(f"tree path {p!r} must hold non-negative integer ranks")
            if p in seen:
                raise ValueError(f"tree path {p!r} is listed twice")
            seen.add(p)
        for p in paths:
            for end in range(1, len(p)):
                if p[:end] not in seen:
                    raise ValueError(f"tree path {p!r} needs its prefix {p[:end]!r}, which is not listed")
        return cls(tuple(paths))

    @classmethod
    def chain(cls, k: int) -> Tree:
        """The chain of k rank-0 candidates: the tree form of `num_speculative_tokens=k`."""
        if not isinstance(k, int | np.integer) or k < 1:
            raise ValueError(f"Tree.chain(k) needs an integer k >= 1, got {k!r}")
        return cls(tuple((0,) * d for d in range(1, int(k) + 1)))

    @classmethod
    def full(cls, branching: int, depth: int) -> Tree:
        """Every node has `branching` children down to `depth` (a binary tree: branching=2)."""
        if branching < 1 or depth < 1:
            raise ValueError(f"Tree.full needs branching >= 1 and depth >= 1, got {branching}, {depth}")
        level, paths = [()], []
        for _ in range(depth):
            level = [(*p, r) for p in level for r in range(branching)]
            paths += level
        return cls(tuple(paths))

    @classmethod
    def from_acceptance(cls, acceptance, num_nodes: int) -> Tree:
        """The `num_nodes`-node tree that maximises expected accepted length under `acceptance`.

        acceptance[d, r] is the probability that the rank-r candidate at depth d + 1 is the
        one accepted, given that its parent was. A node's value is the product of these
        along its path (the probability it is accepted), and the expected number of
        accepted tokens of a tree is the sum of its nodes' values. Greedy expansion takes
        the most valuable node whose parent and lower-ranked sibling are already in; since
        no node is worth more than its parent, this is the optimal tree of that size when
        acceptance falls with rank (Sequoia's positional model without its depth cap).
        """
        acc = np.asarray(acceptance, np.float64)
        if acc.ndim != 2 or acc.size == 0:
            raise ValueError(f"acceptance must be a [depth, ranks] array, got shape {acc.shape}")
        if num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
        max_depth, max_rank = acc.shape
        frontier = [(-acc[0, 0], (0,), 1.0)]  # (-value, path, the parent's value)
        chosen: list[tuple[int, ...]] = []
        while frontier and len(chosen) < num_nodes:
            neg, path, parent_value = heapq.heappop(frontier)
            chosen.append(path)
            d, r = len(path) - 1, path[-1]
            if r + 1 < max_rank:  # the next sibling
                heapq.heappush(frontier, (-parent_value * acc[d, r + 1], (*path[:-1], r + 1), parent_value))
            if d + 1 < max_depth:  # the first child
                heapq.heappush(frontier, (neg * acc[d + 1, 0], (*path, 0), -neg))
        return cls(tuple(chosen))

    @classmethod
    def from_spec(cls, spec) -> Tree:
        """A tree from a command-line or YAML value: a preset name, "chain:K",
        "full:BRANCHING:DEPTH", or a list of paths (YAML "[[0], [1], [0, 0]]")."""
        if isinstance(spec, str):
            if spec in PRESETS:
                return PRESETS[spec]()
            kind, _, rest = spec.partition(":")
            try:
                if kind == "chain" and rest:
                    return cls.chain(int(rest))
                if kind == "full" and rest:
                    branching, depth = (int(x) for x in rest.split(":"))
                    return cls.full(branching, depth)
            except ValueError as e:
                raise ValueError(f"cannot read tree {spec!r}: {e}") from e
            try:
                spec = yaml.safe_load(spec)
            except yaml.YAMLError as e:
                raise ValueError(f"cannot read tree {spec!r} as a preset, chain:K, full:B:D or a YAML list") from e
            if isinstance(spec, str) or spec is None:
                raise ValueError(
                    f"unknown tree {spec!r}: use a preset ({', '.join(sorted(PRESETS))}), chain:K, "
                    "full:BRANCHING:DEPTH or a list of paths like [[0], [1], [0, 0]]"
                )
        return cls.from_paths(spec)

    @classmethod
    def preset(cls, name: str) -> Tree:
        """A named tree: see `PRESETS`."""
        if name not in PRESETS:
            raise ValueError(f"unknown tree preset {name!r}; choose one of {sorted(PRESETS)}")
        return PRESETS[name]()

    def expected_accepted(self, acceptance) -> float:
        """Expected accepted draft tokens per round under `acceptance` [depth, ranks] (see
        `from_acceptance`); a node beyond the table's depth or rank counts as never accepted."""
        acc = np.asarray(acceptance, np.float64)
        total = 0.0
        for p in self.paths:
            if len(p) > acc.shape[0] or max(p) >= acc.shape[1]:
                continue
            total += float(np.prod([acc[d, r] for d, r in enumerate(p)]))
        return total

    # The static index arrays the round uses (computed once per tree).
    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    @functools.cached_property
    def _index(self) -> dict:
        return {p: i + 1 for i, p in enumerate(self.paths)} | {(): 0}

    @functools.cached_property
    def parents(self) -> np.ndarray:
        """[N + 1] int32: node i's parent (the root's is 0)."""
        return np.array([0] + [self._index[p[:-1]] for p in self.paths], np.int32)

    @functools.cached_property
    def depths(self) -> np.ndarray:
        """[N + 1] int32: 0 for the root."""
        return np.array([0] + [len(p) for p in self.paths], np.int32)

    @functools.cached_property
    def ranks(self) -> np.ndarray:
        """[N + 1] int32: the child rank of each node (0 for the root)."""
        return np.array([0] + [p[-1] for p in self.paths], np.int32)

    @functools.cached_property
    def ancestors(self) -> np.ndarray:
        """[N + 1, N + 1] bool: [i, j] iff node j is node i or one of its ancestors."""
        n = self.num_nodes + 1
        out = np.zeros((n, n), bool)
        for i, p in enumerate(((), *self.paths)):
            for end in range(len(p) + 1):
                out[i, self._index[p[:end]]] = True
        return out

    @functools.cached_property
    def children(self) -> np.ndarray:
        """[N + 1, C] int32: node i's children in rank order, padded with -1 (C = most children)."""
        kids = [[] for _ in range(self.num_nodes + 1)]
        for i, p in enumerate(self.paths):
            kids[self._index[p[:-1]]].append(i + 1)  # canonical order = rank order among siblings
        width = max(len(k) for k in kids)
        return np.array([k + [-1] * (width - len(k)) for k in kids], np.int32)

    def level(self, depth: int) -> np.ndarray:
        """Node indices at `depth` (0: the root), in canonical order."""
        return np.flatnonzero(self.depths == depth).astype(np.int32)

    def internal(self, depth: int) -> np.ndarray:
        """Nodes at `depth` that have children: the ones a drafter must feed to expand them."""
        level = self.level(depth)
        return level[self.children[level, 0] >= 0]

    @property
    def is_chain(self) -> bool:
        return self.paths == Tree.chain(self.depth).paths

    def __repr__(self) -> str:
        return f"Tree(num_nodes={self.num_nodes}, depth={self.depth}, paths={list(self.paths)!r})"


# A prior for trees when nothing was measured: acceptance falls fast with rank and is flat
# in depth, roughly what a small draft achieves on its top candidates (Medusa's trees are
# built the same way from per-head top-k accuracies). `tune_tree` replaces it by a table
# measured for a given pair.
_PRIOR = np.array([[0.60, 0.15, 0.07, 0.04, 0.03, 0.02, 0.015, 0.01]] * 8)

PRESETS = {
    "binary-3": lambda: Tree.full(2, 3),  # 14 nodes
    "binary-4": lambda: Tree.full(2, 4),  # 30 nodes
    "prior-16": lambda: Tree.from_acceptance(_PRIOR, 16),
    "prior-32": lambda: Tree.from_acceptance(_PRIOR, 32),
    "medusa-like-64": lambda: Tree.from_acceptance(_PRIOR, 64),
}
