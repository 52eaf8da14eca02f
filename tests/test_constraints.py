"""Constrained generation (specjax/constraints): speculation under a grammar stays exact.

The tiny models have no tokenizer, so each is given a made-up vocabulary (a list of token
strings, one per id; None spells nothing): the constraints compile over it as over a real
tokenizer's bytes.
"""

from __future__ import annotations

import dataclasses
import json
import re

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TARGET_CONFIG, scaled_model

import specjax
from specjax.bench.distribution import chi_square_p_value
from specjax.cli import main
from specjax.constraints import Constraint, as_constraints, compile_constraint, grammar_for_rows, token_bytes
from specjax.core.acceptance import rejection_sampling_rule
from specjax.core.sampling import SamplingConfig, probabilities
from specjax.drafters import ParallelDraft, PromptLookup
from specjax.drafters.proposing import draw as _draw

# 47 token strings and EOS (id 47): single characters and a few multi-character tokens.
VOCAB48 = [
    *"0123456789abcelnrstuxy",
    *'{}[]":, .-\n',
    "true", "false", "null", '{"', '":', '",', '"a"', '"b"', "ab", "ba", "12", ' "', '": ', "xy",
    None,
]  # fmt: skip
EOS48 = 47
REGEX = r"(ab|ba)+[0-9]{1,3}\."
SCHEMA = {
    "type": "object",
    "properties": {"x": {"enum": ["a", "b", "ab"]}, "y": {"type": "boolean"}},
    "required": ["x", "y"],
}
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8]]


@pytest.fixture(scope="module")
def worded(target, noisy_draft):
    """The conftest pair with VOCAB48 as their tokenizer."""
    assert len(VOCAB48) == TARGET_CONFIG.vocab_size
    return dataclasses.replace(target, tokenizer=VOCAB48), dataclasses.replace(noisy_draft, tokenizer=VOCAB48)


def _text(tokens) -> str:
    return "".join(VOCAB48[t] for t in tokens if t != EOS48)


def _satisfies(tokens, constraint: Constraint) -> bool:
    if not tokens or tokens[-1] != EOS48:  # finished: ended on EOS, within its budget
        return False
    text = _text(tokens)
    if constraint.regex is not None:
        return re.fullmatch(constraint.regex, text) is not None
    value = json.loads(text)
    return set(value) == {"x", "y"} and value["x"] in ("a", "b", "ab") and isinstance(value["y"], bool)


def test_the_table_allows_what_the_regex_can_continue_with():
    spelled = token_bytes(VOCAB48, 48)
    table = compile_constraint(Constraint(regex=REGEX), spelled, (EOS48,))
    start = table.starts[0]
    allowed = {VOCAB48[t] for t in np.flatnonzero(table.next_state[start] >= 0)}
    assert allowed == {"a", "b", "ab", "ba"}  # a prefix of (ab|ba)+: never EOS, never a digit yet
    # EOS is allowed exactly in the accepting states, and there it is the only way on.
    eos_ok = table.next_state[:, EOS48] >= 0
    np.testing.assert_array_equal(eos_ok, table.final)
    assert table.final.any()
    for s in np.flatnonzero(table.final):
        assert np.flatnonzero(table.next_state[s] >= 0).tolist() == [EOS48]  # "\." ends the match
    # Per-row tables stack: two constraints and a free row, each row its own start state.
    stacked, starts = grammar_for_rows((Constraint(regex=REGEX), Constraint(json_schema=SCHEMA), None), VOCAB48, 48,
                                       (EOS48,), rows=4)  # fmt: skip
    assert starts[3] == starts[0] and len(set(starts[:3].tolist())) == 3
    assert (stacked.next_state[starts[2]] >= 0).all()  # the free row allows every token
    first = {VOCAB48[t] for t in np.flatnonzero(stacked.next_state[starts[1]] >= 0)}
    assert first == {"{", '{"'}


def test_token_bytes_of_a_byte_level_tokenizer():
    from tokenizers import Tokenizer, decoders, models

    from specjax.io.tokenizer import ByteTokenizer, _byte_level_chars

    chars = _byte_level_chars()
    words = [" a", "b\n", "é"]
    vocab = {"".join(chars[b] for b in w.encode()): i for i, w in enumerate(words)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.decoder = decoders.ByteLevel()
    import transformers

    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    spelled = token_bytes(hf, 5)
    assert spelled[:3] == tuple(w.encode() for w in words)
    assert spelled[3] is None and spelled[4] is None  # <eos> is special; id 4 is past the tokenizer
    byte = token_bytes(ByteTokenizer(), 259)
    assert byte[65] == b"A" and byte[256:] == (None, None, None)


def test_bad_constraints_are_refused_by_name():
    with pytest.raises(ValueError, match="exactly one of json_schema and regex"):
        Constraint()
    with pytest.raises(ValueError, match="exactly one"):
        Constraint(regex="a", json_schema="{}")
    with pytest.raises(ValueError, match="not valid JSON"):
        Constraint(json_schema="{type: object")
    with pytest.raises(ValueError, match="cannot compile the constraint's regex"):
        Constraint(regex="(ab").check_syntax()
    with pytest.raises(ValueError, match="JSON schema not supported"):
        Constraint(json_schema={"type": 3}).pattern()
    spelled = token_bytes(VOCAB48, 48)
    with pytest.raises(ValueError, match=r"incompatible|matches no text"):
        compile_constraint(Constraint(regex="zzz"), spelled, (EOS48,))  # no token spells "z"
    with pytest.raises(ValueError, match="over max_table_bytes"):
        compile_constraint(Constraint(regex=REGEX, max_table_bytes=100), spelled, (EOS48,))
    with pytest.raises(ValueError, match="needs an EOS token"):
        compile_constraint(Constraint(regex=REGEX), spelled, ())
    with pytest.raises(ValueError, match="2 constraints for 3 prompts"):
        as_constraints([Constraint(regex="a"), None], 3)
    with pytest.raises(ValueError, match="unknown key"):
        specjax.GenerationConfig(constraint={"pattern": "a"})


def test_cli_refuses_a_bad_regex(capsys):
    assert main(["generate", "--prompt", "x", "--regex", "(ab", "--max-new-tokens", "4"]) == 2
    assert "specjax: error: cannot compile the constraint's regex '(ab'" in capsys.readouterr().err


def test_greedy_speculation_under_constraints_equals_plain(worded):
    """Batch 2, a regex on one row and a JSON schema on the other: prompt lookup (a chain),
    a draft model's token tree, a PARD block and DSpark's chain commit what plain
    constrained decoding commits, and every output matches its constraint."""
    target, draft = worded
    constraints = [Constraint(regex=REGEX), Constraint(json_schema=SCHEMA)]
    config = specjax.GenerationConfig(max_new_tokens=40, eos_token_id=EOS48, constraint=constraints)
    plain = specjax.generate(target, PROMPTS, config)
    for tokens, constraint in zip(plain.tokens, constraints, strict=True):
        assert _satisfies(tokens, constraint), _text(tokens)
    k3 = specjax.SpeculativeConfig(num_speculative_tokens=3)
    lookup = specjax.generate(target, PROMPTS, config, draft=PromptLookup(max_ngram=2, min_ngram=1), speculative=k3)
    assert lookup.tokens == plain.tokens
    # The draft model expands a token tree (its chain rounds: the T = 1 test below).
    tree_rounds = specjax.SpeculativeConfig(tree="full:2:2")
    tree = specjax.generate(target, PROMPTS, config, draft=draft, speculative=tree_rounds)
    assert tree.tokens == plain.tokens
    assert tree.stats.accepted_tokens > 0
    # A parallel drafter's block, each output masked at the state after the ones before it,
    # and DSpark's Markov chain, masked the same way.
    from test_dspark import _dspark

    pard = specjax.generate(target, PROMPTS, config, draft=ParallelDraft(draft, 46), speculative=k3)
    assert pard.tokens == plain.tokens
    dspark = specjax.generate(target, PROMPTS, config, draft=_dspark(target), speculative=k3)
    assert dspark.tokens == plain.tokens


# --- T = 1: the tokens follow the masked target distribution --------------------------------

VOCAB8 = ["a", "b", "c", "d", "e", "f", "g", None]  # id 7: EOS
REGEX8 = r"a[bc][a-f]*|b[a-e][a-f]*|c[def][a-f]*"  # token 2's allowed set depends on token 1
SAMPLES = 2000


def _masked_joint(target) -> np.ndarray:
    """p(t1, t2 | prompt) of the target with its logits masked by REGEX8 -> [64]."""
    from specjax.io.model import logits

    sampling = SamplingConfig(temperature=1.0)
    first_ok = np.array([1, 1, 1, 0, 0, 0, 0, 0], bool)
    second_ok = {0: "bc", 1: "abcde", 2: "def"}
    prompt = [1, 2, 3]
    first = np.asarray(logits(target, [prompt])[0, -1])
    joint = np.zeros((8, 8))
    p1 = np.asarray(probabilities(jnp.asarray(np.where(first_ok, first, -np.inf)), sampling))
    seconds = np.asarray(logits(target, [[*prompt, t] for t in range(3)])[:, -1])
    for t1 in range(3):
        ok = np.array([VOCAB8[t] is not None and VOCAB8[t] in second_ok[t1] for t in range(8)])
        joint[t1] = p1[t1] * np.asarray(probabilities(jnp.asarray(np.where(ok, seconds[t1], -np.inf)), sampling))
    return joint.reshape(-1)


def test_the_rule_rejects_forbidden_drafts_of_an_unmasked_draft():
    """A drafter that ignores the grammar (prompt lookup, a block head's tree) proposes from
    q over every token; against the masked p the rule still emits p exactly: a forbidden
    draft has p = 0, so it is never accepted, and the residual (p - q)+ has no mass there."""
    import jax

    from specjax.core.sampling import sample

    batch, vocab = 10000, 6
    rng = np.random.default_rng(0)
    allowed = np.array([1, 0, 1, 1, 0, 1], bool)
    p = rng.dirichlet(np.ones(vocab), size=2) * allowed  # [2, V]: the masked target, renormalised
    p = jnp.asarray(p / p.sum(axis=-1, keepdims=True), jnp.float32)
    q = jnp.asarray(rng.dirichlet(np.ones(vocab) * 0.5, size=1), jnp.float32)  # [1, V]: half its mass forbidden
    p, q = jnp.broadcast_to(p, (batch, 2, vocab)), jnp.broadcast_to(q, (batch, 1, vocab))
    draft_key, rule_key = jax.random.split(jax.random.key(0))
    drafts = sample(draft_key, q)  # [B, 1]
    n, next_token = jax.jit(rejection_sampling_rule)(rule_key, drafts, p, q)
    first = np.where(np.asarray(n) > 0, np.asarray(drafts[:, 0]), np.asarray(next_token))
    assert chi_square_p_value(first, np.asarray(p[0, 0])) > 1e-3
    assert allowed[np.asarray(drafts[:, 0])[np.asarray(n) > 0]].all()  # only allowed drafts are accepted
    assert not allowed[np.asarray(drafts[:, 0])].all()  # and forbidden ones were proposed
    assert 0.0 < float(np.mean(np.asarray(n))) < 1.0


def _stale_states(next_state, states, tokens):
    """Wrong on purpose: every verified position masked at the round's first state, as if
    the grammar were not advanced along the drafts."""
    return jnp.repeat(states[:, None], tokens.shape[1] + 1, axis=1)


def _unnormalised(scores, next_state, states, sampled):
    """Wrong on purpose: a tree node's masked draft distribution left unnormalised, so the q
    the tree rule reads is not the distribution its children were drawn from."""
    from specjax.core.grammar import allowed

    ok = allowed(next_state, states)
    return jnp.where(ok, jnp.broadcast_to(scores, ok.shape), 0.0 if sampled else -jnp.inf)


def _tempered_draw(key, logits, sampling):
    """Wrong on purpose: draws as `draw` does but reports q**2 renormalised, not the
    distribution the draft came from."""
    token, q = _draw(key, logits, sampling)
    return token, q**2 / jnp.sum(q**2, axis=-1, keepdims=True)


@pytest.mark.parametrize("variant", ["exact", "stale_states", "tree", "tree_unnormalised", "block", "block_wrong_q"])
def test_constrained_sampling_follows_the_masked_target(variant, monkeypatch):
    """T = 1 under REGEX8: chain rounds, a draft model's token tree (whose nodes propose
    under the mask: drafters/proposing.py expand_tree) and a parallel (PARD) drafter's block
    (each output masked at the state after the ones before it: block_proposal), each with a
    wrong variant."""
    vocab8 = TARGET_CONFIG.replace(vocab_size=8)
    target = dataclasses.replace(scaled_model(vocab8, seed=0, scale=6.0), tokenizer=VOCAB8)
    draft = scaled_model(vocab8.replace(num_hidden_layers=1), seed=5, scale=6.0)
    expected = _masked_joint(target)
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=2)
    if variant == "stale_states":
        import specjax.engine.rounds as rounds

        monkeypatch.setattr(rounds, "states_along", _stale_states)

        def rule(*args):  # another rule object: another plan, so the round is traced anew
            return rejection_sampling_rule(*args)

        speculative = speculative.replace(rule=rule)
    if variant.startswith("tree"):
        speculative = specjax.SpeculativeConfig(tree="full:2:2")
    if variant == "tree_unnormalised":
        import specjax.drafters.proposing as proposing
        from specjax.trees import tree_rejection_rule

        monkeypatch.setattr(proposing, "_constrained_scores", _unnormalised)

        def tree_rule(*args):  # another rule object: the round is traced anew, with the patch
            return tree_rejection_rule(*args)

        speculative = speculative.replace(rule=tree_rule)
    if variant.startswith("block"):
        draft = ParallelDraft(draft, 6)  # proposes K = 2 from one pass, mask token "g"
    if variant == "block_wrong_q":
        import specjax.drafters.proposing as proposing

        monkeypatch.setattr(proposing, "draw", _tempered_draw)
        draft = ParallelDraft(draft.model, 5)  # another drafter: the round is traced anew, with the patch
    config = specjax.GenerationConfig.at_temperature(
        1.0, max_new_tokens=2, seed=4, eos_token_id=7, constraint=Constraint(regex=REGEX8)
    )
    out = specjax.generate(target, [[1, 2, 3]] * SAMPLES, config, draft=draft, speculative=speculative)
    tokens = np.asarray(out.tokens)
    p_value = chi_square_p_value(tokens[:, 0] * 8 + tokens[:, 1], expected)
    if variant in ("exact", "tree", "block"):
        assert p_value > 1e-3
        assert 0.0 < out.stats.acceptance_rate < 1.0  # drafts were judged, some rejected
    else:
        assert p_value < 1e-8


# --- The bench under a constraint ------------------------------------------------------------


def test_the_bench_runs_every_generation_under_its_constraint(tmp_path):
    """`constraint:` in a bench config constrains plain and speculative runs alike: with a
    regex that allows one byte only, the noisy draft (masked like the target) proposes what
    the target keeps, so every draft is accepted, where the same bench without it rejects some."""
    from test_bench import bench_pair

    from specjax.bench import BenchConfig, run_bench
    from specjax.configs import from_dict

    target, draft = bench_pair()
    config = {
        "experiments": ["k_sweep"],
        "prompts": {"count": 2, "prompt_bytes": 12},
        "max_new_tokens": 12,
        "timing": {"repeats": 1, "cost_inner": 1},
        "bandwidth_megabytes": 8,
        "clear_caches": False,
        "k_sweep": {"ks": [2]},
    }

    def spec_row(extra, name):
        results = run_bench(from_dict(BenchConfig, {**config, **extra}), tmp_path / name, target, draft, progress=False)
        rows = results["experiments"]["k_sweep"]["rows"]
        assert all(r["output_matches_plain"] for r in rows if r["method"] == "speculative")
        return next(r for r in rows if r["method"] == "speculative" and r["category"] == "all")

    free = spec_row({}, "free")
    constrained = spec_row({"constraint": {"regex": "a{64}"}}, "constrained")
    assert constrained["acceptance_rate"] == 1.0 and constrained["mean_acceptance_length"] == 3.0
    assert free["acceptance_rate"] < 1.0
    saved = json.loads((tmp_path / "constrained" / "results.json").read_text())
    assert saved["config"]["constraint"]["regex"] == "a{64}"
