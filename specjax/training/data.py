"""The training corpus: the Python standard library that every interpreter carries.

Two domains:
  code  - the stdlib's own .py files (test suites excluded: they are mostly fixtures);
  prose - the English documentation pages shipped in pydoc_data/topics.py.
Each document (a file, or a ~1 KB run of paragraphs of a pydoc topic) goes to train / validation / test by a hash of
its relative path, so the split is deterministic across machines and held-out prompts
are never trained on. The manifest records the interpreter version the split came from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import sysconfig
from functools import cache
from pathlib import Path

import numpy as np

from specjax.io.tokenizer import ByteTokenizer

DOMAINS = ("code", "prose")
SPLITS = ("train", "validation", "test")
_SPLIT_EDGES = (0.90, 0.95)  # train < 0.90 <= validation < 0.95 <= test
_EXCLUDED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


@dataclasses.dataclass(frozen=True)
class Document:
    name: str  # relative path (code) or "pydoc_data/topics.py::<topic>::<chunk>" (prose)
    domain: str
    text: str

    @property
    def split(self) -> str:
        return split_of(self.name)


def split_of(name: str) -> str:
    """train / validation / test from the first 8 bytes of sha256(name)."""
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") / 2**64
    if digest < _SPLIT_EDGES[0]:
        return "train"
    return "validation" if digest < _SPLIT_EDGES[1] else "test"


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@cache
def documents(domain: str) -> tuple[Document, ...]:
    """All documents of a domain, sorted by name."""
    if domain == "code":
        root = stdlib_root()
        docs = []
        for path in sorted(root.rglob("*.py")):
            relative = path.relative_to(root)
            if _EXCLUDED_DIRS & set(relative.parts[:-1]):
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            if text.strip():
                docs.append(Document(relative.as_posix(), "code", text))
        return tuple(docs)
    if domain == "prose":
        from pydoc_data.topics import topics

        # 79 topics are too few units for a 5% held-out share, so each topic is cut into
        # chunks of whole paragraphs (>= 1 KB), each its own document.
        docs = []
        for topic, text in sorted(topics.items()):
            chunk: list[str] = []
            for paragraph in text.split("\n\n"):
                chunk.append(paragraph)
                if sum(len(p) for p in chunk) >= 1000:
                    docs.append(Document(f"pydoc_data/topics.py::{topic}::{len(docs)}", "prose", "\n\n".join(chunk)))
                    chunk = []
            if chunk:
                docs.append(Document(f"pydoc_data/topics.py::{topic}::{len(docs)}", "prose", "\n\n".join(chunk)))
        return tuple(docs)
    raise ValueError(f"unknown domain {domain!r}; expected one of {DOMAINS}")


def split_documents(domain: str, split: str) -> list[Document]:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return [d for d in documents(domain) if d.split == split]


@cache
def token_stream(domain: str, split: str) -> np.ndarray:
    """All documents of a split as one uint16 array: <bos> bytes <eos> <bos> bytes <eos> ..."""
    tok = ByteTokenizer()
    pieces = []
    for doc in split_documents(domain, split):
        pieces.append(np.array([tok.bos_token_id, *doc.text.encode("utf-8"), tok.eos_token_id], np.uint16))
    return np.concatenate(pieces)


def manifest() -> dict:
    """What the corpus is on this interpreter: counts and bytes per domain and split."""
    out = {"python": sys.version.split()[0], "stdlib": str(stdlib_root()), "domains": {}}
    for domain in DOMAINS:
        out["domains"][domain] = {
            split: {
                "documents": len(docs := split_documents(domain, split)),
                "bytes": sum(len(d.text.encode("utf-8")) for d in docs),
            }
            for split in SPLITS
        }
    return out


@dataclasses.dataclass(frozen=True)
class DataConfig:
    seq_len: int = 256
    batch_size: int = 16
    prose_fraction: float = 0.2  # share of training rows drawn from the prose domain

    def __post_init__(self):
        if self.seq_len < 2 or self.batch_size < 1:
            raise ValueError(f"seq_len must be >= 2 and batch_size >= 1, got {self.seq_len}, {self.batch_size}")
        if not 0.0 <= self.prose_fraction <= 1.0:
            raise ValueError(f"prose_fraction must be in [0, 1], got {self.prose_fraction}")


def training_batch(config: DataConfig, seed: int, step: int) -> np.ndarray:
    """Random windows [batch, seq_len + 1] for `step`, a pure function of (seed, step).

    Keying the sampler by step (not by an iterator's position) is what makes a resumed
    run see exactly the batches the interrupted one would have seen.
    """
    rng = np.random.default_rng([seed, step])
    n_prose = int(rng.binomial(config.batch_size, config.prose_fraction))
    rows = []
    for domain, count in (("prose", n_prose), ("code", config.batch_size - n_prose)):
        stream = token_stream(domain, "train")
        starts = rng.integers(0, len(stream) - config.seq_len - 1, size=count)
        rows.extend(stream[s : s + config.seq_len + 1] for s in starts)
    return np.stack(rows).astype(np.int32)


def evaluation_windows(domain: str, split: str, seq_len: int, max_windows: int) -> np.ndarray:
    """Non-overlapping windows [N, seq_len + 1] spread evenly over a held-out stream."""
    stream = token_stream(domain, split)
    count = min(max_windows, (len(stream) - 1) // seq_len)
    starts = np.linspace(0, len(stream) - seq_len - 1, count).astype(np.int64)
    return np.stack([stream[s : s + seq_len + 1] for s in starts]).astype(np.int32)


def held_out_prompts(domain: str, count: int, prompt_bytes: int = 64, split: str = "test") -> list[str]:
    """Deterministic prompts cut from held-out documents (one per document, cycling)."""
    docs = [d for d in split_documents(domain, split) if len(d.text.encode("utf-8")) > 4 * prompt_bytes]
    prompts = []
    for i in range(count):
        doc = docs[i % len(docs)]
        data = doc.text.encode("utf-8")
        # Start at a line boundary a little way into the document, varying by round.
        offset = data.find(b"\n", (len(data) * (1 + i // len(docs)) // 7)) + 1
        prompts.append(data[offset : offset + prompt_bytes].decode("utf-8", errors="ignore"))
    return prompts
