"""The files of a published draft head: which weights file it ships, and its tensors by name.

Heads on the Hub ship one weights file beside their config.json: safetensors (read with
safetensors) or a torch pickle (`pytorch_model.bin`, Medusa's `medusa_lm_head.pt`), read only
through `torch.load(weights_only=True)`, which unpickles tensors and plain containers and
nothing executable, and only when torch is installed (it is no dependency of specjax).
`HeadTensors.get` checks every shape a reader asks for and records what was used, so a
tensor no reader used is an error (`check_all_used`), never silently dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open

# In the order they are looked for: safetensors first where a head ships both.
WEIGHT_FILES = (
    "model.safetensors",
    "medusa_lm_head.safetensors",
    "pytorch_model.bin",
    "medusa_lm_head.pt",
    "medusa_lm_head.bin",
)
_SHARDED = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def read_config(directory: Path) -> dict:
    """config.json of a head directory as a dict ({} when there is none)."""
    path = directory / "config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds {type(config).__name__}, not a JSON object")
    return config


def weights_file(directory: Path) -> Path:
    """The one weights file of a published head in `directory`."""
    if not directory.is_dir():
        raise ValueError(f"{directory} is not a directory")
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return directory / name
    sharded = [name for name in _SHARDED if (directory / name).is_file()]
    if sharded:
        raise ValueError(f"{directory} holds a sharded checkpoint ({sharded[0]}); draft heads are read from one file")
    raise ValueError(
        f"no draft head in {directory}: expected drafter.json (a specjax head) or one of {', '.join(WEIGHT_FILES)}"
    )


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file or torch pickle, by name, as numpy arrays."""
    if path.suffix == ".safetensors":
        return _read_safetensors(path)
    return _read_torch(path)


def tensor_names(path: Path) -> list[str]:
    """The tensor names of a weights file (a safetensors header only; a pickle is read whole)."""
    if path.suffix == ".safetensors":
        try:
            with safe_open(str(path), framework="numpy") as f:
                return sorted(f.keys())
        except (SafetensorError, OSError) as e:
            raise ValueError(f"cannot read {path}: not a valid safetensors file (corrupt or truncated?): {e}") from e
    return sorted(_read_torch(path))


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    out = {}
    try:
        with safe_open(str(path), framework="numpy") as f:
            names = list(f.keys())
            for name in names:
                if f.get_slice(name).get_dtype() != "BF16":
                    out[name] = f.get_tensor(name)
        if len(out) < len(names):  # numpy has no bfloat16: those through flax, as io/hf_weights reads them
            with safe_open(str(path), framework="flax") as f:
                for name in names:
                    if name not in out:
                        out[name] = np.asarray(f.get_tensor(name)).astype(np.float32)
    except (SafetensorError, OSError) as e:
        raise ValueError(f"cannot read {path}: not a valid safetensors file (corrupt or truncated?): {e}") from e
    return out


def _read_torch(path: Path) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError:
        raise ValueError(
            f"{path} is a torch pickle, which specjax reads only through torch.load(weights_only=True): "
            f"install torch (pip install torch), or convert the file to safetensors "
            f"(safetensors.torch.save_file(torch.load(path), 'model.safetensors'))"
        ) from None
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # an unpickling error names only what it found; say which file
        raise ValueError(
            f"cannot read {path} with torch.load(weights_only=True) (corrupt, or not a state dict?): {e}"
        ) from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path} does not hold a flat state dict of tensors")
    return {name: (t.float() if t.dtype == torch.bfloat16 else t).detach().cpu().numpy() for name, t in state.items()}


class HeadTensors:
    """Tensors by name, handed out shape-checked in the load dtype; remembers what was used."""

    def __init__(self, tensors: dict[str, np.ndarray], source: Path, dtype: str):
        self.tensors, self.source, self.dtype = tensors, source, jnp.dtype(dtype)
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.tensors

    def names(self) -> list[str]:
        return sorted(self.tensors)

    def raw(self, name: str, shape: tuple) -> np.ndarray:
        """The tensor as stored (integer buffers stay integers), checked to have `shape`."""
        if name not in self.tensors:
            raise ValueError(f"missing tensor {name!r} (expected shape {tuple(shape)}) in {self.source}")
        found = tuple(self.tensors[name].shape)
        if found != tuple(shape):
            raise ValueError(
                f"tensor {name!r} in {self.source} has shape {found}, but the head's config and the target "
                f"imply {tuple(shape)}"
            )
        self.used.add(name)
        return self.tensors[name]

    def get(self, name: str, shape: tuple):
        """The tensor as a jax array of the load dtype, checked to have `shape` (torch [out, in] layout)."""
        return jnp.asarray(self.raw(name, shape), self.dtype)

    def check_all_used(self) -> None:
        extra = [n for n in self.names() if n not in self.used and not n.endswith("rotary_emb.inv_freq")]
        if extra:
            shown = ", ".join(map(repr, extra[:8])) + (f" and {len(extra) - 8} more" if len(extra) > 8 else "")
            raise ValueError(f"unexpected tensors in {self.source}, which this head format does not use: {shown}")
