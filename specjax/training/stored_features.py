"""A head run and its feature store (training/feature_store.py): the store's provenance as a
run's config gives it, building the store for a config, and the run's batches read from it.

Only EAGLE-3 as published (eagle.eagle3) is stored: its target side is the largest per step
(a full forward and three layers' states) and its training-time test reads nothing else of
the target but the embedding, which stays in memory with the target for evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specjax.io.model import Model
from specjax.training.draft_vocab import DraftVocab
from specjax.training.feature_store import FeatureStore, eagle3_compute, eagle3_provenance, write_store
from specjax.training.feature_windows import Windows, run_windows
from specjax.training.run_data import predicted_mask

if TYPE_CHECKING:  # train_heads imports this module
    from specjax.training.train_heads import HeadTrainConfig


def run_store_windows(config: HeadTrainConfig, target: Model) -> Windows:
    """The windows of `config`'s run (training/feature_windows.py)."""
    return run_windows(config.data, config.dataset, target.tokenizer, config.seed, config.steps, config.batch_size)


def store_provenance(
    config: HeadTrainConfig, target: Model, windows: Windows, layers: tuple[int, ...], vocab: DraftVocab
) -> dict:
    final = config.eagle.eagle3.feature_weight > 0
    return eagle3_provenance(target, windows, layers, vocab, final, config.features.dtype)


def build_store(
    config: HeadTrainConfig,
    target: Model,
    layers: tuple[int, ...],
    vocab: DraftVocab,
    out_dir: str | Path,
    progress: bool = True,
    stop_after: int | None = None,
) -> dict:
    """Write (or finish) the store of `config`'s run into out_dir -> a summary for the CLI."""
    windows = run_store_windows(config, target)
    provenance = store_provenance(config, target, windows, layers, vocab)
    compute = eagle3_compute(target, layers, vocab, provenance["final_feature"])
    directory = write_store(out_dir, windows, provenance, compute, config.features, progress, stop_after)
    files = sorted(directory.glob("shard-*.safetensors"))
    return {
        "store": str(directory),
        "windows": len(windows.tokens),
        "shards": len(files),
        "bytes": sum(f.stat().st_size for f in files),
        "dtype": config.features.dtype,
        "draft_vocab_size": vocab.size,
        "layers": list(layers),
    }


def stored_batches(
    config: HeadTrainConfig, target: Model, layers: tuple[int, ...], vocab: DraftVocab, live: Callable
) -> Callable:
    """step -> ({"tokens" int32 [B, L] and the target's side: multi, logits, in_draft (final)},
    mask float32 [B, L] over predicted positions or None): the run's batch of `step` read from
    config.features.store, opened with the provenance this run gives (a ValueError names what
    differs). `live`: the run's live batches (train_heads._batches); each step's stored tokens
    and mask must equal them (cheap: no target runs for it), so misaligned windows raise."""
    windows = run_store_windows(config, target)
    store = FeatureStore(config.features.store, store_provenance(config, target, windows, layers, vocab))

    def batch(step: int):
        stored, mask = store.batch(windows.rows(step))
        mask = None if mask is None else predicted_mask(mask)
        tokens, live_mask = live(step)
        same_mask = (mask is None) == (live_mask is None) and (mask is None or np.array_equal(mask, live_mask))
        if not (np.array_equal(stored["tokens"], tokens) and same_mask):
            raise ValueError(f"feature store {store.directory}: the windows of step {step} are not the live batch's")
        return stored, mask

    return batch
