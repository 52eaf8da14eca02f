"""Training drafters for any target on any data (issue 27): `specjax train-head` (EAGLE-3 as
published) and `specjax distill` on a user chat file, for a tiny random HF Llama target with a
tiny trained HF tokenizer. The head losses' masks, the runs end to end with resume and exact
greedy decoding, the draft vocabulary over the dataset's targets, and the CLI's --data."""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from specjax.models import init_params
from specjax.models.heads import head_config, init_eagle_params, init_medusa_params
from test_datasets import CHATML_TEMPLATE, TURN_END, make_tokenizer

import specjax
from specjax.cli import main
from specjax.configs import load_config
from specjax.training import draft_vocab
from specjax.training.distill import DistillConfig, distill
from specjax.training.draft_vocab import DraftVocab, select, token_counts
from specjax.training.eagle3_objective import Eagle3Config, TTTLoss, eagle3_options, init_eagle3_params
from specjax.training.run_data import REPORT_FILE, eval_prompts, predicted_mask, train_examples
from specjax.training.train_heads import HeadTrainConfig, eagle_loss, medusa_loss, train_head

LAYERS = (0, 1, 2)
QUESTIONS = ["What is a list?", "And a tuple?", "How do you answer?", "What does the fox do?"]
ANSWERS = [
    "A list holds items in order.",
    "A tuple cannot change once it is made.",
    "You answer briefly and you answer well.",
    "The quick brown fox jumps over the lazy dog.",
]
DATA = [  # dataset.* and the eval of both trainers: one compiled program each, shared by the runs
    "dataset.seq_len=32",
    "dataset.batch_size=4",
    "optim.warmup_steps=1",
    "eval.prompts=2",
    "eval.max_new_tokens=8",
    "eval.num_speculative_tokens=2",
    "eval.every=4",
    "steps=4",
    "checkpoint_every=2",
    "log_every=1",
]
HEAD = [
    "kind=eagle",
    "eagle.intermediate_size=32",
    f"eagle.feature_layers={list(LAYERS)}",
    "eagle.eagle3.enabled=true",
    "eagle.eagle3.draft_vocab_size=64",
    "eagle.eagle3.ttt_steps=2",
    "optim.learning_rate=0.02",
]
# The eval's settings: its compiled programs serve the checks of exact decoding.
SETTINGS, K2 = specjax.GenerationConfig(max_new_tokens=8), specjax.SpeculativeConfig(num_speculative_tokens=2)
DISTILL = ["data.corpus=0.5", "data.draft_generated=0.5", "data.prompt_len=8", "optim.learning_rate=0.01"]


def drawn(shapes, scale: float, seed: int):
    """Params of these abstract shapes drawn with numpy (eager jax.random compiles a program
    per shape: seconds): matrices at std `scale`, vectors (norm scales) ones."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda s: jnp.asarray(scale * rng.standard_normal(s.shape) if len(s.shape) > 1 else np.ones(s.shape), s.dtype),
        shapes,
    )


def save_tiny_chat_target(directory) -> None:
    """A random 3-layer HF Llama with a ChatML BPE tokenizer trained by `tokenizers`, saved to
    `directory`; weights scaled up (std 0.12, not 0.02) so that greedy paths vary."""
    tokenizer = make_tokenizer(CHATML_TEMPLATE)
    config = specjax.ModelConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
    )
    params = drawn(jax.eval_shape(lambda: init_params(config, 0)), 0.12, seed=0)
    specjax.save_model(specjax.Model(config, params, tokenizer), directory)


def chat(i: int) -> dict:
    return {
        "messages": [
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": f"{QUESTIONS[i % 4]} Number {i}."},
            {"role": "assistant", "content": f"{ANSWERS[i % 4]} Number {i}."},
        ]
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(target directory: a random 3-layer HF Llama with a ChatML BPE tokenizer, chats JSONL
    with two bad lines, a file with no usable record)."""
    root = tmp_path_factory.mktemp("any_target")
    save_tiny_chat_target(root / "target")
    rows = [json.dumps(chat(i)) for i in range(120)]
    rows[5], rows[9] = "{not json", json.dumps({"messages": [{"role": "narrator", "content": "42"}]})
    (root / "chats.jsonl").write_text("\n".join(rows) + "\n")
    unknown = json.dumps({"messages": [{"role": "narrator", "content": "4"}]})
    (root / "bad.jsonl").write_text("{not json\n" + unknown + "\n")
    return root / "target", root / "chats.jsonl", root / "bad.jsonl"


@pytest.fixture(scope="module")
def target(files):
    return specjax.load_model(files[0])


def _config(cls, files, *overrides):
    return load_config(cls, None, [f"target={files[0]}", f"dataset.path={files[1]}", *DATA, *overrides])


# --- Masks -------------------------------------------------------------------------------------


def test_masked_head_losses(target):
    """All ones: each loss is its unmasked self. A mask cut at c (tokens after c are not
    targets): tokens past c change nothing, which the unmasked loss does see."""
    cfg, v, cut = target.config, target.config.vocab_size, 7
    tokens = np.random.default_rng(1).integers(0, v, (2, 12)).astype(np.int32)
    changed = tokens.copy()
    changed[:, cut + 1 :] = (changed[:, cut + 1 :] + 5) % v
    aligned = np.ones(tokens.shape, bool)
    aligned[:, cut + 1 :] = False  # mask[:, t]: token t is a target
    cut_mask = predicted_mask(aligned)  # [:, q]: the prediction at q, of token q + 1
    assert cut_mask[:, :cut].all() and not cut_mask[:, cut:].any()
    layer = head_config(cfg, 2, 1, 32)
    vocab = DraftVocab(tuple(range(0, v, 2)), v)
    ttt = TTTLoss(layer, cfg, eagle3_options(vocab.size), LAYERS, vocab, Eagle3Config(enabled=True, ttt_steps=2))
    losses = {  # (loss, head params of random guesses)
        "medusa": (functools.partial(medusa_loss, cfg), lambda: init_medusa_params(cfg.hidden_size, 3, 0)),
        "eagle": (functools.partial(eagle_loss, layer, cfg, weights=(1.0, 0.1)), lambda: init_eagle_params(layer)),
        "eagle3": (ttt, lambda: init_eagle3_params(layer, len(LAYERS), vocab)),
    }
    for seed, (name, (loss, init)) in enumerate(losses.items()):
        head = drawn(jax.eval_shape(init), 0.1, seed)

        @jax.jit
        def run(t, m, loss=loss, head=head):  # one program: (unmasked, masked) loss and parts
            return loss(target.params, head, t), loss(target.params, head, t, mask=m)

        plain, ones = run(tokens, np.ones(tokens.shape, np.float32))
        for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(ones), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7, err_msg=name)
        (_, masked), (plain_changed, masked_changed) = run(tokens, cut_mask), run(changed, cut_mask)
        np.testing.assert_allclose(float(masked[0]), float(masked_changed[0]), rtol=1e-6, err_msg=name)
        assert abs(float(masked[0]) - float(plain[0])) > 1e-4, name
        assert abs(float(plain_changed[0]) - float(plain[0])) > 1e-4, name


# --- End to end --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def head_run(files, tmp_path_factory):
    config = _config(HeadTrainConfig, files, *HEAD)
    out = tmp_path_factory.mktemp("head_runs") / "straight"
    return config, out, train_head(config, out, progress=False)


def test_eagle3_head_on_a_dataset(files, target, head_run):
    config, out, results = head_run
    report = json.loads((out / REPORT_FILE).read_text())
    assert report["bad"] == {"invalid_json": 1, "unknown_role": 1} and report["bad_lines"]["unknown_role"] == [10]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "mean_acceptance_length_greedy" in r] == [0, 4]
    assert results["dataset"] == str(files[1])
    # The draft vocabulary counts the tokens the head is scored on: assistant turns, never the
    # prompt's <|im_start|> (the generation prompt), always their <|im_end|>.
    examples = train_examples(config.dataset, target.tokenizer)
    counts = token_counts(config.data, config.seed, config.steps, target.config.vocab_size, examples)
    start, end = target.tokenizer.convert_tokens_to_ids(["<|im_start|>", TURN_END])
    assert counts[start] == 0 and counts[end] > 0
    mask = examples[1]  # each window once, whatever the run's steps
    assert counts.sum() == mask[:, 1:].sum()
    assert np.array_equal(counts, token_counts(config.data, config.seed, 10 * config.steps, len(counts), examples))
    vocab = draft_vocab.draft_vocab_for_run(out, config.data, config.seed, config.steps, len(counts), 64)
    assert vocab == select(counts, 64)
    # The trained head decodes exactly: greedy equals plain greedy on held-out chat prompts.
    head = specjax.load_drafter(results["head"], target)
    prompts = eval_prompts(config.dataset, target.tokenizer, 2, 64)
    assert all(isinstance(p, list) for p in prompts)
    out = specjax.generate(target, prompts, SETTINGS, draft=head, speculative=K2)
    assert out.tokens == specjax.generate(target, prompts, SETTINGS).tokens


def test_head_resume_equals_a_straight_run(files, target, head_run, tmp_path):
    config, _, results = head_run
    assert train_head(config, tmp_path / "run", progress=False, stop_after=2) == {"completed_steps": 2}
    resumed = train_head(config, tmp_path / "run", progress=False)
    a = specjax.load_drafter(results["head"], target).params
    b = specjax.load_drafter(resumed["head"], target).params
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def test_distill_from_the_command_line_then_resume(files, target, tmp_path, capsys):
    """`specjax distill --target T --data FILE`: a target other than the embedded pair's, so the
    draft is built from draft_config; an in-process run stopped and resumed ends the same."""
    target_dir, chats, _ = files
    sets = [f"--set={entry}" for entry in (*DATA, *DISTILL)]
    straight = tmp_path / "straight"
    assert main(["distill", "--target", str(target_dir), "--data", str(chats), "--out", str(straight),
                 "--no-progress", *sets]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "; 2 bad" in printed  # the dataset report, printed before training
    assert json.loads(printed[printed.index("\n{") :])["dataset"] == str(chats)
    config = _config(DistillConfig, files, "draft_init=config", *DISTILL)  # what the command ran
    assert config.stream().seq_len == 33 and config.stream().batch_size == 4
    assert distill(config, tmp_path / "run", progress=False, stop_after=3) == {"completed_steps": 3}
    resumed = distill(config, tmp_path / "run", progress=False)
    a, b = specjax.load_model(straight / "draft"), specjax.load_model(resumed["draft"])
    assert a.config == target.config.replace(num_hidden_layers=1) and a.tokenizer is not None
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)
    # The distilled draft decodes exactly: greedy equals plain greedy on held-out chat prompts.
    prompts = eval_prompts(config.dataset, target.tokenizer, 2, 64)
    out = specjax.generate(target, prompts, SETTINGS, draft=a, speculative=K2)
    assert out.tokens == specjax.generate(target, prompts, SETTINGS).tokens


def test_a_bad_data_file_is_one_line_and_exit_2(files, tmp_path, capsys):
    target_dir, _, bad = files
    out = tmp_path / "bad"
    assert main(["train-head", "--target", str(target_dir), "--data", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specjax: error: ") and err.count("\n") == 1 and "no usable record" in err, err
    assert not out.exists()  # nothing half-written is left
