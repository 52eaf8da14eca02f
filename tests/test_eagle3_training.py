"""EAGLE-3 trained as published (`train-head` with eagle.eagle3.enabled): the draft
vocabulary from token frequencies, the training-time test (TTT) as the decoding chain it
simulates, the gradient through the fed-back outputs, training, decoding with the trained
head and resume. Tiny models, few steps: one 3-layer byte target (259 tokens)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TARGET_CONFIG
from specjax.models import full_forward, init_cache, init_params
from specjax.models.heads import HeadOptions, eagle_forward, head_config, target_logits

import specjax
from specjax.configs import load_config
from specjax.io.tokenizer import ByteTokenizer
from specjax.training import draft_vocab
from specjax.training.data import held_out_prompts
from specjax.training.draft_vocab import DraftVocab, select, token_counts
from specjax.training.eagle3_objective import (
    Eagle3Config,
    TTTLoss,
    eagle3_options,
    init_eagle3_params,
    ttt_loss,
    ttt_passes,
)
from specjax.training.train_heads import HeadTrainConfig, train_head

BYTES3 = TARGET_CONFIG.replace(vocab_size=259, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=3)
LAYERS = (0, 1, 2)
# Of 259: the training stream has ~120 distinct bytes, and the zero-count rest fills up by id,
# so the random target's favourite outputs (bytes above 127) can be drafted and accepted.
DRAFT_VOCAB = 192
CONFIG = Path(__file__).resolve().parent.parent / "configs" / "eagle3_published_head.yaml"


@pytest.fixture(scope="module")
def target():
    """conftest.scaled_model's kind of target (std 0.02 x 6, norms at ones), drawn with numpy
    (eager jax.random compiles a program per shape: seconds of this file's budget)."""
    shapes = jax.eval_shape(lambda: init_params(BYTES3, 0))
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda s: jnp.asarray(
            6.0 * 0.02 * rng.standard_normal(s.shape) if len(s.shape) > 1 else np.ones(s.shape), s.dtype
        ),
        shapes,
    )
    return specjax.Model(BYTES3, params, ByteTokenizer())


@pytest.fixture(scope="module")
def network(target):
    """(layer config, scaled-up random head params, a draft vocabulary holding the target's
    top tokens on `TOKENS`) for the network-level tests."""
    layer = head_config(BYTES3, 2, 1, 32)
    logits, multi = _target_forward(BYTES3, target.params, TOKENS, LAYERS)
    # The target's top tokens at the first positions only: later ones fall outside at times.
    counts = np.bincount(np.asarray(jnp.argmax(logits[:, :5], -1)).ravel(), minlength=259)
    counts += np.bincount(np.asarray(TOKENS).ravel(), minlength=259)
    vocab = select(counts, 24)
    params = init_eagle3_params(layer, len(LAYERS), vocab, seed=0)
    params = jax.tree.map(lambda x: 4.0 * x if x.ndim > 1 else x, params)  # guesses that vary
    return layer, params, vocab, np.asarray(logits), multi


_target_forward = jax.jit(full_forward, static_argnums=(0, 3))
TOKENS = np.random.default_rng(0).integers(0, 120, (2, 10)).astype(np.int32)


def test_draft_vocabulary_is_the_top_k_tokens_as_a_valid_mapping():
    config = HeadTrainConfig().data
    counts = token_counts(dataclasses.replace(config, seq_len=32, batch_size=2), 0, 3, 259)
    assert counts.sum() == 3 * 2 * 33
    vocab = select(counts, DRAFT_VOCAB)
    ids = np.asarray(vocab.tokens)
    assert vocab.size == DRAFT_VOCAB and np.all(np.diff(ids) > 0)
    kept = np.zeros(259, bool)
    kept[ids] = True
    assert counts[kept].min() >= counts[~kept].max()  # the most frequent ones
    d2t, t2d = vocab.d2t, vocab.t2d
    np.testing.assert_array_equal(np.arange(DRAFT_VOCAB) + d2t, ids)  # target id = draft id + d2t[draft id]
    assert d2t.min() >= 0 and np.all(np.diff(d2t) >= 0) and (np.arange(DRAFT_VOCAB) + d2t).max() < 259
    assert t2d.sum() == DRAFT_VOCAB and t2d[ids].all()
    assert vocab.coverage == pytest.approx(counts[kept].sum() / counts.sum())
    assert select(np.array([5, 3, 3, 0]), 2).tokens == (0, 1)  # ties: the lower id
    full = select(counts, 259)
    assert full.is_identity and not full.d2t.any()
    for size in (0, 260):
        with pytest.raises(ValueError, match="draft_vocab_size"):
            select(counts, size)
    with pytest.raises(ValueError, match="ascending"):
        DraftVocab((3, 2), 259)


def test_lm_head_init_target_starts_from_the_targets_lm_head_over_the_draft_vocabulary(target):
    """lm_head_init "target": the head's LM head is the target's restricted to
    the draft vocabulary, and its final norm the target's, so the head's logits of a state are
    the target's logits of that state at the draft tokens."""
    layer, vocab = head_config(BYTES3, 2, 1, 32), select(np.arange(259)[::-1].copy(), 40)
    fresh = init_eagle3_params(layer, len(LAYERS), vocab, seed=0)
    ids = np.asarray(vocab.tokens)
    state = np.random.default_rng(1).standard_normal((3, BYTES3.hidden_size)).astype(np.float32)
    for config in (BYTES3, BYTES3.replace(tie_word_embeddings=True)):  # its own LM head, or the embedding
        started = init_eagle3_params(layer, len(LAYERS), vocab, seed=0, target=(config, target.params))
        expected = np.asarray(target_logits(config, target.params, state))[:, ids]
        np.testing.assert_allclose(state @ np.asarray(started["lm_head"]), expected, rtol=1e-5)
    assert not np.allclose(fresh["lm_head"], started["lm_head"])
    jax.tree.map(np.testing.assert_array_equal, started["final_norm"], target.params["final_norm"])
    for name in ("fc", "layers", "hidden_norm"):  # the rest as published
        jax.tree.map(np.testing.assert_array_equal, fresh[name], started[name])
    with pytest.raises(ValueError, match="lm_head_init"):
        Eagle3Config(enabled=True, lm_head_init="zeros")


def test_ttt_steps_are_the_decoding_chain_and_one_step_is_the_one_step_loss(target, network):
    """Step k at entry e is draft step k from position p = e + 1, run as the drafter runs it:
    the catch-up over the prefix with the target's states (position 0 hidden), then single
    steps on the head's own outputs with the true tokens; the logits agree. With N = 1 the
    TTT loss is the published loss of that one-step (teacher-forced) pass."""
    layer, params, vocab, target_logits, multi = network
    options = eagle3_options(vocab.size)
    head = {**params, "d2t": jnp.asarray(vocab.d2t)}
    logits, _ = jax.jit(ttt_passes, static_argnums=(0, 1, 6))(layer, options, head, target.params, TOKENS, multi, 3)
    forward = jax.jit(eagle_forward, static_argnums=(0, 8, 9))
    b, t = TOKENS.shape
    # The catch-up over the whole window: position p's output sees positions <= p only, and a
    # chain from p overwrites the slots past p before anything reads them.
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    previous = jnp.concatenate([jnp.zeros_like(multi[:, :1]), multi[:, :-1]], axis=1)  # h_{p-1}
    one_step, caught_up, outputs = forward(
        layer, head, target.params, TOKENS, previous, positions, init_cache(layer, b, 16), None, True, options
    )
    for p in (1, 4, 7):
        cache, fed, chain = caught_up, outputs[:, p : p + 1], [one_step[:, p]]
        for k in (1, 2):
            token, position = TOKENS[:, p + k][:, None], jnp.full((b, 1), p + k)
            step, cache, fed = forward(layer, head, target.params, token, fed, position, cache, None, False, options)
            chain.append(step[:, 0])
        for k, expected in enumerate(chain):
            got = logits[k, :, p - 1]
            np.testing.assert_array_equal(np.isfinite(got), np.isfinite(expected))  # -inf off the draft vocabulary
            np.testing.assert_allclose(got[np.isfinite(got)], expected[np.isfinite(expected)], atol=2e-5)

    # With the (optional) feature loss on: the same cross-entropy, plus its weighted term.
    one = Eagle3Config(enabled=True, ttt_steps=1, feature_weight=0.5)
    loss, parts = jax.jit(ttt_loss, static_argnums=(0, 1, 2, 3, 4, 5))(
        layer, BYTES3, options, LAYERS, vocab, one, target.params, params, TOKENS
    )  # parts [ce, kl, agreement, feature loss] x [1 step]
    ids = np.asarray(vocab.tokens)
    teacher = jax.nn.softmax(target_logits[:, 1:][..., ids], axis=-1)  # at p: the target's guess for p + 1
    student = jax.nn.log_softmax(np.asarray(one_step)[:, 1:][..., ids], axis=-1)
    keep = vocab.t2d[target_logits[:, 1:].argmax(-1)]  # the target's top token is in the draft vocabulary
    expected = np.sum(np.where(keep, -np.sum(teacher * student, -1), 0.0)) / (b * (t - 1))
    assert 0.2 < keep.mean() < 1.0  # the top-1 mask matters here
    np.testing.assert_allclose(float(parts[0, 0]), expected, rtol=1e-5)
    assert parts.shape == (4, 1) and float(parts[3, 0]) > 0
    np.testing.assert_allclose(float(loss), expected + 0.5 * float(parts[3, 0]), rtol=1e-5)


def test_gradient_flows_through_the_fed_back_outputs(target, network):
    """As published, nothing is detached: fc reaches step 1 through step 0's output, so
    stopping that gradient (detach_feedback) changes fc's gradient; the loss is the same,
    and so is lm_head's gradient (it comes after the fed-back output)."""
    layer, params, vocab, _, _ = network
    options = eagle3_options(vocab.size)

    def both(p):  # one compiled program for the two variants
        out = []
        for detach in (False, True):
            settings = Eagle3Config(enabled=True, ttt_steps=2, detach_feedback=detach)
            loss = TTTLoss(layer, BYTES3, options, LAYERS, vocab, settings)
            out.append(jax.value_and_grad(lambda q, loss=loss: loss(target.params, q, TOKENS)[0])(p))
        return out

    (loss, flowing), (detached_loss, detached) = jax.jit(both)(params)
    np.testing.assert_allclose(float(loss), float(detached_loss), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(flowing["lm_head"]), np.asarray(detached["lm_head"]), rtol=1e-5, atol=1e-7)
    difference = float(jnp.max(jnp.abs(flowing["fc"] - detached["fc"])))
    assert difference > 0.05 * float(jnp.max(jnp.abs(flowing["fc"])))


# --- Training ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory, target):
    root = tmp_path_factory.mktemp("eagle3_target")
    specjax.save_model(target, root / "target")
    return root / "target"


def _config(target_dir, *overrides) -> HeadTrainConfig:
    return load_config(
        HeadTrainConfig,
        None,
        [
            f"target={target_dir}",
            "kind=eagle",
            "eagle.intermediate_size=32",
            f"eagle.feature_layers={list(LAYERS)}",
            "eagle.eagle3.enabled=true",
            f"eagle.eagle3.draft_vocab_size={DRAFT_VOCAB}",
            "eagle.eagle3.ttt_steps=2",
            "data.seq_len=16",
            "data.batch_size=4",
            "optim.learning_rate=0.02",
            "optim.warmup_steps=1",
            "eval.prompts=4",
            "eval.prompt_bytes=16",
            "eval.max_new_tokens=16",
            "eval.num_speculative_tokens=3",
            "eval.every=12",
            "steps=12",
            "checkpoint_every=3",
            "log_every=1",
            *overrides,
        ],
    )


@pytest.fixture(scope="module")
def straight(target_dir, tmp_path_factory):
    config = _config(target_dir)
    out = tmp_path_factory.mktemp("eagle3_runs") / "straight"
    return config, out, train_head(config, out, progress=False)


def test_training_lowers_the_loss_and_keeps_the_vocabulary_of_its_stream(target, straight):
    config, out, results = straight
    vocab = select(token_counts(config.data, config.seed, config.steps, 259), DRAFT_VOCAB)
    assert results["draft_vocab"]["draft_vocab_size"] == DRAFT_VOCAB
    assert draft_vocab.draft_vocab_for_run(out, config.data, config.seed, config.steps, 259, DRAFT_VOCAB) == vocab
    head = specjax.load_drafter(results["head"], target)
    np.testing.assert_array_equal(np.asarray(head.params["d2t"]), vocab.d2t)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r for r in rows if "kl_per_step" in r]
    assert len(losses) == 12 and all(len(r["kl_per_step"]) == 2 for r in losses)
    # Row 1 is the initial head's loss (on batch 0); the last rows', after 9-11 updates. The
    # KL, not the cross-entropy: this random target's entropy is most of the latter.
    first = np.asarray(losses[0]["kl_per_step"])
    last = np.mean([r["kl_per_step"] for r in losses[-3:]], axis=0)
    assert np.all(last < 0.7 * first), (first, last)


def test_trained_head_is_a_published_eagle3_drafter_and_greedy_is_exact(target, straight):
    _, _, results = straight
    head = specjax.load_drafter(results["head"], target)
    # What drafters/formats/published.py builds for a loaded EAGLE-3 checkpoint of this vocabulary.
    assert head.options == HeadOptions(eagle3=True, feed_normed=False, hide_first=True, draft_vocab_size=DRAFT_VOCAB)
    assert head.feature_layers == LAYERS and head.params["lm_head"].shape == (BYTES3.hidden_size, DRAFT_VOCAB)
    prompts = held_out_prompts("code", 4, 16, split="validation")  # the eval's: its compiled program
    settings = specjax.GenerationConfig(max_new_tokens=16)
    plain = specjax.generate(target, prompts, settings)
    out = specjax.generate(
        target, prompts, settings, draft=head, speculative=specjax.SpeculativeConfig(num_speculative_tokens=3)
    )
    assert out.tokens == plain.tokens
    assert out.stats.drafter["kind"] == "eagle" and out.stats.accepted_tokens > 0, out.stats


def test_resume_after_stop_after_equals_an_uninterrupted_run(target, straight, tmp_path, monkeypatch):
    """The in-process resume (the kill -9 path of test_heads.py runs the same checkpoints); the
    draft vocabulary is read back, not counted again."""
    config, _, results = straight
    run = tmp_path / "resumed"
    assert train_head(config, run, progress=False, stop_after=6) == {"completed_steps": 6}
    assert (run / draft_vocab.FILE).exists()

    def no_recount(*args):
        raise AssertionError("a resumed run reads its draft vocabulary back")

    monkeypatch.setattr(draft_vocab, "token_counts", no_recount)
    resumed = train_head(config, run, progress=False)
    a = specjax.load_drafter(results["head"], target).params
    b = specjax.load_drafter(resumed["head"], target).params
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def test_the_embedded_config_parses_and_overrides():
    config = load_config(HeadTrainConfig, CONFIG, ["eagle.eagle3.ttt_steps=3"])
    assert config.eagle.eagle3 == Eagle3Config(enabled=True, draft_vocab_size=128, ttt_steps=3)
    assert config.eagle.feature_layers == (1, 3, 5)
    with pytest.raises(ValueError, match="kind=eagle"):
        load_config(HeadTrainConfig, CONFIG, ["kind=medusa"])
