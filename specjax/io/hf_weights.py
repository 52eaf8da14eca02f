"""Weights between Hugging Face safetensors checkpoints and specjax params.

HF `nn.Linear` weights are [out, in] with heads flattened into `out`; specjax kernels are
[in, heads, d_head] (q, k, v) and [heads, d_head, out] (o), so every projection is
transposed and reshaped here. GPT-2's `Conv1D` is already [in, out] but fuses q, k, v
into one `c_attn` tensor, which is split. The readers and writers of each layout are
inverses of each other; the round-trip tests hold them to that.

Family layouts (HF name -> specjax param), beyond Llama's:
  Phi-3:      self_attn.qkv_proj [(H + 2 n_kv) d_head, D] -> q_proj, k_proj, v_proj (rows in
              that order); mlp.gate_up_proj [2F, D] -> gate_proj, up_proj (gate first).
  Qwen3, Gemma 3: self_attn.q_norm / k_norm [d_head] -> attn.q_norm / attn.k_norm.
  Gemma 2/3:  input_layernorm -> input_norm, pre_feedforward_layernorm -> post_attention_norm
              (the norm before the MLP, as in Llama), post_attention_layernorm -> attn_out_norm,
              post_feedforward_layernorm -> mlp_out_norm; norm weights as HF stores them (the
              norm scales by 1 + weight).
  Mixtral:    block_sparse_moe.gate [E, D] -> mlp.router [D, E]; experts.{e}.w1 / w3 / w2
              -> mlp.gate_proj / up_proj [E, D, F] and down_proj [E, F, D].
  Qwen3-MoE:  mlp.gate -> mlp.router; mlp.experts.{e}.gate_proj / up_proj / down_proj.
The MoE layouts are the per-expert tensors of the Hub checkpoints, which transformers 5
also writes (it fuses them only in memory).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from specjax.models import ModelConfig, init_params
from specjax.models.config import GEMMA_TYPES, MOE_TYPES, QK_NORM_TYPES

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# Buffers some checkpoints carry that hold no learned weights: rotary inverse frequencies
# and GPT-2's causal-mask buffers. Everything else a checkpoint holds must be used.
_HARMLESS = re.compile(r"(^|\.)(rotary_emb\.inv_freq|attn\.bias|attn\.masked_bias)$")

Getter = Callable[[str, tuple], jax.Array]


class CheckpointReader(contextlib.ExitStack):
    """Tensors of a single-file or sharded safetensors checkpoint, read by name on demand."""

    def __init__(self, directory: Path, dtype: str):
        super().__init__()
        self.directory = directory
        self.dtype = jnp.dtype(dtype)
        self.used: set[str] = set()
        self._handles: dict[Path, object] = {}
        self.files = self._weight_map()  # tensor name -> file holding it

    def _weight_map(self) -> dict[str, Path]:
        single, index = self.directory / SINGLE_FILE, self.directory / INDEX_FILE
        if single.is_file():
            return dict.fromkeys(self._open(single).keys(), single)
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{index} is not a valid safetensors index (no readable 'weight_map'): {e}") from e
            for shard in sorted(set(weight_map.values())):
                if not (self.directory / shard).is_file():
                    raise ValueError(f"{index} names shard {shard!r}, which is missing from {self.directory}")
            return {name: self.directory / shard for name, shard in weight_map.items()}
        others = sorted(p.name for p in self.directory.glob("*.bin")) + sorted(
            p.name for p in self.directory.glob("*.pt*")
        )
        hint = f" (found {', '.join(others)}: only safetensors checkpoints are read)" if others else ""
        raise ValueError(f"no weights in {self.directory}: expected {SINGLE_FILE} or {INDEX_FILE}{hint}")

    def _open(self, path: Path):
        if path not in self._handles:
            try:
                # "flax" rather than "numpy": numpy cannot represent bfloat16 checkpoints.
                self._handles[path] = self.enter_context(safe_open(str(path), framework="flax"))
            except (SafetensorError, OSError) as e:
                raise ValueError(
                    f"cannot read {path}: not a valid safetensors file (corrupt or truncated?): {e}"
                ) from e
        return self._handles[path]

    def has(self, name: str) -> bool:
        return name in self.files

    def get(self, name: str, shape: tuple) -> jax.Array:
        """The tensor `name`, checked to have HF-layout `shape`, cast to the load dtype."""
        if name not in self.files:
            raise ValueError(f"missing weight {name!r} (expected shape {shape}) in the checkpoint at {self.directory}")
        handle = self._open(self.files[name])
        try:
            found = tuple(handle.get_slice(name).get_shape())
            if found != tuple(shape):
                raise ValueError(
                    f"shape mismatch for weight {name!r} in {self.files[name]}: config.json implies {tuple(shape)}, "
                    f"the checkpoint has {found}"
                )
            tensor = handle.get_tensor(name)
        except SafetensorError as e:
            raise ValueError(f"cannot read {name!r} from {self.files[name]} (corrupt or truncated?): {e}") from e
        self.used.add(name)
        return jnp.asarray(tensor, self.dtype)

    def check_all_used(self, ignore: tuple[str, ...] = ()) -> None:
        extra = sorted(n for n in self.files if n not in self.used and n not in ignore and not _HARMLESS.search(n))
        if extra:
            shown = ", ".join(repr(n) for n in extra[:8]) + (f" and {len(extra) - 8} more" if len(extra) > 8 else "")
            raise ValueError(
                f"unexpected weights in the checkpoint at {self.directory}, unused by this config: {shown}"
            )


# Layout changes for one projection: HF [heads * d_head, D] <-> specjax [D, heads, d_head],
# and HF o_proj [D, heads * d_head] <-> specjax [heads, d_head, D].
def _split_heads_in(w, heads: int):
    return w.T.reshape(w.shape[1], heads, -1)


def _merge_heads_in(w):
    return w.reshape(w.shape[0], -1).T


def _split_heads_out(w, heads: int):
    return w.T.reshape(heads, -1, w.shape[0])


def _merge_heads_out(w):
    return w.reshape(-1, w.shape[-1]).T


def _layer_norms(cfg: ModelConfig) -> tuple[tuple[str, str], ...]:
    """(specjax norm, HF layernorm) of each block norm."""
    if cfg.model_type in GEMMA_TYPES:
        return (
            ("input_norm", "input_layernorm"),
            ("post_attention_norm", "pre_feedforward_layernorm"),
            ("attn_out_norm", "post_attention_layernorm"),
            ("mlp_out_norm", "post_feedforward_layernorm"),
        )
    return (("input_norm", "input_layernorm"), ("post_attention_norm", "post_attention_layernorm"))


def _moe_names(cfg: ModelConfig) -> tuple[str, str, dict[str, str]]:
    """(MoE module prefix, router name, specjax expert kernel -> HF expert weight name)."""
    if cfg.model_type == "mixtral":
        return "block_sparse_moe", "gate", {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    return "mlp", "gate", {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}


def _llama_from_hf(cfg: ModelConfig, get: Getter) -> dict:
    d, v = cfg.hidden_size, cfg.vocab_size
    params = {
        "embed": get("model.embed_tokens.weight", (v, d)),
        "final_norm": {"scale": get("model.norm.weight", (d,))},
    }
    if not cfg.tie_word_embeddings:
        params["lm_head"] = get("lm_head.weight", (v, d)).T
    params["layers"] = {}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        layer = {"attn": _attention_from_hf(cfg, get, f"{p}.self_attn"), "mlp": _mlp_from_hf(cfg, get, p)}
        for name, hf_name in _layer_norms(cfg):
            layer[name] = {"scale": get(f"{p}.{hf_name}.weight", (d,))}
        params["layers"][i] = layer
    return params


def _attention_from_hf(cfg: ModelConfig, get: Getter, p: str) -> dict:
    d, hd = cfg.hidden_size, cfg.resolved_head_dim
    h, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    if cfg.model_type == "phi3":
        qkv = get(f"{p}.qkv_proj.weight", ((h + 2 * kv) * hd, d))
        q, k, v = jnp.split(qkv, [h * hd, (h + kv) * hd])
    else:
        q = get(f"{p}.q_proj.weight", (h * hd, d))
        k = get(f"{p}.k_proj.weight", (kv * hd, d))
        v = get(f"{p}.v_proj.weight", (kv * hd, d))
    attn = {
        "q_proj": _split_heads_in(q, h),
        "k_proj": _split_heads_in(k, kv),
        "v_proj": _split_heads_in(v, kv),
        "o_proj": _split_heads_out(get(f"{p}.o_proj.weight", (d, h * hd)), h),
    }
    if cfg.attention_bias:
        attn["q_bias"] = get(f"{p}.q_proj.bias", (h * hd,)).reshape(h, hd)
        attn["k_bias"] = get(f"{p}.k_proj.bias", (kv * hd,)).reshape(kv, hd)
        attn["v_bias"] = get(f"{p}.v_proj.bias", (kv * hd,)).reshape(kv, hd)
    if cfg.o_proj_bias:
        attn["o_bias"] = get(f"{p}.o_proj.bias", (d,))
    if cfg.model_type in QK_NORM_TYPES:
        attn["q_norm"] = {"scale": get(f"{p}.q_norm.weight", (hd,))}
        attn["k_norm"] = {"scale": get(f"{p}.k_norm.weight", (hd,))}
    return attn


def _mlp_from_hf(cfg: ModelConfig, get: Getter, p: str) -> dict:
    d, f = cfg.hidden_size, cfg.intermediate_size
    if cfg.model_type in MOE_TYPES:
        module, router, names = _moe_names(cfg)
        e = cfg.num_experts
        mlp = {"router": get(f"{p}.{module}.{router}.weight", (e, d)).T}
        for name, hf_name in names.items():
            shape = (d, f) if name == "down_proj" else (f, d)
            mlp[name] = jnp.stack([get(f"{p}.{module}.experts.{x}.{hf_name}.weight", shape).T for x in range(e)])
        return mlp
    if cfg.model_type == "phi3":
        gate, up = jnp.split(get(f"{p}.mlp.gate_up_proj.weight", (2 * f, d)), 2)
        return {"gate_proj": gate.T, "up_proj": up.T, "down_proj": get(f"{p}.mlp.down_proj.weight", (d, f)).T}
    mlp = {
        "gate_proj": get(f"{p}.mlp.gate_proj.weight", (f, d)).T,
        "up_proj": get(f"{p}.mlp.up_proj.weight", (f, d)).T,
        "down_proj": get(f"{p}.mlp.down_proj.weight", (d, f)).T,
    }
    if cfg.mlp_bias:
        mlp["gate_bias"] = get(f"{p}.mlp.gate_proj.bias", (f,))
        mlp["up_bias"] = get(f"{p}.mlp.up_proj.bias", (f,))
        mlp["down_bias"] = get(f"{p}.mlp.down_proj.bias", (d,))
    return mlp


def _llama_to_hf(cfg: ModelConfig, params: dict) -> dict:
    out = {"model.embed_tokens.weight": params["embed"], "model.norm.weight": params["final_norm"]["scale"]}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = params["lm_head"].T
    for i, layer in params["layers"].items():
        p = f"model.layers.{i}"
        out |= _attention_to_hf(cfg, layer["attn"], f"{p}.self_attn")
        out |= _mlp_to_hf(cfg, layer["mlp"], p)
        for name, hf_name in _layer_norms(cfg):
            out[f"{p}.{hf_name}.weight"] = layer[name]["scale"]
    return out


def _attention_to_hf(cfg: ModelConfig, attn: dict, p: str) -> dict:
    out = {}
    if cfg.model_type == "phi3":
        out[f"{p}.qkv_proj.weight"] = jnp.concatenate([_merge_heads_in(attn[f"{n}_proj"]) for n in "qkv"])
    else:
        for name in "qkv":
            out[f"{p}.{name}_proj.weight"] = _merge_heads_in(attn[f"{name}_proj"])
    # HF Llama's attention_bias covers q, k, v and o together; a specjax Llama with only
    # some of them is written with zeros for the others, which computes the same function.
    all_four = cfg.model_type == "llama" and (cfg.attention_bias or cfg.o_proj_bias)
    if cfg.attention_bias or all_four:
        for name in "qkv":
            kernel = attn[f"{name}_proj"]
            bias = attn.get(f"{name}_bias", jnp.zeros(kernel.shape[1:], kernel.dtype))
            out[f"{p}.{name}_proj.bias"] = bias.reshape(-1)
    out[f"{p}.o_proj.weight"] = _merge_heads_out(attn["o_proj"])
    if cfg.o_proj_bias or all_four:
        out[f"{p}.o_proj.bias"] = attn.get("o_bias", jnp.zeros(cfg.hidden_size, attn["o_proj"].dtype))
    if cfg.model_type in QK_NORM_TYPES:
        out[f"{p}.q_norm.weight"] = attn["q_norm"]["scale"]
        out[f"{p}.k_norm.weight"] = attn["k_norm"]["scale"]
    return out


def _mlp_to_hf(cfg: ModelConfig, mlp: dict, p: str) -> dict:
    if cfg.model_type in MOE_TYPES:
        module, router, names = _moe_names(cfg)
        out = {f"{p}.{module}.{router}.weight": mlp["router"].T}
        for name, hf_name in names.items():
            for x in range(cfg.num_experts):
                out[f"{p}.{module}.experts.{x}.{hf_name}.weight"] = mlp[name][x].T
        return out
    if cfg.model_type == "phi3":
        return {
            f"{p}.mlp.gate_up_proj.weight": jnp.concatenate([mlp["gate_proj"].T, mlp["up_proj"].T]),
            f"{p}.mlp.down_proj.weight": mlp["down_proj"].T,
        }
    out = {}
    for name in ("gate", "up", "down"):
        out[f"{p}.mlp.{name}_proj.weight"] = mlp[f"{name}_proj"].T
        if cfg.mlp_bias:
            out[f"{p}.mlp.{name}_proj.bias"] = mlp[f"{name}_bias"]
    return out


def _gpt2_prefix(has: Callable[[str], bool]) -> str:
    # Checkpoints saved from GPT2LMHeadModel say "transformer.h.0..."; the original OpenAI
    # conversions (saved from GPT2Model) say "h.0...".
    return "transformer." if has("transformer.wte.weight") or not has("wte.weight") else ""


def _gpt2_from_hf(cfg: ModelConfig, get: Getter, prefix: str) -> dict:
    d, f, v, h = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_attention_heads
    params = {
        "embed": get(f"{prefix}wte.weight", (v, d)),
        "position_embed": get(f"{prefix}wpe.weight", (cfg.max_position_embeddings, d)),
        "final_norm": {"scale": get(f"{prefix}ln_f.weight", (d,)), "bias": get(f"{prefix}ln_f.bias", (d,))},
        "layers": {},
    }
    if not cfg.tie_word_embeddings:
        params["lm_head"] = get("lm_head.weight", (v, d)).T
    for i in range(cfg.num_hidden_layers):
        p = f"{prefix}h.{i}"
        qkv = jnp.split(get(f"{p}.attn.c_attn.weight", (d, 3 * d)), 3, axis=1)  # 3 x [D, D], Conv1D is [in, out]
        qkv_bias = jnp.split(get(f"{p}.attn.c_attn.bias", (3 * d,)), 3)
        attn = {f"{n}_proj": w.reshape(d, h, -1) for n, w in zip("qkv", qkv, strict=True)}
        attn |= {f"{n}_bias": b.reshape(h, -1) for n, b in zip("qkv", qkv_bias, strict=True)}
        attn["o_proj"] = get(f"{p}.attn.c_proj.weight", (d, d)).reshape(h, -1, d)
        attn["o_bias"] = get(f"{p}.attn.c_proj.bias", (d,))
        params["layers"][i] = {
            "attn": attn,
            "mlp": {
                "up_proj": get(f"{p}.mlp.c_fc.weight", (d, f)),
                "up_bias": get(f"{p}.mlp.c_fc.bias", (f,)),
                "down_proj": get(f"{p}.mlp.c_proj.weight", (f, d)),
                "down_bias": get(f"{p}.mlp.c_proj.bias", (d,)),
            },
            "input_norm": {"scale": get(f"{p}.ln_1.weight", (d,)), "bias": get(f"{p}.ln_1.bias", (d,))},
            "post_attention_norm": {"scale": get(f"{p}.ln_2.weight", (d,)), "bias": get(f"{p}.ln_2.bias", (d,))},
        }
    return params


def _gpt2_to_hf(cfg: ModelConfig, params: dict) -> dict:
    t = "transformer"
    out = {
        f"{t}.wte.weight": params["embed"],
        f"{t}.wpe.weight": params["position_embed"],
        f"{t}.ln_f.weight": params["final_norm"]["scale"],
        f"{t}.ln_f.bias": params["final_norm"]["bias"],
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = params["lm_head"].T
    d = cfg.hidden_size
    for i, layer in params["layers"].items():
        p, attn, mlp = f"{t}.h.{i}", layer["attn"], layer["mlp"]
        out[f"{p}.attn.c_attn.weight"] = jnp.concatenate([attn[f"{n}_proj"].reshape(d, d) for n in "qkv"], axis=1)
        out[f"{p}.attn.c_attn.bias"] = jnp.concatenate([attn[f"{n}_bias"].reshape(d) for n in "qkv"])
        out[f"{p}.attn.c_proj.weight"] = attn["o_proj"].reshape(d, d)
        out[f"{p}.attn.c_proj.bias"] = attn["o_bias"]
        out[f"{p}.mlp.c_fc.weight"] = mlp["up_proj"]
        out[f"{p}.mlp.c_fc.bias"] = mlp["up_bias"]
        out[f"{p}.mlp.c_proj.weight"] = mlp["down_proj"]
        out[f"{p}.mlp.c_proj.bias"] = mlp["down_bias"]
        for norm, hf_norm in (("input_norm", "ln_1"), ("post_attention_norm", "ln_2")):
            out[f"{p}.{hf_norm}.weight"] = layer[norm]["scale"]
            out[f"{p}.{hf_norm}.bias"] = layer[norm]["bias"]
    return out


def params_from_hf(cfg: ModelConfig, get: Getter) -> dict:
    """Params for a Llama-family `cfg` from `get(hf_name, hf_shape)`, whatever holds the
    tensors (a safetensors checkpoint here, a GGUF file in specjax/io/gguf_file.py)."""
    return _llama_from_hf(cfg, get)


def read_params(directory: Path, cfg: ModelConfig) -> dict:
    """Params for `cfg` from the safetensors checkpoint in `directory`, in `cfg.dtype`."""
    with CheckpointReader(directory, cfg.dtype) as reader:
        if cfg.model_type == "gpt2":
            params = _gpt2_from_hf(cfg, reader.get, _gpt2_prefix(reader.has))
        else:
            params = _llama_from_hf(cfg, reader.get)
        # A tied checkpoint may still carry a copy of the embedding as lm_head.
        reader.check_all_used(ignore=("lm_head.weight",) if cfg.tie_word_embeddings else ())
    check_layout(cfg, params)
    return params


def write_params(path: Path, cfg: ModelConfig, params: dict) -> None:
    """Write `params` as one HF-layout safetensors file at `path`."""
    check_layout(cfg, params)
    tensors = (_gpt2_to_hf if cfg.model_type == "gpt2" else _llama_to_hf)(cfg, params)
    arrays = {name: np.ascontiguousarray(np.asarray(x)) for name, x in tensors.items()}
    # transformers refuses safetensors files whose metadata does not name a format.
    save_file(arrays, str(path), metadata={"format": "pt"})


def check_layout(cfg: ModelConfig, params: dict) -> None:
    """Params must have exactly the tree and shapes the model of `cfg` merges with."""
    expected = jax.eval_shape(lambda: init_params(cfg))
    if jax.tree.structure(params) != jax.tree.structure(expected):
        raise ValueError(f"params do not have the layout of a {cfg.model_type} model with this config")
    for (path, x), want in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(expected), strict=True):
        if tuple(x.shape) != tuple(want.shape):
            raise ValueError(
                f"param {jax.tree_util.keystr(path)} has shape {tuple(x.shape)}, config implies {want.shape}"
            )
