"""Loading a checkpoint straight onto a mesh: each process reads only its devices' slices.

`read_sharded_params` runs the same HF -> specjax layout conversion as
specjax/io/hf_weights.py, but with a getter that returns `_Lazy` tensors: a safetensors
name plus the transpose and reshape the conversion applies. Each param then becomes
`jax.make_array_from_callback(shape, sharding, read)`, and JAX calls `read(index)` once
per *addressable* device with the index that device holds; the index is mapped back
through the reshape and transpose to a slice of the stored tensor, which safetensors reads
alone (`safe_open(...).get_slice(name)[...]`, a memory-mapped read of those bytes). A
process therefore never holds more than its own devices' shards, so a model larger than
one host's memory loads across hosts.

Llama-family layouts (Llama, Qwen2/3, Mistral, Gemma 2/3) are read by slices. Fused or
stacked layouts (Phi-3's qkv_proj, GPT-2's c_attn, MoE experts) are read tensor by tensor
and then split onto the mesh: correct, but each process holds one whole tensor at a time.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from specjax.io import hf_weights
from specjax.models import ModelConfig, init_params
from specjax.models.config import MOE_TYPES
from specjax.parallel.layout import Plan, expand_kv_heads, param_shardings, plan, sharded_config
from specjax.parallel.mesh import mesh_shape

# (tensor name, shape of the slice read) of every read since the last `reset_reads()`:
# what the tests check to know that devices read their slices, not whole tensors.
READS: list[tuple[str, tuple[int, ...]]] = []
_KV_NAMES = ("k_proj", "v_proj", "k_bias", "v_bias")
_SLICED_TYPES = ("llama", "qwen2", "mistral", "qwen3", "gemma2", "gemma3_text")


def reset_reads() -> None:
    READS.clear()


class _Lazy:
    """A stored tensor [hf_shape], optionally transposed (2-D), then reshaped by splitting dims."""

    def __init__(self, handle, name: str, hf_shape: tuple, dtype, transposed: bool = False, shape=None):
        self.handle, self.name, self.hf_shape, self.dtype = handle, name, tuple(hf_shape), dtype
        self.transposed = transposed
        self.shape = tuple(shape) if shape is not None else self._base_shape()
        self.ndim = len(self.shape)

    def _base_shape(self) -> tuple:
        return self.hf_shape[::-1] if self.transposed else self.hf_shape

    @property
    def T(self) -> _Lazy:
        if self.shape != self._base_shape() or len(self.hf_shape) != 2:
            raise TypeError("_Lazy supports .T only on an unreshaped 2-D tensor")
        return _Lazy(self.handle, self.name, self.hf_shape, self.dtype, not self.transposed)

    def reshape(self, *shape) -> _Lazy:
        shape = list(shape[0] if len(shape) == 1 and isinstance(shape[0], tuple | list) else shape)
        if -1 in shape:
            known = math.prod(d for d in shape if d != -1)
            shape[shape.index(-1)] = math.prod(self.shape) // known
        return _Lazy(self.handle, self.name, self.hf_shape, self.dtype, self.transposed, shape)

    def _groups(self) -> list[list[int]] | None:
        """Final dims grouped by the base dim they split (None if the reshape merges dims)."""
        groups, i = [], 0
        for base in self._base_shape():
            group, size = [], 1
            while size < base or (not group and i < len(self.shape)):
                if i >= len(self.shape):
                    return None
                group.append(i)
                size *= self.shape[i]
                i += 1
            if size != base:
                return None
            groups.append(group)
        return groups if i == len(self.shape) else None

    def read(self, index: tuple) -> jax.Array:
        """The slice `index` (a tuple of slices of `shape`) of this tensor, reading only that slice when it can."""
        bounds = [s.indices(d)[:2] for s, d in zip(index, self.shape, strict=True)]
        base_slices = self._base_slices(bounds)
        if base_slices is None:  # a slice the stored layout cannot express: read whole, then slice
            whole = self.handle.get_slice(self.name)[:]
            READS.append((self.name, tuple(whole.shape)))
            x = (whole.T if self.transposed else whole).reshape(self.shape)
            return jnp.asarray(x[tuple(slice(a, b) for a, b in bounds)], self.dtype)
        hf_slices = base_slices[::-1] if self.transposed else base_slices
        x = self.handle.get_slice(self.name)[tuple(hf_slices)]
        READS.append((self.name, tuple(x.shape)))
        if self.transposed:
            x = x.T
        return jnp.asarray(x.reshape([b - a for a, b in bounds]), self.dtype)

    def _base_slices(self, bounds) -> list[slice] | None:
        groups = self._groups()
        if groups is None:
            return None
        out = []
        for group in groups:
            inner = math.prod(self.shape[i] for i in group[1:])
            if any(bounds[i] != (0, self.shape[i]) for i in group[1:]):
                return None  # only the outermost dim of a split may be partial
            a, b = bounds[group[0]]
            out.append(slice(a * inner, b * inner))
        return out


def _lazy_getter(reader: hf_weights.CheckpointReader):
    def get(name: str, shape: tuple) -> _Lazy:
        if name not in reader.files:
            raise ValueError(
                f"missing weight {name!r} (expected shape {shape}) in the checkpoint at {reader.directory}"
            )
        handle = reader._open(reader.files[name])
        found = tuple(handle.get_slice(name).get_shape())
        if found != tuple(shape):
            raise ValueError(
                f"shape mismatch for weight {name!r} in {reader.files[name]}: config.json implies {tuple(shape)}, "
                f"the checkpoint has {found}"
            )
        reader.used.add(name)
        return _Lazy(handle, name, found, reader.dtype)

    return get


def _repeated_read(lazy: _Lazy, axis: int, repeat: int):
    """A reader for `lazy` with every index along `axis` repeated `repeat` times (GQA kv heads)."""

    def read(index):
        lo, hi = index[axis].indices(lazy.shape[axis] * repeat)[:2]
        first = lo // repeat
        source = list(index)
        source[axis] = slice(first, (hi - 1) // repeat + 1)
        x = jnp.repeat(lazy.read(tuple(source)), repeat, axis=axis)
        take = [slice(None)] * x.ndim
        take[axis] = slice(lo - first * repeat, lo - first * repeat + hi - lo)
        return x[tuple(take)]

    return read


def _place(lazy_params, mesh: Mesh, p: Plan):
    """Global arrays from the lazy tree: each addressable device reads its own slice."""
    expanded_shapes = jax.eval_shape(lambda t: expand_kv_heads(t, p.kv_repeat), _shapes(lazy_params))
    shardings = param_shardings(expanded_shapes, mesh, p)

    def build(path, lazy, shape, sharding):
        keys = tuple(str(getattr(k, "key", k)) for k in path)
        read = lazy.read
        if (
            p.kv_repeat > 1
            and len(keys) > 1
            and keys[-2] == "attn"
            and keys[-1] in ("k_proj", "v_proj", "k_bias", "v_bias")
        ):
            read = _repeated_read(lazy, 1 if keys[-1].endswith("proj") else 0, p.kv_repeat)
        return jax.make_array_from_callback(shape.shape, sharding, read)

    return jax.tree_util.tree_map_with_path(build, lazy_params, expanded_shapes, shardings)


def _shapes(lazy_params):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), lazy_params)


def read_sharded_params(directory: Path, cfg: ModelConfig, mesh: Mesh) -> tuple[ModelConfig, dict]:
    """(config with replicated kv heads if any, params on `mesh`) from a safetensors checkpoint."""
    p = plan(cfg, mesh_shape(mesh)[1])
    if cfg.model_type not in _SLICED_TYPES or cfg.model_type in MOE_TYPES:
        params = expand_kv_heads(hf_weights.read_params(directory, cfg), p.kv_repeat)
        return sharded_config(cfg, p), jax.device_put(params, param_shardings(params, mesh, p))
    with hf_weights.CheckpointReader(directory, cfg.dtype) as reader:
        lazy = hf_weights._llama_from_hf(cfg, _lazy_getter(reader))
        reader.check_all_used(ignore=("lm_head.weight",) if cfg.tie_word_embeddings else ())
        expected = jax.eval_shape(lambda: init_params(cfg))
        if jax.tree.structure(_shapes(lazy)) != jax.tree.structure(expected):
            raise ValueError(f"the checkpoint in {directory} does not have the layout of a {cfg.model_type} model")
        params = _place(lazy, mesh, p)
    return sharded_config(cfg, p), params


def init_sharded_params(cfg: ModelConfig, seed: int, mesh: Mesh) -> tuple[ModelConfig, dict]:
    """Random params initialised in place on `mesh`: each device computes only its shards.

    The values equal `init_params(cfg, seed)` (then kv heads repeated as the plan says).
    """
    p = plan(cfg, mesh_shape(mesh)[1])

    def init():
        return expand_kv_heads(init_params(cfg, seed), p.kv_repeat)

    shardings = param_shardings(jax.eval_shape(init), mesh, p)
    return sharded_config(cfg, p), jax.jit(init, out_shardings=shardings)()
