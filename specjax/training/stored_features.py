"""A head run and its feature store (training/feature_store.py): the store's provenance as a
run's config gives it, building the store for a config, and the run's batches read from it.

Stored kinds (STORABLE): EAGLE-3 as published (eagle.eagle3; its target side is the largest
per step, a full forward and three layers' states) and the block heads (block, dspark,
dflash2: the feature layers' states and the target's top-k, training/block_store.py). Their
objectives read nothing else of the target but the embedding, which stays in memory with
the target for evaluation. Medusa and EAGLE-1 still train live.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specjax.io.model import Model
from specjax.training.block_objective import head_feature_layers
from specjax.training.block_store import block_compute, block_provenance
from specjax.training.draft_vocab import DraftVocab
from specjax.training.feature_store import FeatureStore, eagle3_compute, eagle3_provenance, write_store
from specjax.training.feature_windows import Windows, run_windows
from specjax.training.head_kinds import BLOCK_KINDS, eagle3_setup
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


STORABLE = ("eagle with eagle.eagle3.enabled (EAGLE-3)", *BLOCK_KINDS)


def check_storable(config: HeadTrainConfig) -> None:
    """A ValueError naming the storable kinds unless `config` is one of them."""
    if not (config.kind in BLOCK_KINDS or (config.kind == "eagle" and config.eagle.eagle3.enabled)):
        what = "eagle without eagle.eagle3.enabled (EAGLE-1)" if config.kind == "eagle" else config.kind
        raise ValueError(
            f"a feature store holds what EAGLE-3's or a block head's loss reads of the target, not {what}'s: "
            f"the storable kinds are {', '.join(STORABLE)}; leave features.store unset to train live"
        )


@dataclasses.dataclass(frozen=True)
class StoreKind:
    """A run's kind of store: its provenance for the run's windows, the target side's
    compute (built only to write: it checks sizes) and what the CLI reports of it."""

    provenance: Callable[[Windows], dict]
    compute: Callable[[dict], Callable[[np.ndarray], dict]]  # provenance -> tokens [b, L] -> {name: [b, ..]}
    summary: dict


def store_kind(config: HeadTrainConfig, target: Model, out_dir: Path | None) -> StoreKind:
    """`config`'s kind of store (check_storable first). out_dir: the run's (EAGLE-3's draft
    vocabulary is the run's), or None for a new run's (store-features)."""
    check_storable(config)
    dtype = config.features.dtype
    if config.kind in BLOCK_KINDS:
        layers, k = head_feature_layers(getattr(config, config.kind), target.config), config.features.top_k
        return StoreKind(
            provenance=lambda windows: block_provenance(target, windows, layers, k, dtype),
            compute=lambda _: block_compute(target, layers, k),
            summary={"kind": "block", "dtype": dtype, "top_k": k, "layers": list(layers)},
        )
    _, layers, vocab = eagle3_setup(config, target, out_dir)
    return StoreKind(
        provenance=lambda windows: store_provenance(config, target, windows, layers, vocab),
        compute=lambda provenance: eagle3_compute(target, layers, vocab, provenance["final_feature"]),
        summary={"kind": "eagle3", "dtype": dtype, "draft_vocab_size": vocab.size, "layers": list(layers)},
    )


def build_store(
    config: HeadTrainConfig, target: Model, out_dir: str | Path, progress: bool = True, stop_after: int | None = None
) -> dict:
    """Write (or finish) the store of `config`'s run into out_dir -> a summary for the CLI."""
    kind = store_kind(config, target, None)  # what a new run of this config counts
    windows = run_store_windows(config, target)
    provenance = kind.provenance(windows)
    compute = kind.compute(provenance)
    directory = write_store(out_dir, windows, provenance, compute, config.features, progress, stop_after)
    files = sorted(directory.glob("shard-*.safetensors"))
    return {
        "store": str(directory),
        "windows": len(windows.tokens),
        "shards": len(files),
        "bytes": sum(f.stat().st_size for f in files),
        **kind.summary,
    }


def stored_batches(config: HeadTrainConfig, target: Model, out_dir: Path | None, live: Callable) -> Callable:
    """step -> ({"tokens" int32 [B, L] and the target's side: EAGLE-3's multi, logits,
    in_draft (final), or a block store's states, top_logprobs, top_ids}, mask float32 [B, L]
    over predicted positions or None): the run's batch of `step` read from
    config.features.store, opened with the provenance this run gives (a ValueError names what
    differs). `live`: the run's live batches (train_heads._batches); each step's stored tokens
    and mask must equal them (cheap: no target runs for it), so misaligned windows raise."""
    windows = run_store_windows(config, target)
    store = FeatureStore(config.features.store, store_kind(config, target, out_dir).provenance(windows))

    def batch(step: int):
        stored, mask = store.batch(windows.rows(step))
        mask = None if mask is None else predicted_mask(mask)
        tokens, live_mask = live(step)
        same_mask = (mask is None) == (live_mask is None) and (mask is None or np.array_equal(mask, live_mask))
        if not (np.array_equal(stored["tokens"], tokens) and same_mask):
            raise ValueError(f"feature store {store.directory}: the windows of step {step} are not the live batch's")
        return stored, mask

    return batch
