"""Where a trainer's batches and held-out prompts come from when the run names a user dataset
(`dataset:` of a DistillConfig or HeadTrainConfig, `--data FILE` on the command line).

Without one, `specjax distill` and `specjax train-head` read the embedded stdlib corpus as
they always did (training/data.py). With one, batches are `dataset_batch` windows tokenized
with the target's own tokenizer (training/datasets.py) together with their loss mask, and
held-out acceptance is measured on the dataset's validation split: its chats' rendered
prompts, or for a text dataset the opening tokens of its validation windows.

Masks. A dataset batch's mask is aligned with its tokens: mask[:, t] says token t is a
target. The head losses score a prediction *made at* position q (of the token at q + 1,
from the target's distribution logits[q]), so they take `predicted_mask`: [:, q] =
mask[:, q + 1]. The last position predicts a token past the window, which the dataset does
not say is a target; the window after it (windows overlap by one token) scores that token,
so it is left out here and every stream token is scored exactly once.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from specjax.training.data import held_out_prompts
from specjax.training.dataset_records import CHAT_FORMATS
from specjax.training.datasets import (
    DatasetConfig,
    DatasetReport,
    dataset_batch,
    dataset_examples,
    dataset_report,
    held_out_chat_prompts,
    load_dataset,
)
from specjax.training.draft_vocab import Examples

# step -> (tokens int32 [B, L], mask bool [B, L]: mask[:, t] says token t is a target)
Batches = Callable[[int], tuple[np.ndarray, np.ndarray]]

REPORT_FILE = "dataset_report.json"


def _check_tokenizer(tokenizer, dataset: DatasetConfig) -> None:
    if tokenizer is None:
        raise ValueError(
            f"the target has no tokenizer, so the dataset {dataset.path} cannot be tokenized: "
            "use a target directory or GGUF file that carries one"
        )


def dataset_batches(dataset: DatasetConfig, tokenizer, seed: int) -> Batches:
    """The run's training stream: step -> `dataset_batch(dataset, tokenizer, seed, step)`,
    tokens int32 [dataset.batch_size, dataset.seq_len + 1] and mask bool, same shape."""
    _check_tokenizer(tokenizer, dataset)
    return lambda step: dataset_batch(dataset, tokenizer, seed, step)


def train_examples(dataset: DatasetConfig, tokenizer) -> Examples:
    """Every window of the dataset's training split once (`dataset_examples`): what a
    draft vocabulary is counted over (draft_vocab.token_counts)."""
    _check_tokenizer(tokenizer, dataset)
    return dataset_examples(dataset, tokenizer, "train")


def predicted_mask(mask: np.ndarray) -> np.ndarray:
    """mask bool [B, L] aligned with the tokens -> float32 [B, L] over predicted positions:
    [:, q] = mask[:, q + 1] (the prediction at q is of token q + 1), 0 at q = L - 1 (module
    docstring)."""
    return np.concatenate([mask[:, 1:], np.zeros_like(mask[:, :1])], axis=1).astype(np.float32)


def eval_prompts(dataset: DatasetConfig | None, tokenizer, count: int, prompt_bytes: int) -> list:
    """The held-out prompts of in-training acceptance, from validation splits (the test split
    stays clean for a final report). The corpus (`dataset` None): code prompts of
    `prompt_bytes` bytes, as text. A dataset: token ids, which generate takes as they are: its
    validation chats' prompts rendered with the chat template (encoded without added
    specials: the template holds them), or for a text dataset the first `prompt_bytes` tokens
    of its validation windows."""
    if dataset is None:
        return held_out_prompts("code", count, prompt_bytes, split="validation")
    _check_tokenizer(tokenizer, dataset)
    if load_dataset(dataset, tokenizer).report.format in CHAT_FORMATS:
        texts = held_out_chat_prompts(dataset, tokenizer, count=count)
        return [list(tokenizer.encode(text, add_special_tokens=False)) for text in texts]
    tokens, _ = dataset_examples(dataset, tokenizer, "validation")  # [N, seq_len + 1]
    return [row[:prompt_bytes].tolist() for row in tokens[:count]]


def report_dataset(dataset: DatasetConfig, tokenizer, out_dir: Path) -> DatasetReport:
    """Read the dataset once before training (a file with no usable record raises here, before
    any step), print its report (bad records by reason and line) and save it as
    OUT/dataset_report.json."""
    _check_tokenizer(tokenizer, dataset)
    report = dataset_report(dataset, tokenizer)
    print(report.summary(), flush=True)
    (Path(out_dir) / REPORT_FILE).write_text(json.dumps(dataclasses.asdict(report), indent=2) + "\n")
    return report
