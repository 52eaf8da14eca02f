"""Token trees over block drafters (DDTree / JetSpec): one pass gives every level.

A node at depth d takes its candidates from block position d of the drafter's one forward
(drafters/block_trees.py). Exact like every tree: greedy output equals plain greedy for the
shipped block head and PARD draft on the embedded target (ragged rows, batch > 1), and at
T = 1 the first two tokens follow the target's joint distribution, for i.i.d. drawn and for
top-ranked candidates, while a variant that takes the top-ranked tokens but reports them as
drawn from q (the mistake the tree rule cannot forgive) fails the very same test.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import scaled_model
from test_sampling import P_VALUE_FAIL, P_VALUE_PASS, PROMPT, VOCAB8, _exact_joint

import specjax
from specjax.bench.distribution import chi_square_p_value
from specjax.core.sampling import probabilities
from specjax.drafters import BlockHead, ParallelDraft
from specjax.drafters.block_trees import recording, spine_paths
from specjax.drafters.proposing import block_tree
from specjax.trees import Tree

# Branching at three depths, depth 4 (the shipped block head's block_size).
TREE = Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)])
PROMPTS = ["def parse_args(self):\n", "import os\n", "x = [i for i in range(10)]\nprint("]
SAMPLES = 3000  # the wrong variant's p-value is 0.0 already at 2000


# --- Shapes ------------------------------------------------------------------------------------


def test_spine_paths():
    assert spine_paths([1, 1, 1]) == list(Tree.chain(3).paths)
    spine = Tree.from_paths(spine_paths([3, 2, 1]))
    assert spine.paths == ((0,), (1,), (2,), (0, 0), (0, 1), (0, 0, 0))
    # Every node below depth 1 hangs under the rank-0 path: the best parent.
    assert all(all(r == 0 for r in p[:-1]) for p in spine.paths)
    with pytest.raises(ValueError, match="widths >= 1"):
        spine_paths([2, 0])


def test_recording_reports_the_drafters_rank_probabilities_and_keeps_its_proposals(pair8):
    target, draft = pair8
    seen = []
    drafter = ParallelDraft(draft, VOCAB8.vocab_size - 1)
    config = specjax.GenerationConfig(max_new_tokens=6)
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=3)
    unrecorded = specjax.generate(target, [PROMPT, PROMPT[:1]], config, draft=drafter, speculative=speculative)
    recorded = recording(drafter, lambda top, done: seen.append(np.asarray(top)), max_rank=4)
    out = specjax.generate(target, [PROMPT, PROMPT[:1]], config, draft=recorded, speculative=speculative)
    assert out.tokens == unrecorded.tokens and out.stats.accepted_tokens == unrecorded.stats.accepted_tokens
    top = np.concatenate(seen)  # [rounds * B, K, R]
    assert 2 * len(seen) >= out.stats.num_drafts > 0 and top.shape[1:] == (3, 4)  # one call per round, B = 2
    assert np.all(np.diff(top, axis=-1) <= 0) and np.all(top.sum(-1) <= 1 + 1e-5) and top[..., 0].min() >= 1 / 8
    with pytest.raises(ValueError, match="needs a block drafter"):
        recording(object(), print, 4)


# --- Greedy: equal to plain greedy on the embedded pair ----------------------------------------


@pytest.fixture(scope="module")
def embedded():
    target = specjax.load_model("stdlib-target")
    config = specjax.GenerationConfig(max_new_tokens=16)
    return target, config, specjax.generate(target, PROMPTS, config).tokens


@pytest.mark.parametrize("name", ["stdlib-block-head", "stdlib-pard-draft"])
def test_tree_greedy_equals_plain_on_ragged_rows(embedded, name):
    target, config, expected = embedded
    drafter = specjax.load_drafter(name, target)
    assert isinstance(drafter, BlockHead | ParallelDraft) and drafter.supports_trees
    out = specjax.generate(target, PROMPTS, config, draft=drafter, speculative=specjax.SpeculativeConfig(tree=TREE))
    assert out.tokens == expected
    s = out.stats
    # One drafter forward per round drafts all 9 nodes; the trained drafters are accepted.
    assert s.drafted_tokens == TREE.num_nodes * s.num_drafts
    assert s.mean_acceptance_length > 1.5


# --- T = 1: the target's distribution, exactly -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TopReportedAsDrawn(ParallelDraft):
    """Deliberately wrong: the distinct top-ranked candidates of each block position, but q
    says they were drawn i.i.d. from it (the rule then over-accepts the likeliest ones)."""

    def propose_tree(self, weights, state, ctx, key):
        tree = ctx.tree
        logits, state = self.block_logits(weights, state, ctx, tree.depth)  # [B, depth, V]
        proposal = block_tree(logits, tree, key, ctx.sampling, "top")
        q = probabilities(logits, ctx.sampling)[:, np.minimum(tree.depths, tree.depth - 1)]  # [B, N + 1, V]
        return proposal.replace(q=q), state


@pytest.fixture(scope="module")
def pair8():
    target = scaled_model(VOCAB8, seed=0, scale=6.0)
    draft = scaled_model(VOCAB8.replace(num_hidden_layers=1), seed=5, scale=6.0)
    return target, draft


@pytest.mark.parametrize("variant", ["sample", "top", "top_reported_as_drawn"])
def test_tree_sampling_follows_the_target_at_t1(pair8, variant):
    target, draft = pair8
    config = specjax.GenerationConfig.at_temperature(1.0, max_new_tokens=2, seed=1)
    expected = _exact_joint(target, config.sampling)  # p(t1, t2 | PROMPT), [64]
    mask = VOCAB8.vocab_size - 1
    if variant == "top_reported_as_drawn":
        drafter = TopReportedAsDrawn(draft, mask, tree_candidates="top")
    else:
        drafter = ParallelDraft(draft, mask, tree_candidates=variant)
    tree = Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)])
    out = specjax.generate(
        target, [PROMPT] * SAMPLES, config, draft=drafter, speculative=specjax.SpeculativeConfig(tree=tree)
    )
    tokens = np.asarray(out.tokens)
    p_value = chi_square_p_value(tokens[:, 0] * 8 + tokens[:, 1], expected)
    if variant == "top_reported_as_drawn":
        assert p_value < P_VALUE_FAIL
    else:
        assert p_value > P_VALUE_PASS
        assert 0.0 < out.stats.acceptance_rate < 1.0
