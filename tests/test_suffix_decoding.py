"""Suffix decoding (drafters/suffix.py): the search on hand-made buffers, exactness end to end
(greedy == plain, T = 1 distribution with an always-accept variant that must fail), a pool
that really changes acceptance, and the names the API, bench configs and CLI use."""

from __future__ import annotations

import contextlib
import io
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import RAGGED_PROMPTS, scaled_model
from test_sampling import SAMPLES, VOCAB8, _exact_joint, check_two_tokens

import specjax
from specjax.bench.drafter_spec import parse_draft
from specjax.core.acceptance import always_accept_rule
from specjax.core.sampling import SamplingConfig
from specjax.drafters import DraftContext, make_drafter
from specjax.drafters.suffix import SuffixDecoding, pool_entries, suffix_search

# --- The search, on hand-made token buffers (no model) -----------------------------------------


_jitted_search = jax.jit(suffix_search, static_argnums=(3, 4, 5, 6, 7, 8))  # one program, not 100 op dispatches


def _search(rows, pool=(), k=4, max_match=4, min_match=1, max_candidates=8, spec_factor=1.0, min_token_prob=0.1):
    """rows: committed tokens per row (the buffer is 0-padded to 16 slots). -> (proposal,
    chosen, match length, occurrences, pool support) as lists."""
    tokens = np.zeros((len(rows), 16), np.int32)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    pool = SuffixDecoding(pool=pool).pool
    lengths = jnp.asarray([len(r) for r in rows], jnp.int32)
    proposal, chosen, info = _jitted_search(jnp.asarray(tokens), lengths, pool, k, max_match, min_match,
                                            max_candidates, spec_factor, min_token_prob)  # fmt: skip
    info = [np.asarray(info[key]).tolist() for key in ("match_length", "match_occurrences", "pool_support")]
    return (np.asarray(proposal).tolist(), np.asarray(chosen).tolist(), *info)


def test_own_text_longest_match_and_periodic_continuation():
    # As prompt lookup: [7] occurs twice, the latest followed by 2; the bigram [5, 7] once.
    assert _search([[7, 1, 5, 7, 2, 5, 7]], k=2)[:3] == ([[2, 5]], [2], [2])
    # A continuation running into the end repeats: 3 1 2 3 1 2 3.
    assert _search([[1, 2, 3, 1, 2]], k=7)[0] == [[3, 1, 2, 3, 1, 2, 3]]
    # No match: the last token, no real proposal; padding (0s past the end) never matches.
    assert _search([[1, 2, 3], [0, 5, 0]], k=2)[:3] == ([[3, 3], [5, 0]], [0, 1], [0, 1])


def test_the_most_frequent_continuation_wins_over_the_latest():
    # [4] follows the suffix [3] twice (slots 1, 3), [9] once, latest: frequency decides.
    proposal, chosen, match, occurrences, _ = _search([[3, 4, 3, 4, 3, 9, 3]], k=1, max_match=1)
    assert (proposal, match, occurrences) == ([[4]], [1], [3])
    # In the pool: two of three occurrences of [2, 3] continue 4 5 6, one 4 5 7.
    pool = [[9, 2, 3, 4, 5, 6], [2, 3, 4, 5, 7], [2, 3, 4, 5, 6]]
    proposal, chosen, match, occurrences, from_pool = _search([[1, 2, 3]], pool, k=4, spec_factor=3.0)
    assert proposal[0][:3] == [4, 5, 6] and (match, occurrences, from_pool) == ([2], [3], [True])
    # A pool sequence that ends stops counting; with none left the path ends (chosen 3, not 4).
    assert chosen == [3]


def test_the_longest_match_wins_even_where_it_is_rarer():
    pool = [[2, 3, 4, 9], [2, 3, 4, 9], [1, 2, 3, 4, 8]]
    assert _search([[1, 2, 3]], pool, k=2)[0] == [[4, 8]]  # [1, 2, 3] once beats [2, 3] twice
    assert _search([[1, 2, 3]], pool, k=2, max_match=2)[0] == [[4, 9]]  # matches capped at 2: frequency


def test_the_length_rule_spec_factor_and_min_token_prob():
    row = [[5, 6, 7, 8, 1, 5, 6]]  # [5, 6] matched (length 2), then 7 8 1 5
    assert _search(row, k=4)[1] == [2]  # at most spec_factor x match length = 2 tokens
    assert _search(row, k=4, spec_factor=2.0)[1] == [4]
    # Five different continuations of [3]: the first token's estimated probability is 1/5.
    pool = [[3, 10], [3, 11], [3, 12], [3, 13], [3, 14]]
    assert _search([[3]], pool, k=1, min_token_prob=0.1)[1] == [1]
    assert _search([[3]], pool, k=1, min_token_prob=0.3)[1] == [0]  # not worth verifying: abstain


# --- Exactness end to end -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain(target):
    return specjax.generate(target, RAGGED_PROMPTS, specjax.GenerationConfig(max_new_tokens=20))


def _run(target, pool=None, k=4, **fields):
    spec = specjax.SpeculativeConfig(method="suffix", num_speculative_tokens=k, suffix_pool=pool, **fields)
    return specjax.generate(target, RAGGED_PROMPTS, specjax.GenerationConfig(max_new_tokens=20), speculative=spec)


def test_greedy_equals_plain_with_and_without_a_pool(target, plain):
    # A pool of half-right continuations: rows accept some drafts and reject others.
    shifted = [[(t + 1) % 48 if i % 3 == 2 else t for i, t in enumerate(row)] for row in plain.tokens]
    for pool in (None, shifted):
        out = _run(target, pool)
        assert out.tokens == plain.tokens
        assert 0.0 < out.stats.acceptance_rate < 1.0
    # Adaptive speculation: a plain step where no live row has a real proposal (no pool:
    # the first rounds find no match). Drafting costs next to nothing here, so it drafts otherwise.
    adaptive = _run(target, k=2, adaptive=specjax.AdaptiveConfig(ks=(0, 2), costs={0: 1.0, 2: 1.01}))
    assert adaptive.tokens == plain.tokens
    assert adaptive.stats.adaptive["abstained_steps"] > 0


def test_abstains_and_found_mark_rows_without_a_proposal_worth_verifying():
    tokens = jnp.array([[5, 6, 7, 5, 0, 0], [1, 2, 3, 4, 0, 0]])  # row 0's last token occurred before
    ctx = DraftContext(tokens=tokens, lengths=jnp.array([4, 4]), prompt_lengths=jnp.array([4, 4]),
                       done=jnp.array([False, False]), target_params=None, target=None, num_speculative_tokens=2,
                       sampling=None)  # fmt: skip
    alone, pooled = SuffixDecoding(), SuffixDecoding(pool=[[9, 4, 8]])  # the pool continues row 1's last token
    abstains = jax.jit(lambda weights, ctx: alone.abstains(weights, None, ctx))  # the pool is an argument
    assert abstains(alone.weights(), ctx).tolist() == [False, True]
    assert abstains(pooled.weights(), ctx).tolist() == [False, False]
    propose = jax.jit(lambda weights, ctx: alone.propose(weights, alone.init(weights, ctx, tokens, 6), ctx, None)[0])
    proposal = propose(alone.weights(), ctx)
    assert proposal.found.tolist() == [True, False] and proposal.q is None


def test_a_pool_holding_the_answer_raises_acceptance(target, plain):
    answers = [[*p, *o] for p, o in zip(RAGGED_PROMPTS, plain.tokens, strict=True)]
    alone, pooled = _run(target), _run(target, answers)
    assert pooled.tokens == plain.tokens
    assert pooled.stats.drafter["pool_rounds"] > 0 and alone.stats.drafter["pool_rounds"] == 0
    assert pooled.stats.mean_acceptance_length > alone.stats.mean_acceptance_length + 1.0
    assert pooled.stats.mean_acceptance_length > 4.0  # K = 4: most rounds accept every draft
    assert pooled.stats.drafter["no_match_rounds"] < alone.stats.drafter["no_match_rounds"]
    # The agent loop's way: the drafter remembers a call's prompts and outputs (newest kept).
    remembered = SuffixDecoding(pool=[[9, 9, 9]]).remember(answers, max_sequences=len(answers))
    kept = [[t for t in row if t >= 0] for row in np.asarray(remembered.pool).tolist()]
    assert kept == answers and remembered.without_weights() == SuffixDecoding()  # [9, 9, 9], the oldest, dropped


@pytest.mark.parametrize("rule_name", ["exact", "always_accept"])
def test_sampling_keeps_the_target_distribution(rule_name):
    """T = 1, the joint of the first two tokens; the pool proposes [5, 6] after the prompt
    [1, 2, 3] with certainty, so accepting it always (the wrong variant) must fail."""
    target = scaled_model(VOCAB8, seed=0, scale=6.0)
    expected = _exact_joint(target, SamplingConfig(temperature=1.0))
    assert expected[5 * 8 + 6] < 0.5, "the pool's proposal must not be the target's near-certain pair"
    rule = None if rule_name == "exact" else always_accept_rule
    spec = specjax.SpeculativeConfig(method="suffix", num_speculative_tokens=2, suffix_pool=[[2, 3, 5, 6]], rule=rule)
    check_two_tokens(target, None, spec, exact=rule_name == "exact", samples=SAMPLES)


# --- By name: the API, bench configs (mappings), files, the CLI -----------------------------------


def test_names_mappings_and_pool_files(target, tmp_path):
    assert specjax.SpeculativeConfig.parse("suffix").method == "suffix"
    lines = [[1, 2, 3], {"tokens": [4, 5]}, {"messages": [{"role": "user", "content": "hi"}]}]
    path = tmp_path / "pool.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    spec = specjax.SpeculativeConfig.from_mapping(
        {"method": "suffix", "suffix_pool": str(path), "prompt_lookup_max": 5, "num_speculative_tokens": 3}
    )
    drafter = make_drafter(spec, specjax.load_model, target)
    assert isinstance(drafter, SuffixDecoding) and drafter.max_match == 5
    assert np.asarray(drafter.pool).tolist() == [[1, 2, 3], [4, 5, -1]]  # the chat has no assistant turn
    assert drafter.without_weights() == SuffixDecoding(max_match=5)  # the pool is weights, not the jit key
    # A bench config's `draft:` (the bench builds drafters for the target's ModelConfig).
    bench = parse_draft({"method": "suffix", "suffix_pool": [[1, 2, 3]]}, "draft")
    assert np.asarray(make_drafter(bench, specjax.load_model, target.config).pool).tolist() == [[1, 2, 3]]
    record = tmp_path / "run.json"  # a `specjax generate --json` record: its "tokens" are the pool
    record.write_text(json.dumps({"text": ["a", "b"], "tokens": [[7, 8], [9]]}))
    assert pool_entries(record) == [[7, 8], [9]]
    with pytest.raises(ValueError, match="'prompt_lookup' does not take suffix_pool"):
        specjax.SpeculativeConfig(method="ngram", suffix_pool=[[1]])
    with pytest.raises(ValueError, match="no such file"):
        make_drafter(spec.replace(suffix_pool=str(tmp_path / "missing.json")), specjax.load_model, target)
    with pytest.raises(ValueError, match="target has no tokenizer"):
        make_drafter(spec.replace(suffix_pool=["some text"]), specjax.load_model, target)
    with pytest.raises(ValueError, match="vocabulary has 48 tokens"):
        specjax.generate(target, [[1, 2]], speculative=specjax.SpeculativeConfig(method="suffix", suffix_pool=[[99]]))


def test_the_cli_speculates_from_an_earlier_runs_answers(tmp_path):
    from specjax.cli import main

    args = ["generate", "--prompt", "def parse_args(", "--prompt", "import os", "--max-new-tokens", "16", "-k", "4"]

    def run(drafter):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            assert main([*args, "--drafter", drafter, "--json"]) == 0
        return json.loads(buffer.getvalue())

    first = run("suffix")
    (tmp_path / "first.json").write_text(json.dumps(first))
    again = run(f"{{method: suffix, suffix_pool: {tmp_path / 'first.json'}}}")
    assert again["tokens"] == first["tokens"]
    assert again["stats"]["drafter"]["kind"] == "suffix" and again["stats"]["drafter"]["pool_rounds"] > 0
    assert again["stats"]["mean_acceptance_length"] > first["stats"]["mean_acceptance_length"]
