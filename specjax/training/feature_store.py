"""An on-disk store of what a head's objective reads of the frozen target, so the target runs
once per dataset instead of once per training step (`specjax store-features`, then
`train-head` with `features.store: DIR`; docs/training.md, "Training from stored features").
Two kinds: EAGLE-3's (below) and the block heads' (states and the target's top-k
log-probabilities: training/block_store.py); the layout, writing and reading are shared.

What is stored (EAGLE-3 as published, training/eagle3_objective.py), per training window
[L] of the run (training/feature_windows.py), exactly the dict `target_side` computes live:

  tokens    int32 [N, L]        the window
  mask      uint8 [N, L]        its loss mask aligned with the tokens (all ones for the corpus)
  multi     dtype [N, L, n * D] the feature layers' raw states, concatenated (fc's input)
  logits    dtype [N, L, Vd]    the target's logits over the draft vocabulary only
  in_draft  uint8 [N, L]        the target's top-1 over the full vocabulary is in the draft vocabulary
  final     dtype [N, L, D]     the final-norm features, only with eagle3.feature_weight > 0

The logits are the draft-vocabulary slice, not top-k: the published loss is the
cross-entropy to the target's softmax renormalised over the draft vocabulary, which needs
every one of its Vd logits (top-k would change the loss), and the only full-vocabulary
quantity it reads, whether the target's argmax is in the draft vocabulary, is one byte per
position (in_draft). The slice is Vd / V of the full distribution (8,192 of SmolLM2's
49,152: 4.2 MB per 257-token window in bfloat16, against 0.9 MB for the three layers'
states); a draft vocabulary over MAX_STORED_VOCAB tokens is refused rather than stored.
`dtype` (features.dtype) is bfloat16 by default (half the disk, the loss within bfloat16
rounding of the live one) or float32 (the live loss to float tolerance).

Layout: DIR/manifest.json (format, provenance, layout, window count) and
DIR/shard-00000.safetensors ... each holding `shard_windows` consecutive windows
(safetensors has no bfloat16 for numpy: bfloat16 arrays are stored as their uint16 bits and
the manifest says so). Each shard is serialised in memory, written to a .tmp file, fsynced
and renamed, so a kill at any moment leaves whole shards only; rerunning the same command
deletes stray .tmp files and computes the missing shards, giving the same bytes as an
uninterrupted write (the target's forward is deterministic for the same inputs and shapes).

Provenance (manifest["provenance"]): the target's fingerprint (config and weights sha256,
drafters/formats/native.py), the windows (the data file's sha256 and window settings, or the
corpus stream's; the tokens' sha256), the feature layers, the draft vocabulary's sha256 and
the dtype. Training opens a store with the provenance its own config gives and raises a
ValueError naming every field that differs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save as safetensors_bytes
from tqdm.auto import tqdm

from specjax.drafters.formats.native import target_fingerprint
from specjax.io.model import Model
from specjax.training.draft_vocab import DraftVocab
from specjax.training.eagle3_objective import target_side
from specjax.training.feature_windows import Windows

FORMAT = 1
MANIFEST = "manifest.json"
DTYPES = ("bfloat16", "float32")
MAX_STORED_VOCAB = 16384  # draft-vocabulary logits per position stored; more would approach the full V
# Stored in the store's dtype, the rest as they are: EAGLE-3's, then the block kind's (block_store.py).
_FLOAT_ARRAYS = ("multi", "logits", "final", "states", "top_logprobs")


@dataclasses.dataclass(frozen=True)
class FeatureStoreConfig:
    """`features` of a HeadTrainConfig: train from a store instead of running the target."""

    store: str | None = None  # the store's directory (`specjax store-features --out DIR`); None: live
    dtype: str = "bfloat16"  # of the stored states and logits: "bfloat16" or "float32"
    shard_windows: int = 64  # windows per shard file
    forward_batch: int = 4  # windows per target forward when building (memory: [B, L, V] logits)
    # Block heads' stores: the target's top_k log-probabilities per position, the teacher (block_store.py).
    top_k: int = 64

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"features.dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.top_k < 1:
            raise ValueError(f"features.top_k must be >= 1, got {self.top_k}")
        if self.shard_windows < 1 or self.forward_batch < 1:
            raise ValueError(
                f"features.shard_windows and forward_batch must be >= 1, got {self.shard_windows}, {self.forward_batch}"
            )


def vocab_sha256(vocab: DraftVocab) -> str:
    return hashlib.sha256(json.dumps([vocab.vocab_size, list(vocab.tokens)]).encode()).hexdigest()


def eagle3_provenance(
    target: Model, windows: Windows, layers: tuple[int, ...], vocab: DraftVocab, final: bool, dtype: str
) -> dict:
    """What an EAGLE-3 store was computed from (module docstring); JSON-ready."""
    return {
        "objective": "eagle3",
        "target": target_fingerprint(target),
        "windows": windows.record,
        "layers": list(layers),
        "draft_vocab": {"size": vocab.size, "vocab_size": vocab.vocab_size, "sha256": vocab_sha256(vocab)},
        "final_feature": final,
        "dtype": dtype,
    }


def eagle3_compute(target: Model, layers: tuple[int, ...], vocab: DraftVocab, final: bool) -> Callable:
    """tokens int32 [B, L] -> `target_side`'s arrays as numpy (what a shard holds, but tokens and mask)."""
    if vocab.size > MAX_STORED_VOCAB:
        raise ValueError(
            f"a feature store holds the target's logits over the draft vocabulary, and {vocab.size} tokens per "
            f"position is too many (at most {MAX_STORED_VOCAB}): set eagle.eagle3.draft_vocab_size"
        )

    def compute(tokens: np.ndarray) -> dict:
        out = _target_side(target.config, target.params, tokens, tuple(layers), vocab, final)
        return {name: np.asarray(value) for name, value in out.items()}

    return compute


# Module level: one compiled forward per (target config, layers, vocabulary, shapes) in a process.
_target_side = jax.jit(target_side, static_argnums=(0, 3, 4, 5))


def _differences(stored, expected, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(stored) | set(expected)):
        a, b = stored.get(key), expected.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} (store: {json.dumps(a)[:80]}; this run: {json.dumps(b)[:80]})")
    return out


def _check_provenance(directory: Path, stored: dict, expected: dict, what: str) -> None:
    expected = json.loads(json.dumps(expected))  # tuples as lists, as the manifest reads back
    if differ := _differences(stored, expected):
        raise ValueError(
            f"feature store {directory} was computed from other {what}: {'; '.join(differ)}. Build a store for this "
            "config with `specjax store-features --config CFG --out NEW_DIR`"
        )


def _shard_path(directory: Path, index: int) -> Path:
    return directory / f"shard-{index:05d}.safetensors"


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # a reader, or a resumed write, sees the whole file or none


def _to_stored(name: str, array: np.ndarray, dtype: str) -> np.ndarray:
    if name in _FLOAT_ARRAYS:
        array = np.asarray(array, ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)
        return array.view(np.uint16) if dtype == "bfloat16" else array  # safetensors' numpy has no bfloat16
    return array.astype(np.uint8) if array.dtype == bool else array


def write_store(
    directory: str | Path,
    windows: Windows,
    provenance: dict,
    compute: Callable[[np.ndarray], dict],
    settings: FeatureStoreConfig,
    progress: bool = True,
    stop_after: int | None = None,
) -> Path:
    """Compute and write the store of `windows` into `directory`, or finish one a kill
    interrupted (the same provenance and layout). `compute`: tokens [b, L] -> {name: [b, ..]}.
    stop_after: write at most that many new shards and return (tests: an interruption)."""
    directory = Path(directory).resolve()
    count = len(windows.tokens)
    layout = {"shard_windows": settings.shard_windows, "forward_batch": settings.forward_batch}
    manifest = {"format": FORMAT, "provenance": provenance, "layout": layout, "windows": count}
    manifest["shards"] = -(-count // settings.shard_windows)
    path = directory / MANIFEST
    if path.exists():
        saved = json.loads(path.read_text())
        _check_provenance(directory, saved["provenance"], provenance, "inputs")
        _check_provenance(directory, saved["layout"], layout, "layout settings")
    else:
        directory.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    for stray in directory.glob("*.tmp"):  # a write a kill interrupted: recomputed below
        stray.unlink()
    todo = [i for i in range(manifest["shards"]) if not _shard_path(directory, i).exists()]
    mask = np.ones_like(windows.tokens, bool) if windows.mask is None else windows.mask
    for written, index in enumerate(tqdm(todo, disable=not progress, desc="store-features")):
        if stop_after is not None and written >= stop_after:
            break
        lo, hi = index * settings.shard_windows, min((index + 1) * settings.shard_windows, count)
        tokens = windows.tokens[lo:hi]  # [n, L]
        parts = []
        for start in range(0, hi - lo, settings.forward_batch):
            chunk = tokens[start : start + settings.forward_batch]
            pad = settings.forward_batch - len(chunk)  # one shape, one compiled forward: pad the last
            padded = np.concatenate([chunk, np.zeros((pad, chunk.shape[1]), chunk.dtype)]) if pad else chunk
            parts.append({k: v[: len(chunk)] for k, v in compute(padded).items()})
        arrays = {"tokens": tokens.astype(np.int32), "mask": mask[lo:hi]}
        arrays |= {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
        stored = {name: np.ascontiguousarray(_to_stored(name, a, provenance["dtype"])) for name, a in arrays.items()}
        _atomic_write(_shard_path(directory, index), safetensors_bytes(stored))
    return directory


class FeatureStore:
    """A complete store opened for reading, its provenance checked against `expected`.
    `batch(rows)` reads windows by index from the memory-mapped shards."""

    def __init__(self, directory: str | Path, expected: dict):
        self.directory = Path(directory).resolve()
        path = self.directory / MANIFEST
        if not path.exists():
            raise ValueError(
                f"{self.directory} is not a feature store (no {MANIFEST}): build it with "
                "`specjax store-features --config CFG --out DIR`"
            )
        self.manifest = json.loads(path.read_text())
        if self.manifest.get("format") != FORMAT:
            raise ValueError(f"feature store {self.directory} has format {self.manifest.get('format')}, not {FORMAT}")
        _check_provenance(self.directory, self.manifest["provenance"], expected, "inputs")
        missing = [i for i in range(self.manifest["shards"]) if not _shard_path(self.directory, i).exists()]
        if missing:
            raise ValueError(
                f"feature store {self.directory} is incomplete ({len(missing)} of {self.manifest['shards']} shards "
                "missing): rerun the same `specjax store-features` command to finish it"
            )
        self.dtype = self.manifest["provenance"]["dtype"]
        self.corpus = self.manifest["provenance"]["windows"]["source"] == "corpus"
        self._shard = self.manifest["layout"]["shard_windows"]
        self._files: dict[int, object] = {}

    def _file(self, index: int):
        if index not in self._files:
            self._files[index] = safe_open(str(_shard_path(self.directory, index)), framework="numpy")
        return self._files[index]

    def batch(self, rows: np.ndarray) -> tuple[dict, np.ndarray | None]:
        """Windows `rows` [B] -> ({tokens int32 [B, L], and EAGLE-3's multi, logits, in_draft
        bool, final? or a block store's states, top_logprobs, top_ids}, mask bool [B, L]
        aligned with the tokens, or None for a corpus store)."""
        picked: dict[str, list] = {}
        for row in np.asarray(rows).tolist():
            shard = self._file(row // self._shard)
            offset = row % self._shard
            for name in shard.keys():  # noqa: SIM118 (a safetensors file, not a dict)
                picked.setdefault(name, []).append(shard.get_slice(name)[offset : offset + 1])
        out = {name: np.concatenate(parts) for name, parts in picked.items()}
        for name in _FLOAT_ARRAYS:
            if name in out and self.dtype == "bfloat16":
                out[name] = out[name].view(ml_dtypes.bfloat16)
        if "in_draft" in out:
            out["in_draft"] = out["in_draft"].astype(bool)
        mask = out.pop("mask").astype(bool)
        return out, None if self.corpus else mask
