"""A draft with another tokenizer (drafters/cross_vocab.py, token-level intersection, and
drafters/universal.py, universal assisted generation): the tables between two
vocabularies, greedy output equal to the target's plain greedy output, and T = 1 output
following the target's distribution, with a wrong variant (TLI: q the draft's unrestricted
distribution; UAG: a q where its proposal is deterministic) failing the same test.

The greedy pair shares one network across two vocabularies: the target's tokenizer is a BPE
whose ids 0..255 are the single bytes in byte order (merged tokens after), and the draft is
the target's network cut to the 259 ids of specjax's ByteTokenizer. On a context of bytes
the draft's restricted distribution is the target's over single bytes, so drafts are
accepted where the target's choice is a byte, and rejected where it is a merged token.
"""

from __future__ import annotations

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TARGET_CONFIG, scaled_model
from test_sampling import P_VALUE_FAIL, P_VALUE_PASS

import specjax
from specjax.bench.distribution import chi_square_p_value
from specjax.core.sampling import SamplingConfig, probabilities
from specjax.drafters.cross_vocab import CrossVocab
from specjax.drafters.universal import Universal
from specjax.drafters.vocab_tables import build_tables
from specjax.io.tokenizer import ByteTokenizer, _byte_level_chars

ONE_LAYER = TARGET_CONFIG.replace(num_hidden_layers=1)  # each compile of the loop costs less
TEXTS = [
    "the cat sat on the mat and the dog sat on the log",
    "def main(): return the answer to the question",
    "speculative decoding drafts tokens and the target verifies them",
] * 4


def byte_ordered_bpe(texts=TEXTS, vocab_size: int = 300):
    """A byte-level BPE trained on `texts` whose ids 0..255 are the bytes in byte order."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # fmt: skip
    trained.train_from_iterator(texts, trainer)
    merges = [
        tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in json.loads(trained.to_str())["model"]["merges"]
    ]
    vocab = {c: i for i, c in enumerate(_byte_level_chars())}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def small_bpe(tokens: list[str], merges: list[tuple[str, str]], special: str = "<e>"):
    """A hand-made BPE without pre-tokenizer: ids in the order of `tokens`, `special` last."""
    from tokenizers import AddedToken, Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.add_special_tokens([AddedToken(special, special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=special)


@pytest.fixture(scope="module")
def shared_pair():
    """(target with a BPE tokenizer, draft: its network on the 259 byte ids, ByteTokenizer)."""
    tokenizer = byte_ordered_bpe()
    vocab = len(tokenizer)
    target = scaled_model(ONE_LAYER.replace(vocab_size=vocab), seed=0, scale=6.0)
    params = {**target.params, "embed": target.params["embed"][:259], "lm_head": target.params["lm_head"][:, :259]}
    draft = specjax.Model(ONE_LAYER.replace(vocab_size=259), params, tokenizer=ByteTokenizer())
    return dataclasses.replace(target, tokenizer=tokenizer), draft


def test_tables_map_shared_tokens_and_spell_the_others(shared_pair):
    target, draft = shared_pair
    tables = build_tables(target.tokenizer, target.config.vocab_size, draft.tokenizer, 259)
    a = ord("a")
    assert tables.draft_to_target[a] == a and tables.pieces_of(a) == [a]  # a byte: in both vocabularies
    merged = target.tokenizer.convert_tokens_to_ids("Ġthe")
    assert merged >= 256 and tables.pieces_of(merged) == list(b" the")  # not in the draft's: its bytes
    assert merged not in tables.draft_to_target
    assert (tables.draft_to_target[256:] == -1).all()  # <bos>, <eos>, <pad>: the target has none
    eos = target.tokenizer.eos_token_id
    assert tables.pieces_of(eos) == list(b"<|endoftext|>")  # a special only the target has: its text
    assert tables.intersection == 256
    # Two BPEs: a merged token both have maps; a special maps only to the same special.
    t = small_bpe(["a", "b", "c", "d", "ab", "cd", "bc"], [("a", "b"), ("c", "d"), ("b", "c")])
    d = small_bpe(["a", "b", "c", "d", "ab", "da", "db", "dc", "ca"], [("a", "b"), ("d", "a"), ("d", "b"),
                                                                        ("d", "c"), ("c", "a")])  # fmt: skip
    tables = build_tables(t, len(t), d, len(d))
    assert tables.draft_to_target.tolist() == [0, 1, 2, 3, 4, -1, -1, -1, -1, 7]
    assert tables.pieces_of(5) == [2, 3] and tables.pieces_of(6) == [1, 2]  # "cd", "bc": the draft spells them


def _prompts(tokenizer):
    return [tokenizer.encode(text) for text in ("the cat sat", "def main(): return", "speculative decoding drafts t")]


def plain_greedy(target, prompts, n: int) -> list[list[int]]:
    """The target's greedy continuations by full forwards of one fixed width (one compile, far
    cheaper than a generation loop's): right padding never reaches a causal query."""
    width = max(len(p) for p in prompts) + n
    rows = [list(p) for p in prompts]
    for _ in range(n):
        batch = np.array([row + [0] * (width - len(row)) for row in rows], np.int32)
        logits = specjax.io.model.logits(target, batch)  # [B, width, V]
        for row, out in zip(rows, logits, strict=True):
            row.append(int(out[len(row) - 1].argmax()))
    return [row[len(p) :] for row, p in zip(rows, prompts, strict=True)]


def test_greedy_equals_plain_greedy(shared_pair):
    target, draft = shared_pair
    prompts = _prompts(target.tokenizer)
    config = specjax.GenerationConfig(max_new_tokens=24, ignore_eos=True)
    expected = plain_greedy(target, prompts, 24)
    # catch_up=3: most rounds feed a merged token's pieces over more than one forward.
    drafter = CrossVocab.between(draft, target, catch_up=3)
    out = specjax.generate(
        target, prompts, config, draft=drafter, speculative=specjax.SpeculativeConfig(num_speculative_tokens=3)
    )
    assert out.tokens == expected
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens  # some drafts accepted, some not
    assert any(t >= 256 for row in expected for t in row)  # the target chose merged tokens too


# --- T = 1: the outputs follow the target, and a wrong q does not -------------------------------

SAMPLES = 3000  # the wrong variant fails at p ~ 0 with 6000 (test_sampling.py's count)
T_TOKENS = ["a", "b", "c", "d", "ab", "cd", "bc"]  # + "<e>": 8 target ids
D_TOKENS = ["a", "b", "c", "d", "ab", "da", "db", "dc", "ca"]  # + "<e>": 4 of 10 outside the intersection


@dataclasses.dataclass(frozen=True)
class UnrestrictedQ(CrossVocab):
    """Wrong: draws from the restricted distribution but reports the unrestricted one as q."""

    def draw(self, key, logits, tables, sampling):
        token, _ = super().draw(key, logits, tables, sampling)
        return token, probabilities(logits, sampling)


@pytest.fixture(scope="module")
def small_pair():
    t = small_bpe(T_TOKENS, [("a", "b"), ("c", "d"), ("b", "c")])
    d = small_bpe(D_TOKENS, [("a", "b"), ("d", "a"), ("d", "b"), ("d", "c"), ("c", "a")])
    target = scaled_model(ONE_LAYER.replace(vocab_size=8), seed=0, scale=5.0)
    draft = scaled_model(ONE_LAYER.replace(vocab_size=10), seed=7, scale=5.0)
    return dataclasses.replace(target, tokenizer=t), dataclasses.replace(draft, tokenizer=d)


@dataclasses.dataclass(frozen=True)
class UniformQ(Universal):
    """Wrong: reports its deterministic proposal as drawn uniformly from the target's vocabulary."""

    def proposal(self, tokens, counts):
        return dataclasses.replace(super().proposal(tokens, counts), q=jnp.full((*tokens.shape, 8), 1 / 8))


@pytest.mark.parametrize("kind", [CrossVocab, UnrestrictedQ, Universal, UniformQ])
def test_sampling_follows_the_target_and_a_wrong_q_does_not(small_pair, kind):
    target, draft = small_pair
    prompt = [0, 4, 2]
    sampling = SamplingConfig(temperature=1.0)
    first = probabilities(jnp.asarray(specjax.io.model.logits(target, [prompt])[0, -1]), sampling)
    second = probabilities(
        jnp.asarray(specjax.io.model.logits(target, [[*prompt, t] for t in range(8)])[:, -1]), sampling
    )
    expected = np.asarray(first[:, None] * second).reshape(-1)
    config = specjax.GenerationConfig.at_temperature(1.0, max_new_tokens=2, seed=3, ignore_eos=True)
    drafter = kind.between(draft, target)
    out = specjax.generate(
        target,
        [prompt] * SAMPLES,
        config,
        draft=drafter,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=2),
    )
    tokens = np.asarray(out.tokens)
    p_value = chi_square_p_value(tokens[:, 0] * 8 + tokens[:, 1], expected)
    if kind in (CrossVocab, Universal):
        assert p_value > P_VALUE_PASS
        assert 0.0 < out.stats.acceptance_rate < 1.0
    else:
        assert p_value < P_VALUE_FAIL


# --- Specs ------------------------------------------------------------------------------------


def test_bad_specs_are_refused(shared_pair):
    target, draft = shared_pair
    spec = {"method": "tli", "model": "the-draft"}
    built = specjax.load_drafter(spec, target, load=lambda name: draft)
    assert isinstance(built, CrossVocab) and built.catch_up == 16
    assert specjax.load_drafter({**spec, "catch_up": 4}, target, load=lambda name: draft).catch_up == 4
    with pytest.raises(ValueError, match="does not take layers"):
        specjax.load_drafter({**spec, "layers": 2}, target, load=lambda name: draft)
    with pytest.raises(ValueError, match="needs model"):
        specjax.load_drafter({"method": "tli"}, target, load=lambda name: draft)
    with pytest.raises(ValueError, match="draft's tokenizer"):
        specjax.load_drafter(spec, target, load=lambda name: dataclasses.replace(draft, tokenizer=None))
    with pytest.raises(ValueError, match="target Model"):
        specjax.load_drafter(spec, target.config, load=lambda name: draft)
    words = small_bpe(["ab", "cd"], [])  # no single byte: nothing in common with a byte draft
    with pytest.raises(ValueError, match="intersection is empty"):
        specjax.load_drafter(spec, dataclasses.replace(target, tokenizer=words), load=lambda name: draft)
    with pytest.raises(ValueError, match="built for a target of"):
        built.check(target.config.replace(vocab_size=64), 4)


# --- Universal assisted generation --------------------------------------------------------------


def test_uag_greedy_equals_plain_greedy(shared_pair):
    """A ragged batch of 2, the byte draft's text re-encoded by the target's BPE: the output is
    the target's plain greedy output, token for token (pure_callback in the jitted loop)."""
    target, draft = shared_pair
    prompts = _prompts(target.tokenizer)[:2]
    assert len(prompts[0]) != len(prompts[1])
    expected = plain_greedy(target, prompts, 24)
    drafter = Universal.between(draft, target, catch_up=3, draft_length=4)
    config = specjax.GenerationConfig(max_new_tokens=24, ignore_eos=True)
    out = specjax.generate(
        target, prompts, config, draft=drafter, speculative=specjax.SpeculativeConfig(num_speculative_tokens=3)
    )
    assert out.tokens == expected
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens


def test_uag_retokenizes_text_and_specs(shared_pair):
    target, draft = shared_pair
    drafter = specjax.load_drafter({"method": "uag", "model": "the-draft"}, target, load=lambda name: draft)
    assert isinstance(drafter, Universal) and drafter.catch_up == 16 and drafter.draft_length == 0
    spec = {"method": "uag", "model": "the-draft", "draft_length": 6}
    assert specjax.load_drafter(spec, target, load=lambda name: draft).draft_length == 6
    with pytest.raises(ValueError, match="draft_length"):  # TLI drafts shared tokens, one per target token
        specjax.load_drafter({**spec, "method": "tli"}, target, load=lambda name: draft)
    eos = target.tokenizer.eos_token_id
    drafts = np.array([list(b"the cat"), [*b"ab\xe2\x82", 97, 98, 99], [258, *b"abcdef"], [*b"ab", 257, *b"abcd"]])
    ids, counts = drafter.retokenizer(drafts, 3)
    the_cat, ab = (target.tokenizer.encode(text, add_special_tokens=False) for text in ("the cat", "ab"))
    assert ids[0].tolist() == the_cat[:3] and counts[0] == 3 and len(the_cat) > 3
    assert counts[1] == len(ab) < 3 and ids[1].tolist() == ab + ab[-1:] * (3 - len(ab))  # cut mid-character, padded
    assert counts[2] == 0  # a special first: nothing to propose
    assert counts[3] == len(ab)  # <eos>: the draft's special has no target twin ("<|endoftext|>"), the text ends
    assert eos not in ids[3]
    # A target sharing no token with the draft: TLI refuses it, UAG proposes through text.
    words = dataclasses.replace(target, tokenizer=small_bpe(["ab", "cd"], []))
    assert isinstance(specjax.load_drafter({"method": "uag", "model": "d"}, words, load=lambda n: draft), Universal)
    with pytest.raises(ValueError, match="draft's tokenizer"):
        Universal.between(dataclasses.replace(draft, tokenizer=None), target)
    with pytest.raises(ValueError, match="universal assisted generation needs the target's tokenizer"):
        specjax.load_drafter({"method": "uag", "model": "d"}, dataclasses.replace(target, tokenizer=None),
                             load=lambda n: draft)  # fmt: skip
    with pytest.raises(ValueError, match="target Model"):
        specjax.load_drafter({"method": "uag", "model": "d"}, target.config, load=lambda n: draft)


def test_both_methods_run_in_the_bench(shared_pair, tmp_path, monkeypatch):
    """`specjax bench` takes a cross-tokenizer drafter as its draft from a spec (`draft:
    {method: tli | uag, model: ...}`, whose model the bench loads by name) or as an object: E3's
    greedy rows equal plain."""
    from specjax.bench import BenchConfig, context, run_bench
    from specjax.configs import from_dict

    target, draft = shared_pair
    monkeypatch.setattr(context, "load_model", lambda name, *_: draft if name == "the-draft" else target)
    config = {
        "experiments": ["k_sweep"], "prompts": {"count": 2, "prompt_bytes": 16}, "max_new_tokens": 12,
        "timing": {"repeats": 1, "cost_inner": 1}, "bandwidth_megabytes": 8, "clear_caches": False,
        "k_sweep": {"ks": [3]},
    }  # fmt: skip
    runs = [
        ("tli", {"method": "tli", "model": "the-draft"}, None),
        ("uag", {"method": "uag", "model": "the-draft", "draft_length": 4}, None),
        ("object", {}, CrossVocab.between(draft, target)),
    ]
    for name, spec, drafter in runs:
        bench = from_dict(BenchConfig, {**config, "draft": spec} if spec else config)
        results = run_bench(bench, tmp_path / name, target, drafter, progress=False)
        rows = [r for r in results["experiments"]["k_sweep"]["rows"] if r["method"] == "speculative"]
        assert rows and all(r["output_matches_plain"] for r in rows)
        kind = "Universal" if name == "uag" else "CrossVocab"
        assert results["models"]["draft"]["drafter"].startswith(kind)
