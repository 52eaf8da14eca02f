"""Static tree verification: structure, greedy equality, exact sampling, cache compaction.

Every sampling test has a negative control: `tree_no_residual_rule`, which tries siblings
against the original p instead of the residual, must fail the very same test.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import RAGGED_PROMPTS, TARGET_CONFIG, noisy_copy, scaled_model

import specjax
from specjax.bench.distribution import chi_square_p_value
from specjax.core.loop import prefill
from specjax.core.sampling import SamplingConfig, probabilities, sample
from specjax.drafters import DraftModel, LayerSkip, PromptLookup
from specjax.engine.tune import measure_acceptance, tune_tree
from specjax.trees import Tree, tree_greedy_rule, tree_no_residual_rule, tree_rejection_rule

P_VALUE_PASS = 1e-3
P_VALUE_FAIL = 1e-8
GREEDY = specjax.GenerationConfig(max_new_tokens=24)


def _tree(tree, **fields) -> specjax.SpeculativeConfig:
    return specjax.SpeculativeConfig(tree=tree, **fields)


def random_tree(seed: int, num_nodes: int) -> Tree:
    """A random valid tree: each new node is the next-ranked child of a random node."""
    rng = np.random.default_rng(seed)
    paths, kids = [()], {(): 0}
    while len(paths) <= num_nodes:
        parent = paths[rng.integers(len(paths))]
        child = (*parent, kids[parent])
        kids[parent] += 1
        kids[child] = 0
        paths.append(child)
    return Tree.from_paths(paths[1:])


# --- Structure -------------------------------------------------------------------------------


def test_tree_structure_arrays():
    tree = Tree.from_paths([(1,), (0, 0), (0,), (0, 1), (1, 0), (0, 0, 0)])
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))  # canonical order
    assert (tree.num_nodes, tree.depth) == (6, 3)
    assert tree.parents.tolist() == [0, 0, 0, 1, 1, 2, 3]
    assert tree.depths.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert tree.children[0].tolist() == [1, 2] and tree.children[2].tolist() == [5, -1]
    assert tree.ancestors[6].tolist() == [True, True, False, True, False, False, True]
    assert tree.internal(1).tolist() == [1, 2] and tree.internal(2).tolist() == [3]
    assert Tree.chain(3).paths == ((0,), (0, 0), (0, 0, 0)) and Tree.chain(3).is_chain
    assert Tree.full(2, 3).num_nodes == 14
    assert Tree.preset("medusa-like-64").num_nodes == 64


@pytest.mark.parametrize(
    "paths, message",
    [
        ([], "at least one node"),
        ([(0, 0)], "prefix"),
        ([(0,), (1, 0)], "prefix (1,)"),
        ([(0,), (0,)], "twice"),
        ([(0,), ()], "root is implicit"),
        ([(0,), (-1,)], "non-negative"),
        (5, "list of tuples"),
    ],
)
def test_invalid_trees_are_clear_errors(paths, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Tree.from_paths(paths)


def test_from_acceptance_is_optimal_among_small_trees():
    """Greedy expansion equals brute force over every valid 4-node tree of ranks < 3, depth <= 3."""
    acceptance = np.array([[0.5, 0.25, 0.1], [0.7, 0.1, 0.05], [0.8, 0.1, 0.02]])
    candidates = [p for d in (1, 2, 3) for p in itertools.product(range(3), repeat=d)]
    best = 0.0
    for subset in itertools.combinations(candidates, 4):
        if all(p[:end] in subset for p in subset for end in range(1, len(p))):
            best = max(best, Tree(subset).expected_accepted(acceptance))
    tree = Tree.from_acceptance(acceptance, 4)
    assert tree.num_nodes == 4
    assert tree.expected_accepted(acceptance) == pytest.approx(best)


# --- The rule alone, on fixed distributions ----------------------------------------------------


def _star(vocab: int, batch: int, seed: int):
    """A root with 3 children drawn i.i.d. from q, each with one child: p, q fixed per node."""
    tree = Tree.from_paths([(0,), (1,), (2,), (0, 0), (1, 0), (2, 0)])
    rng = np.random.default_rng(seed)
    p = jnp.asarray(rng.dirichlet(np.ones(vocab) * 0.5, size=tree.num_nodes + 1), jnp.float32)
    q = jnp.asarray(rng.dirichlet(np.ones(vocab) * 0.5, size=tree.num_nodes + 1), jnp.float32)
    return tree, jnp.broadcast_to(p, (batch, *p.shape)), jnp.broadcast_to(q, (batch, *q.shape))


@pytest.mark.parametrize("rule_name", ["exact", "no_residual"])
@pytest.mark.parametrize("candidates", ["iid", "top"])
def test_tree_rule_first_token_follows_target(rule_name, candidates):
    batch, vocab = 20000, 6
    tree, p, q = _star(vocab, batch, seed=0)
    draw_key, rule_key = jax.random.split(jax.random.key(0))
    if candidates == "iid":
        # Each node's children are i.i.d. draws from q at that node.
        draws = sample(draw_key, q[:, tree.parents[1:]])  # [B, N]
        tokens, q_arg = draws, q
    else:
        # Deterministic distinct candidates: the top-ranked tokens of q at the parent (q None).
        order = jnp.argsort(-q[0], axis=-1)  # [N+1, V]
        tokens = jnp.broadcast_to(order[tree.parents[1:], tree.ranks[1:]], (batch, tree.num_nodes))
        q_arg = None
    rule = tree_rejection_rule if rule_name == "exact" else tree_no_residual_rule
    path, n, next_token = jax.jit(rule, static_argnums=1)(rule_key, tree, tokens, p, q_arg)
    first_node = np.asarray(path[:, 0])  # 0 when nothing was accepted
    accepted_token = np.asarray(tokens)[np.arange(batch), np.maximum(first_node - 1, 0)]
    first = np.where(np.asarray(n) > 0, accepted_token, np.asarray(next_token))
    p_value = chi_square_p_value(first, np.asarray(p[0, 0]))
    if rule_name == "exact":
        assert p_value > P_VALUE_PASS
    else:
        assert p_value < P_VALUE_FAIL


def test_tree_greedy_rule_picks_the_matching_branch():
    tree = Tree.from_paths([(0,), (1,), (1, 0), (1, 1)])  # nodes: 1=(0,) 2=(1,) 3=(1,0) 4=(1,1)
    tokens = jnp.asarray([[5, 2, 7, 3]])
    vocab = 8

    def logits(ids):  # argmax per node 0..4
        return jax.nn.one_hot(jnp.asarray(ids), vocab)[None]

    path, n, nxt = tree_greedy_rule(None, tree, tokens, logits([2, 0, 3, 0, 6]), None)
    assert (path[0].tolist(), int(n[0]), int(nxt[0])) == ([2, 4], 2, 6)  # root->2 (tok 2)->4 (tok 3), bonus 6
    path, n, nxt = tree_greedy_rule(None, tree, tokens, logits([1, 0, 4, 0, 0]), None)
    assert (path[0].tolist(), int(n[0]), int(nxt[0])) == ([0, 0], 0, 1)  # nothing matches: correction 1


# --- The engine: greedy equality and counters ---------------------------------------------------


@pytest.fixture(scope="module")
def pair():
    # A draft close to the target: most rounds accept several tokens, so a wrong mask, rule or
    # compaction shows up as a wrong token rather than as one more rejection.
    target = scaled_model(TARGET_CONFIG, seed=0)
    return target, noisy_copy(target, noise=0.1, seed=3)


@pytest.fixture(scope="module")
def plain(pair):
    return specjax.generate(pair[0], RAGGED_PROMPTS, GREEDY)


# A full tree and an irregular one. Also covered elsewhere, each compiling its own programs: a
# chain tree (test_chain_tree_equals_num_speculative_tokens: chain(3) == K=3 == plain, so a
# separate chain(4) case was dropped), another irregular tree of 14 nodes across attention
# blocks (test_tree_greedy_with_blockwise_attention, so a second random tree of 9 nodes was
# dropped) and binary3's K/V compaction step by step (test_compacted_caches_*).
TREES = {
    "binary3": Tree.full(2, 3),
    "random20": random_tree(2, 20),
}


# Every tree with the draft model; LayerSkip expands a tree with the same generic walk (the tree
# is static structure), so a full and an irregular tree cover it (chains: test_chain_tree_*).
@pytest.mark.parametrize(
    "drafter_name, tree_name",
    [*(("draft_model", name) for name in sorted(TREES)), ("layer_skip", "binary3"), ("layer_skip", "random20")],
)
def test_tree_greedy_equals_plain_greedy(pair, plain, tree_name, drafter_name):
    target, draft = pair
    drafter = DraftModel(draft) if drafter_name == "draft_model" else LayerSkip(layers=1)
    out = specjax.generate(target, RAGGED_PROMPTS, GREEDY, draft=drafter, speculative=_tree(TREES[tree_name]))
    assert out.tokens == plain.tokens
    assert out.stats.accepted_tokens > 0


def test_tree_greedy_with_blockwise_attention(pair):
    """Caches of several attention blocks take the blockwise path (models/attention.py): the
    tree mask must hold there too, including a tree window that straddles a block edge."""
    target, draft = pair
    config = specjax.GenerationConfig(max_new_tokens=40, cache=specjax.CacheConfig(block_size=16))
    plain_out = specjax.generate(target, RAGGED_PROMPTS, config)
    out = specjax.generate(target, RAGGED_PROMPTS, config, draft=draft, speculative=_tree(random_tree(4, 14)))
    assert out.tokens == plain_out.tokens


def test_tree_with_eos_cuts_rows_like_plain(pair):
    target, draft = pair
    eos = specjax.generate(target, RAGGED_PROMPTS, GREEDY).tokens[1][5]
    config = GREEDY.replace(eos_token_id=eos)
    plain_out = specjax.generate(target, RAGGED_PROMPTS, config)
    # The EOS is no part of the compiled program: this reuses test_tree_greedy_equals_plain_greedy's.
    tree = _tree(TREES["random20"])
    out = specjax.generate(target, RAGGED_PROMPTS, config, draft=draft, speculative=tree)
    assert out.tokens == plain_out.tokens
    assert any(len(t) < 24 for t in out.tokens)


def test_chain_tree_equals_num_speculative_tokens(pair, plain):
    target, draft = pair
    chain = specjax.generate(
        target, RAGGED_PROMPTS, GREEDY, draft=draft, speculative=specjax.SpeculativeConfig(num_speculative_tokens=3)
    )
    tree = specjax.generate(target, RAGGED_PROMPTS, GREEDY, draft=draft, speculative=_tree(Tree.chain(3)))
    assert tree.tokens == chain.tokens == plain.tokens  # a chain tree's greedy equality (no chain case above)
    for field in ("rounds", "target_forwards", "accepted_tokens", "generated_tokens", "accepted_counts"):
        assert getattr(tree.stats, field) == getattr(chain.stats, field), field


def test_a_branching_tree_accepts_more_per_round_than_its_chain(pair):
    target, draft = pair
    # chain(3) is test_chain_tree_equals_num_speculative_tokens' program, binary3 the greedy test's.
    chain = specjax.generate(target, RAGGED_PROMPTS, GREEDY, draft=draft, speculative=_tree(Tree.chain(3)))
    bushy = specjax.generate(target, RAGGED_PROMPTS, GREEDY, draft=draft, speculative=_tree(TREES["binary3"]))
    assert bushy.stats.mean_acceptance_length > chain.stats.mean_acceptance_length


# --- Cache compaction ----------------------------------------------------------------------------


def test_compacted_caches_equal_a_plain_prefill_of_the_committed_tokens(pair):
    target, draft = pair
    tree = TREES["binary3"]  # it branches, so K/V really move; 14 nodes compile faster than full(3, 3)
    state = specjax.init_state(target, RAGGED_PROMPTS, GREEDY, draft=draft, speculative=_tree(tree))
    moved_any = False
    for _ in range(4):
        before = np.asarray(state.lengths)
        state = specjax.step(target, state, draft=draft)
        committed = np.asarray(state.lengths)
        # Rank-0 paths are moved onto themselves; a branch elsewhere really moves K/V.
        moved_any |= bool(np.any(committed - before > 1))
        reference = prefill(target.config, target.params, state.tokens, state.lengths, state.tokens.shape[1])
        draft_reference = prefill(draft.config, draft.params, state.tokens, state.lengths, state.tokens.shape[1])
        valid = np.asarray(state.target_cache.lengths)
        assert np.all(valid == committed - 1)  # everything but the closing token, which is fed next
        for b, n in enumerate(valid):
            np.testing.assert_allclose(state.target_cache.k[:, b, :n], reference.k[:, b, :n], atol=2e-5)
            np.testing.assert_allclose(state.target_cache.v[:, b, :n], reference.v[:, b, :n], atol=2e-5)
            # The draft fed every accepted node but perhaps the last (a leaf is never fed): the
            # ones before it must have moved into place in the draft cache too.
            fed = max(before[b], committed[b] - 2)
            cache = state.draft_state.cache
            np.testing.assert_allclose(cache.k[:, b, :fed], draft_reference.k[:, b, :fed], atol=2e-5)
    assert moved_any


# --- Exact sampling through the engine -----------------------------------------------------------

VOCAB8 = TARGET_CONFIG.replace(vocab_size=8)
PROMPT = [1, 2, 3]
SAMPLES = 3000  # the wrong variants fail by p < 1e-40 at this size (1e-8 needed)


def _exact_joint(target, sampling: SamplingConfig) -> np.ndarray:
    """p(t1, t2 | prompt) under the processed target distribution -> [V * V]."""
    vocab = target.config.vocab_size
    first = probabilities(jnp.asarray(specjax.io.model.logits(target, [PROMPT])[0, -1]), sampling)
    seconds = specjax.io.model.logits(target, [[*PROMPT, t] for t in range(vocab)])[:, -1]  # [V, V]
    second = probabilities(jnp.asarray(seconds), sampling)
    return np.asarray(first[:, None] * second).reshape(-1)


@pytest.fixture(scope="module")
def pair8():
    target = scaled_model(VOCAB8, seed=0, scale=6.0)
    draft = scaled_model(VOCAB8.replace(num_hidden_layers=1), seed=5, scale=6.0)
    return target, draft


SAMPLINGS = {
    "t1": specjax.GenerationConfig(max_new_tokens=2, do_sample=True, temperature=1.0, seed=1),
    "t0.7_topk5_topp0.9": specjax.GenerationConfig(
        max_new_tokens=2, do_sample=True, temperature=0.7, top_k=5, top_p=0.9, seed=1
    ),
}


# Every candidate kind and every sampling config passes with the exact rule; the negative
# control fails for both candidate kinds (six engine runs of SAMPLES rows, not eight).
@pytest.mark.parametrize(
    "sampling_name, candidates, rule_name",
    [
        ("t1", "sample", "exact"),
        ("t1", "top", "exact"),
        ("t0.7_topk5_topp0.9", "sample", "exact"),
        ("t0.7_topk5_topp0.9", "top", "exact"),
        ("t1", "sample", "no_residual"),
        ("t1", "top", "no_residual"),
    ],
)
def test_tree_sampling_joint_of_first_two_tokens(pair8, sampling_name, candidates, rule_name):
    target, draft = pair8
    config = SAMPLINGS[sampling_name]
    expected = _exact_joint(target, config.sampling)
    out = specjax.generate(
        target,
        [PROMPT] * SAMPLES,
        config,
        draft=DraftModel(draft, tree_candidates=candidates),
        speculative=_tree(
            Tree.from_paths([(0,), (1,), (2,), (0, 0), (1, 0), (0, 1)]),
            rule=None if rule_name == "exact" else tree_no_residual_rule,
        ),
    )
    tokens = np.asarray(out.tokens)
    p_value = chi_square_p_value(tokens[:, 0] * 8 + tokens[:, 1], expected)
    if rule_name == "exact":
        assert p_value > P_VALUE_PASS
        assert 0.0 < out.stats.acceptance_rate < 1.0
    else:
        assert p_value < P_VALUE_FAIL


# --- Errors --------------------------------------------------------------------------------------


def test_tree_errors_name_the_problem(pair):
    target, draft = pair
    # A list of paths is a tree spec now (SpeculativeConfig reads it with Tree.from_spec); a value
    # that is no tree is refused when the config is built, naming what a tree is made of.
    assert _tree([(0,), (1,)]).tree == Tree.from_paths([(0,), (1,)])
    with pytest.raises(ValueError, match="tree paths must be a list of tuples"):
        _tree(5)
    with pytest.raises(ValueError, match="cannot expand a token tree"):
        specjax.generate(target, [[1, 2]], draft=PromptLookup(), speculative=_tree(Tree.chain(2)))
    with pytest.raises(ValueError, match="headroom"):
        specjax.generate(
            target,
            [[1, 2]],
            specjax.GenerationConfig(max_new_tokens=200),
            draft=draft,
            speculative=_tree(Tree.preset("medusa-like-64")),
        )


# --- Tuning and parsing -----------------------------------------------------------------------


def test_tuned_tree_beats_the_chain_of_equal_width(pair):
    """tune_tree's tree accepts at least as much per round as the chain of the same width,
    and its predicted tokens per round is close to what the engine then measures."""
    target, draft = pair
    prompts = [[i, i + 1, i + 2] for i in range(1, 13)]
    table = measure_acceptance(target, draft, prompts, max_new_tokens=24, max_depth=6, max_rank=4)
    assert table.shape == (6, 4)
    assert np.all(table >= 0) and np.all(table.sum(axis=1) <= 1 + 1e-9)  # ranks are disjoint events
    tuned = tune_tree(target, draft, prompts, num_nodes=8, max_new_tokens=24, max_depth=6, max_rank=4)
    assert tuned == Tree.from_acceptance(table, 8) and tuned.num_nodes == 8
    measured = {}
    for name, tree in {"tuned": tuned, "chain": Tree.chain(8)}.items():
        out = specjax.generate(target, prompts, GREEDY, draft=draft, speculative=_tree(tree))
        measured[name] = out.stats.mean_acceptance_length
    assert measured["tuned"] >= measured["chain"]
    # Within 10%: the positional model runs a little high (it ignores EOS and the token budget).
    assert abs(measured["tuned"] - (1 + tuned.expected_accepted(table))) < 0.1 * measured["tuned"]


def test_tuning_reads_a_multi_layer_heads_own_features():
    """EAGLE-3 heads (specjax's reduce and the published fc) draft their first token from the
    target's block outputs: the tuner's depth-1 acceptance, teacher-forced on those, is what
    decoding with a chain of one measures (depth 1 reads only true target features)."""
    target = specjax.load_model("stdlib-target")
    prompts = ["def parse_args(self):\n", "import os\nimport sys\n", "class Config:\n", "for i in range(10):\n"]
    for name in ("stdlib-eagle3", "stdlib-eagle3-published"):
        head = specjax.load_drafter(name, target)
        table = measure_acceptance(target, head, prompts, max_new_tokens=24, max_depth=2, max_rank=2)
        out = specjax.generate(target, prompts, GREEDY, draft=head, speculative=_tree(Tree.chain(1)))
        # Not equal: the table counts every position (96), decoding only round starts (~57).
        assert abs(table[0, 0] - out.stats.acceptance_rate) < 0.1, (name, table[0, 0], out.stats.acceptance_rate)
        assert table[0, 0] > 0.5  # well-trained heads: far from the garbage features would give


def test_tree_from_spec():
    assert Tree.from_spec("chain:3") == Tree.chain(3)
    assert Tree.from_spec("full:2:2") == Tree.full(2, 2)
    assert Tree.from_spec("binary-3") == Tree.full(2, 3)
    assert Tree.from_spec("[[0], [1], [0, 0]]") == Tree.from_paths([(0,), (1,), (0, 0)])
    with pytest.raises(ValueError, match="unknown tree"):
        Tree.from_spec("bushy")
    with pytest.raises(ValueError, match="prefix"):
        Tree.from_spec("[[0, 1]]")
