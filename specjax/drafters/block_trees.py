"""Tree shapes for block drafters (DDTree / JetSpec, 2026): one pass, every level.

A block drafter (ParallelDraft, BlockHead) gives the distributions of all K block positions
in ONE forward, none conditioned on the tokens above it. Its token tree is therefore the
Cartesian one (`proposing.cartesian_tree`, which `BlockProposals.propose_tree` builds): a
node at depth d takes its candidates from block position d, the rank-r child being that
position's r-th token by the drafter's probability (or its r-th i.i.d. draw under
sampling with tree_candidates="sample"), whatever the parent token. That the position's
distribution ignores the parent is DDTree's approximation; verification does not care,
it stays exact (see below). What is left to choose is the tree's shape, and this module
gives the pieces of DDTree's reads of it (paths, not Trees: drafters/ does not import
trees/, so callers pass them to SpeculativeConfig(tree=...) or Tree.from_paths):

  spine_paths(widths)      depth d's top widths[d-1] candidates, hung under the best parent
                           (the rank-0 path: with parent-blind distributions every node at
                           a depth has the same children, so the best parent is the one
                           most likely accepted)
  recording(drafter, ...)  the drafter, reporting its per-position rank probabilities
                           each round (the confidence table DDTree's shapes read;
                           scripts/block_trees.py averages it over real rounds)

DDTree's best-first shape, the N nodes of highest product of their path's rank
probabilities, averaged over rounds so that the shape is static, is then
`Tree.from_acceptance(table, N)` on the recorded table [depth, R] (its greedy expansion is
optimal for a table that falls with rank).

Exactness. Greedy: any candidates are exact (the greedy rule accepts a child only if it is
the target's argmax). Sampling: with tree_candidates="sample" the children of a depth-d node
are i.i.d. draws from position d + 1's distribution and q[:, node] records exactly that
distribution (SpecInfer's rule); with "top" they are the distinct top-ranked tokens, a
deterministic proposal (q = None: recursive rejection without replacement). Reporting q
for top-ranked candidates would be wrong (tests/test_block_trees.py's negative control).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from specjax.drafters.common import BlockProposals
from specjax.drafters.proposing import block_proposal


def spine_paths(widths: Sequence[int]) -> list[tuple[int, ...]]:
    """Depth d (1-based) holds the top widths[d-1] candidates of block position d, all
    children of the rank-0 path: paths (0,) * (d - 1) + (r,), r < widths[d - 1].
    sum(widths) nodes; `spine_paths([1] * K)` is the chain of K."""
    widths = [int(w) for w in widths]
    if not widths or min(widths) < 1:
        raise ValueError(f"spine_paths needs at least one depth and widths >= 1, got {widths}")
    return [(0,) * d + (r,) for d, w in enumerate(widths) for r in range(w)]


def recording(drafter: BlockProposals, sink, max_rank: int):
    """`drafter` as a chain drafter that also reports each round's top-`max_rank`
    probabilities (softmax at T = 1) per block position: sink(top [B, K, R], done [B]) runs
    on the host through jax.debug.callback. For measuring a confidence table (DDTree's own
    estimate of a candidate's survival; scripts/block_trees.py), never for serving."""
    if not isinstance(drafter, BlockProposals):
        raise ValueError(f"recording needs a block drafter (ParallelDraft, BlockHead), got {drafter!r}")

    @dataclasses.dataclass(frozen=True)
    class Recording(type(drafter)):
        def propose(self, weights, state, ctx, key):
            logits, state = self.block_logits(weights, state, ctx, ctx.num_speculative_tokens)  # [B, K, V]
            top = jax.lax.top_k(jax.nn.softmax(logits.astype(jnp.float32), axis=-1), max_rank)[0]  # [B, K, R]
            jax.debug.callback(sink, top, ctx.done)
            return block_proposal(logits, key, ctx.sampling, ctx.grammar), state

    return Recording(**{f.name: getattr(drafter, f.name) for f in dataclasses.fields(drafter)})
