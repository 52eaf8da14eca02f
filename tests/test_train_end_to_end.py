"""Train drafters for your target on your data, end to end, as a user runs it (docs/training.md,
"Your target, your data"): a tiny random HF Llama target with a BPE tokenizer trained in the
test (the `tokenizers` library), a file of chat prompts, then `specjax regenerate` (the target's
own answers), `specjax distill` (a fresh draft of the target's architecture and tokenizer) and
`specjax train-head` (EAGLE-3 as published), each through the CLI entry point; what they wrote
loaded back with the documented API, and greedy speculative decoding with each drafter equal to
plain greedy decoding, token for token, on the dataset's held-out prompts (a ragged batch).

Each link is tested on its own (tests/test_regenerate.py, tests/test_train_on_datasets.py,
tests/test_datasets.py); this checks that what one command writes is what the next one reads.
A Medusa head is left out: its train-head run costs another ~8 s of compilation, and its
dataset loss mask is tested in tests/test_train_on_datasets.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_datasets import write_jsonl
from test_train_on_datasets import save_tiny_chat_target

import specjax
from specjax.cli import main
from specjax.training.data import split_of
from specjax.training.dataset_records import read_records
from specjax.training.datasets import DatasetConfig, load_dataset
from specjax.training.run_data import eval_prompts

QUESTIONS = [
    "What is a list?",
    "And a tuple?",
    "Name a fox.",
    "Why is the dog lazy?",
    "Tell me about the quick brown fox that jumps over the lazy dog.",
    "Can a tuple change once it is made?",
]
N_PROMPTS, N_HELD_OUT = 16, 3
MAX_NEW, K = 8, 2
# The runs' held-out acceptance (eval) and the checks below use the same settings and prompts,
# so the checks reuse the programs the runs compiled.
SETTINGS = specjax.GenerationConfig(max_new_tokens=MAX_NEW)
SPECULATIVE = specjax.SpeculativeConfig(num_speculative_tokens=K)
RUN = [
    "dataset.seq_len=32",
    "dataset.batch_size=4",
    "steps=3",
    "checkpoint_every=3",
    "log_every=1",
    "optim.warmup_steps=1",
    f"eval.prompts={N_HELD_OUT}",
    f"eval.max_new_tokens={MAX_NEW}",
    f"eval.num_speculative_tokens={K}",
    "eval.every=3",
]
# No draft or draft_init: with --target, distill picks draft_init=config (the target's
# architecture and tokenizer) sized by draft_config.
DISTILL = ["draft_config.hidden_size=16", "draft_config.intermediate_size=32", "optim.learning_rate=0.01"]
EAGLE3 = [
    "kind=eagle",
    "eagle.intermediate_size=32",
    "eagle.feature_layers=[0, 1, 2]",
    "eagle.eagle3.enabled=true",
    "eagle.eagle3.draft_vocab_size=64",
    "eagle.eagle3.ttt_steps=2",
    "optim.learning_rate=0.02",
]


def cli(*args) -> None:
    """`specjax ARGS` in this process (it keeps the programs compiled), without leaving the
    TQDM_DISABLE that --no-progress sets behind for the tests that follow."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TQDM_DISABLE", "1")
        assert main([str(a) for a in args]) == 0, args


def user_turns(questions) -> list[dict]:
    return [{"messages": [{"role": "user", "content": q}]} for q in questions]


def pick_questions(root: Path) -> list[str]:
    """N_PROMPTS questions: N_HELD_OUT in the validation split, each from another entry of
    QUESTIONS (so of different lengths), the rest in train. A record's split is a hash of its
    non-assistant turns (datasets.py), found here as the dataset reader finds it."""
    candidates = [f"{QUESTIONS[i % len(QUESTIONS)]} Number {i}." for i in range(400)]
    path = Path(write_jsonl(root / "candidates.jsonl", user_turns(candidates)))
    splits = [split_of(r.split_key) for _, r in read_records(path, "messages", 1000, answers_optional=True)]
    held, train = [], []
    for i, split in enumerate(splits):
        if split == "validation" and len(held) < N_HELD_OUT and i % 6 not in {j % 6 for j in held}:
            held.append(i)
        elif split == "train" and len(train) < N_PROMPTS - N_HELD_OUT:
            train.append(i)
    assert len(held) == N_HELD_OUT and len(train) == N_PROMPTS - N_HELD_OUT, "more candidates needed"
    return [candidates[i] for i in sorted(held + train)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The pipeline, once: the target directory, the questions and what each command wrote."""
    root = tmp_path_factory.mktemp("end_to_end")
    target = root / "target"
    save_tiny_chat_target(target)  # the random 3-layer Llama with a ChatML BPE of test_train_on_datasets
    questions = pick_questions(root)
    prompts, data = write_jsonl(root / "prompts.jsonl", user_turns(questions)), root / "chats.jsonl"
    cli("regenerate", "--target", target, "--data", prompts, "--out", data, "--max-new-tokens", 12,
        "--batch-size", N_PROMPTS, "--no-progress")  # fmt: skip
    sets = [f"--set={entry}" for entry in RUN]
    cli("distill", "--target", target, "--data", data, "--out", root / "distill", "--no-progress", *sets,
        *(f"--set={entry}" for entry in DISTILL))  # fmt: skip
    cli("train-head", "--target", target, "--data", data, "--out", root / "eagle3", "--no-progress", *sets,
        *(f"--set={entry}" for entry in EAGLE3))  # fmt: skip
    return {
        "target": target,
        "questions": questions,
        "data": data,
        "distill": root / "distill",
        "eagle3": root / "eagle3",
    }


def test_regenerate_answers_every_prompt(runs):
    lines = [json.loads(line) for line in runs["data"].read_text(encoding="utf-8").splitlines()]
    assert [x["source_line"] for x in lines] == list(range(1, N_PROMPTS + 1))
    for question, line in zip(runs["questions"], lines, strict=True):
        user, answer = line["messages"]
        assert user == {"role": "user", "content": question}
        assert answer["role"] == "assistant" and answer["content"].strip()
    target = specjax.load_model(runs["target"])
    report = load_dataset(DatasetConfig(path=str(runs["data"])), target.tokenizer).report
    assert report.format == "messages" and not report.bad
    assert report.used == {"train": N_PROMPTS - N_HELD_OUT, "validation": N_HELD_OUT, "test": 0}


@pytest.mark.parametrize("name", ["distill", "eagle3"])
def test_trained_drafter_decodes_exactly(runs, name):
    """Loaded from its run directory as docs/training.md shows: greedy output with the drafter
    equals plain greedy output on the dataset's held-out prompts, a ragged batch."""
    out = runs[name]
    results = json.loads((out / "results.json").read_text())
    assert results["dataset"] == str(runs["data"]) and results["mean_acceptance_length_after"] >= 1.0
    target = specjax.load_model(runs["target"])
    if name == "distill":
        drafter = specjax.load_model(out / "draft")
        assert drafter.tokenizer is not None and drafter.config.vocab_size == target.config.vocab_size
        assert (drafter.config.num_hidden_layers, drafter.config.hidden_size) == (1, 16)  # draft_init: config
    else:
        drafter = specjax.load_drafter(out / "head", target)
        assert results["kind"] == "eagle" and results["draft_vocab"]["draft_vocab_size"] == 64
    dataset = DatasetConfig(path=str(runs["data"]), seq_len=32, batch_size=4)
    prompts = eval_prompts(dataset, target.tokenizer, N_HELD_OUT, 64)  # the validation chats' prompts
    assert len({len(p) for p in prompts}) == N_HELD_OUT  # ragged
    plain = specjax.generate(target, prompts, SETTINGS)
    speculative = specjax.generate(target, prompts, SETTINGS, draft=drafter, speculative=SPECULATIVE)
    assert speculative.tokens == plain.tokens and all(len(t) == MAX_NEW for t in plain.tokens)
    stats = speculative.stats  # untrained drafters may accept little, but rounds ran and drafted
    assert stats.rounds > 0 and stats.drafted_tokens == K * stats.rounds
    assert stats.generated_tokens == N_HELD_OUT * MAX_NEW
