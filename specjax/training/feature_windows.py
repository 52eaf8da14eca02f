"""The training windows a feature store holds, and which of them each training step reads.

A head run's batches are a pure function of (seed, step) (training/data.py, datasets.py).
For a feature store they are split in two: a fixed array of windows [N, L] that the target
runs over once, and `rows(step)` -> [B] indices into it, such that tokens[rows(step)] is the
live batch of that step, bit for bit:

  a user dataset  the split's windows (`dataset_examples`, N of them), drawn in a fresh
                  random order per epoch keyed by (seed, epoch): the rows of `dataset_batch`.
                  One store serves any seed, batch size and number of steps (any epochs).
  the corpus      random windows drawn per step (`training_batch`), so the run's own
                  steps * B windows in step order: rows(step) = step * B + [0, B). A store
                  then serves that (data, seed, steps) only: a sweep of heads over one stream.

Training compares the stored tokens and mask of every step with the live batch (cheap: no
target runs for it), so a store whose windows are misaligned cannot train silently.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from specjax.training.data import DataConfig, manifest, training_batch
from specjax.training.datasets import DatasetConfig, dataset_examples


@dataclasses.dataclass(frozen=True)
class Windows:
    tokens: np.ndarray  # int32 [N, L]
    mask: np.ndarray | None  # bool [N, L] aligned with the tokens (a dataset's), None: the corpus
    rows: Callable[[int], np.ndarray]  # step -> int64 [B]: the step's windows, in batch order
    record: dict  # what the windows are (the store's provenance["windows"])


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_array(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def run_windows(
    data: DataConfig, dataset: DatasetConfig | None, tokenizer, seed: int, steps: int, batch_size: int
) -> Windows:
    """The windows of a head run (module docstring): its dataset's, or its corpus stream's."""
    if dataset is None:
        return _corpus_windows(data, seed, steps)
    tokens, mask = dataset_examples(dataset, tokenizer, "train")  # [N, L] each
    count = len(tokens)

    def rows(step: int) -> np.ndarray:
        # dataset_batch's rows: positions step * B .. in the epoch orders keyed by (seed, epoch).
        positions = step * batch_size + np.arange(batch_size)
        epochs, offsets = np.divmod(positions, count)
        orders = {int(e): np.random.default_rng([seed, int(e)]).permutation(count) for e in set(epochs.tolist())}
        return np.array([orders[int(e)][o] for e, o in zip(epochs, offsets, strict=True)], np.int64)

    record = {
        "source": "dataset",
        "file_sha256": sha256_file(dataset.path),
        "format": dataset.format,
        "seq_len": dataset.seq_len,
        "pack": dataset.pack,
        "plain_chunk_chars": dataset.plain_chunk_chars,
        "count": count,
        # The tokenizer's output: another tokenizer (or template) gives other windows.
        "tokens_sha256": sha256_array(tokens),
        "mask_sha256": sha256_array(mask),
    }
    return Windows(tokens, mask, rows, record)


def _corpus_windows(data: DataConfig, seed: int, steps: int) -> Windows:
    tokens = np.concatenate([training_batch(data, seed, step) for step in range(steps)])  # [steps * B, L]
    b = data.batch_size

    def rows(step: int) -> np.ndarray:
        if not 0 <= step < steps:
            raise ValueError(f"this corpus feature store holds steps 0..{steps - 1}, not step {step}")
        return step * b + np.arange(b, dtype=np.int64)

    record = {
        "source": "corpus",
        "python": manifest()["python"],  # the stdlib the corpus is cut from
        "data": dataclasses.asdict(data),
        "seed": seed,
        "steps": steps,
        "count": len(tokens),
        "tokens_sha256": sha256_array(tokens),
    }
    return Windows(tokens, None, rows, record)
