"""EAGLE-3's draft vocabulary: the target tokens a head's own LM head can propose, chosen by
frequency in the training data, and the maps between the two vocabularies.

Built as the published training builds it (SafeAILab/EAGLE, `traineagle3/cnets.py`,
`Model.scandata`): count every token the head is trained on, keep the `size` most frequent,
sort them by target id (so draft ids run in target-id order), then

  d2t[i] = used[i] - i        target id = draft id + d2t[draft id]   [Vd] int
  t2d[j] = j is one of used    which target tokens the draft vocabulary holds   [V] bool

Ties in the count go to the lower token id: the published `Counter.most_common` keeps the
order tokens were first seen in, which depends on how the data is sharded; by id is the
same rule made independent of that.

The counts come from the run's own training stream (`training_batch` for every step of the
run, a pure function of (data, seed, step)), or with a user dataset from its training split's
target tokens, every window once (training/run_data.train_examples), and the selection is written to
OUT/draft_vocab.json before the first step, so a resumed run reads it back instead of
counting again, and the file says what the head was trained over.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np

from specjax.training.data import DataConfig, training_batch

FILE = "draft_vocab.json"


@dataclasses.dataclass(frozen=True)
class DraftVocab:
    """A draft vocabulary of len(tokens) target ids, ascending; hashable (a jit static)."""

    tokens: tuple[int, ...]  # draft id i is target id tokens[i]
    vocab_size: int  # the target's V
    coverage: float = 1.0  # share of the counted training tokens the draft vocabulary holds

    def __post_init__(self):
        ids = np.asarray(self.tokens)
        if ids.size == 0 or np.any(np.diff(ids) <= 0) or ids[0] < 0 or ids[-1] >= self.vocab_size:
            raise ValueError(
                f"a draft vocabulary is a non-empty ascending list of distinct target ids in 0..{self.vocab_size - 1}"
            )

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def d2t(self) -> np.ndarray:
        """[Vd] int32 offsets: target id = draft id + d2t[draft id]."""
        return (np.asarray(self.tokens) - np.arange(self.size)).astype(np.int32)

    @property
    def t2d(self) -> np.ndarray:
        """[V] bool: the target token is in the draft vocabulary."""
        mask = np.zeros(self.vocab_size, bool)
        mask[list(self.tokens)] = True
        return mask

    @property
    def is_identity(self) -> bool:
        """The full vocabulary: no d2t needed (the published loaders drop it, as specjax's does)."""
        return self.size == self.vocab_size


# A dataset's training split, every window once: (tokens int32 [N, L], mask bool [N, L]:
# mask[:, t] says token t is a target), training/datasets.dataset_examples.
Examples = tuple[np.ndarray, np.ndarray]


def token_counts(
    data: DataConfig, seed: int, steps: int, vocab_size: int, examples: Examples | None = None
) -> np.ndarray:
    """[V] int64: how often each token occurs in what the head trains on.

    The corpus (`examples` None): every position of the batches of steps 0..steps-1, all of
    which the head's training passes read. A user dataset (`examples`, its training split;
    `data`, `seed` and `steps` then do not enter): the tokens the head is scored on,
    tokens[:, 1:] under mask[:, 1:], over every window once (windows overlap by one token,
    so each target of the stream counts once; prompts and padding, never proposed by the
    target, not at all). Once, not over the run's steps: the vocabulary is the data's, the
    same for a run of any length, so one feature store serves runs of different lengths
    (ablations beside the full run)."""
    counts = np.zeros(vocab_size, np.int64)
    if examples is not None:
        tokens, mask = examples
        ids = tokens[:, 1:][mask[:, 1:]]
        return counts + np.bincount(ids, minlength=vocab_size)[:vocab_size]
    for step in range(steps):
        ids = training_batch(data, seed, step).reshape(-1)
        counts += np.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


def select(counts: np.ndarray, size: int) -> DraftVocab:
    """The `size` most frequent tokens of `counts` [V] (ties: the lower id), ascending."""
    vocab_size = len(counts)
    if not 1 <= size <= vocab_size:
        raise ValueError(f"draft_vocab_size must be in 1..{vocab_size} (the target's vocabulary), got {size}")
    order = np.lexsort((np.arange(vocab_size), -counts))  # by count descending, then id ascending
    used = np.sort(order[:size])
    total = int(counts.sum())
    coverage = float(counts[used].sum() / total) if total else 1.0
    return DraftVocab(tuple(int(i) for i in used), vocab_size, coverage)


def draft_vocab_for_run(
    out_dir: Path, data: DataConfig, seed: int, steps: int, vocab_size: int, size: int, examples: Examples | None = None
):
    """The run's draft vocabulary: read from OUT/draft_vocab.json when a run left one, else
    counted over the run's training data (the corpus's stream, or a dataset's `examples`: `token_counts`) and
    written there (atomically: a kill leaves the old file or none, never half of one)."""
    path = Path(out_dir) / FILE
    if path.exists():
        saved = json.loads(path.read_text())
        vocab = DraftVocab(tuple(saved["tokens"]), int(saved["vocab_size"]), float(saved["coverage"]))
        if vocab.vocab_size != vocab_size or vocab.size != size:
            raise ValueError(
                f"{path} holds a draft vocabulary of {vocab.size} of {vocab.vocab_size} tokens, this run asks for "
                f"{size} of {vocab_size}: use another --out to start a new run"
            )
        return vocab
    vocab = select(token_counts(data, seed, steps, vocab_size, examples), size)
    record = {
        "vocab_size": vocab.vocab_size,
        "draft_vocab_size": vocab.size,
        "counted": "the training split, each window once" if examples is not None else f"{steps} steps",
        "coverage": vocab.coverage,
        "tokens": list(vocab.tokens),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, path)
    return vocab
