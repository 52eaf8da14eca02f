"""Heads written in the layouts others publish, so that vLLM, SGLang and the reference code serve them.

  eagle        config.json (a one-layer Llama config, `bias`, the head's own rope) + model.safetensors:
               embed_tokens.weight [V, D] (a copy of the target's, which EAGLE's files carry),
               fc.weight [D, 2D] (+ fc.bias [D]), layers.0.{self_attn,mlp,post_attention_layernorm}.*
  eagle3       config.json (+ draft_vocab_size, eagle_aux_hidden_state_layer_ids) + model.safetensors:
               fc.weight [D, 3D], midlayer.*, norm.weight, lm_head.weight [Vd, D], d2t [Vd], t2d [V]
  speculators  config.json (speculators_model_type, speculators_version, speculators_config,
               transformer_layer_config) +
               model.safetensors: EAGLE-3's tensors with the layer at layers.0.* (speculators'
               Eagle3Speculator), or EAGLE-1's as fusion_fc.* / transformer.* (its EagleSpeculator)
  medusa       config.json (medusa_num_heads, medusa_num_layers) + medusa_lm_head.safetensors:
               {h}.{l}.linear.{weight,bias} [D, D], [D] and Medusa-1's LM heads {h}.{L}.weight [V, D]
  dflash       a DFlash block head (BlockHead with Qwen3 layers): drafters/formats/block_published.py,
               which also writes a block head's "speculators" (speculators_model_type "dflash")

Every config names the target as engines resolve it: its Hugging Face repo id where the target's
loader knew one (Model.hf_repo: config.json's `_name_or_path`, a GGUF file's source metadata or the
packaged model's), else the name given; and `torch_dtype` is the dtype the tensors are stored in.

Tensors are in torch [out, in] layout with the names drafters/formats/published.py reads (the same
table, the other way round). Only a head whose network *is* the published one is written:
HeadOptions and the layer config must match it. Anything else (specjax's own EAGLE head, its
multi-layer head with a `reduce` matrix) computes another function, so relabelling its weights
would change its proposals; that is a ValueError naming each difference, not a silent change.

EAGLE-3's layers are written as `eagle_aux_hidden_state_layer_ids` in vLLM's convention (id i =
transformers' hidden_states[i] = the output of specjax block i - 1), except when they are the
reference's default for the target given (HF 2, L//2, L-3): then the key is left out, because
every engine reads the default alike while SGLang reads explicit ids one layer higher than vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import save_file

from specjax.drafters.base import Drafter
from specjax.drafters.block_head import BlockHead
from specjax.drafters.eagle import Eagle
from specjax.drafters.formats.block_published import block_files
from specjax.drafters.formats.files import WEIGHT_FILES
from specjax.drafters.medusa import Medusa
from specjax.io.hf_config import _ARCHITECTURE_OF
from specjax.io.hf_weights import _merge_heads_in, _merge_heads_out, _mlp_to_hf
from specjax.io.model import Model
from specjax.models import ModelConfig

FORMATS = ("specjax", "eagle", "eagle3", "speculators", "medusa", "dflash")
_NAMES = {"eagle": "EAGLE-1/2", "eagle3": "EAGLE-3", "speculators": "speculators", "medusa": "Medusa"}
_NETWORKS = {"eagle": ("eagle",), "eagle3": ("eagle3",), "speculators": ("eagle3", "eagle")}  # what each holds
_SPECULATIVE_TOKENS = 3  # speculators_config's proposal length (what speculators' converter writes)
# The speculators release whose config layout this writer follows (speculators v0.3.0: Eagle3Speculator
# with draft_vocab_size, norm_before_residual, eagle_aux_hidden_state_layer_ids beside a
# transformer_layer_config; EagleSpeculator with fusion_bias, layernorms). speculators writes its
# package version in every config (SpeculatorModelConfig.speculators_version).
SPECULATORS_VERSION = "0.3.0"


def write_published(drafter: Drafter, path, format: str, target_name=None, target=None) -> Path:
    """Write `drafter` to the directory `path` in a published `format` (module docstring)."""
    if format not in FORMATS[1:]:
        raise ValueError(f"unknown head format {format!r}; supported: {', '.join(FORMATS)}")
    target_config = target.config if isinstance(target, Model) else target
    if target_config is not None:
        drafter.check(target_config, 1)  # a head for another target: the engine's own error
    params = jax.tree.map(lambda x: np.asarray(jax.device_get(x)), drafter.params)
    # What engines resolve: the target's HF repo id where its loader knew it, else the name given.
    target_name = (target.hf_repo if isinstance(target, Model) else None) or target_name
    if isinstance(drafter, BlockHead):  # DFlash-style heads: drafters/formats/block_published.py
        config, tensors = block_files(drafter, params, format, target_name, target)
        _set_dtype(config, tensors)
    elif isinstance(drafter, Medusa):
        if format != "medusa":
            raise ValueError(f"format={format!r} writes EAGLE heads; these are Medusa heads: use format='medusa'")
        config, tensors = _medusa(drafter, params, target_name, target_config), _medusa_tensors(params)
    elif format == "medusa":
        raise ValueError("format='medusa' writes Medusa heads; this is an EAGLE head (eagle, eagle3 or speculators)")
    elif format == "dflash":
        raise ValueError(
            "format='dflash' writes DFlash block heads; this is an EAGLE head (eagle, eagle3 or speculators)"
        )
    else:
        network = _network(drafter, format)
        config, tensors = _eagle_files(drafter, params, network, format, target_name, target, target_config)
        _set_dtype(config, tensors)
    path = Path(path)
    name = "medusa_lm_head.safetensors" if format == "medusa" else "model.safetensors"
    _check_directory(path, name)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    save_file(arrays, str(path / name), metadata={"format": "pt"})  # transformers refuses files without it
    return path


def _check_directory(path: Path, name: str) -> None:
    """A head directory holds one head: another's files beside ours would be read instead of them."""
    others = [n for n in ("drafter.json", *WEIGHT_FILES) if n != name and (path / n).exists()]
    if others:
        raise ValueError(f"{path} already holds {', '.join(others)} of another head; write to a new directory")


# --- Which published network a head is ------------------------------------------------------


def _differences(drafter: Eagle, network: str) -> list[str]:
    """What keeps `drafter` from being the published `network` ("eagle" or "eagle3"), in words."""
    o, c, out = drafter.options, drafter.config, []
    if "reduce" in drafter.params:  # what sets it apart from either network; the rest follows from it
        return [
            "it is specjax's own multi-layer head (each target state RMS-normalised, a `reduce` matrix, then fc "
            "over [embed, g], a standard layer and the target's LM head), not the published EAGLE-3 network "
            "(fc over the raw states, 2D-wide attention over [input_norm(embed), hidden_norm(g)], its own norm "
            "and LM head)"
        ]
    if c.mlp_bias or c.o_proj_bias or (c.attention_bias and network == "eagle3"):
        out.append("its layer has biases (on the MLP, o_proj, or q/k/v) that the published layer lacks")
    if network == "eagle":
        if o.eagle3 or drafter.feature_layers:
            out.append(f"it reads target layers {list(drafter.feature_layers)} (an EAGLE-3-style head)")
        if o.input_norm:
            out.append("its layer normalises its input (input_norm=True), EAGLE-1's layer 0 does not")
        if o.final_norm:
            out.append("it applies a final norm before the LM head (final_norm=True), EAGLE-1 none")
        if o.draft_vocab_size:
            out.append("it has its own LM head over a draft vocabulary, EAGLE-1 the target's")
    else:
        if not o.eagle3:
            out.append("its layer is a standard one (eagle3=False), not EAGLE-3's 2D-wide attention")
        if len(drafter.feature_layers) != 3:
            out.append(f"it reads {len(drafter.feature_layers)} target layers, EAGLE-3's fc reads 3")
        if not o.final_norm or o.feed_normed:
            out.append(
                "EAGLE-3 applies its own final norm and feeds the layer's un-normed output to later steps "
                f"(final_norm=True, feed_normed=False, where this head has {o.final_norm}, {o.feed_normed})"
            )
        if not o.draft_vocab_size:
            out.append("it uses the target's LM head, EAGLE-3 its own (draft_vocab_size > 0)")
        if o.fc_bias:
            out.append("its fc has a bias, EAGLE-3's (SafeAILab, vLLM, speculators) none")
    if not o.hide_first:
        out.append(
            "it attends to specjax's extra position-0 entry (token 0 with a zero feature, hide_first=False), "
            "which the published heads never feed"
        )
    return out


def _network(drafter: Eagle, format: str) -> str:
    """ "eagle" or "eagle3": the published network `drafter` is, one `format` holds; else a ValueError."""
    found = {network: _differences(drafter, network) for network in ("eagle3", "eagle")}
    for network in _NETWORKS[format]:
        if not found[network]:
            return network
    closest = "eagle3" if drafter.options.eagle3 or drafter.feature_layers else "eagle"
    closest = closest if closest in _NETWORKS[format] else _NETWORKS[format][0]
    fits = [f for f, networks in _NETWORKS.items() if f != format and any(not found[n] for n in networks)]
    alternatives = " or ".join(f"format={f!r}" for f in ["specjax", *fits])
    raise ValueError(
        f"this head cannot be saved as {_NAMES[format]} (format={format!r}): {'; '.join(found[closest])}. "
        f"It computes another function than the published network, so relabelling its weights would change "
        f"its proposals; save it with {alternatives}"
    )


# --- EAGLE-1/2, EAGLE-3, speculators --------------------------------------------------------


def _eagle_files(drafter: Eagle, params, network, format, target_name, target, target_config):
    """(config.json dict, tensors by name) of an EAGLE head in `format`."""
    head = drafter.config
    layer = _layer_json(head)
    ((_, weights),) = params["layers"].items()  # the one layer: keyed 0 in memory, "0" once loaded
    if network == "eagle":
        fc_name, prefix = ("fusion_fc", "transformer") if format == "speculators" else ("fc", "layers.0")
        qkv_bias = bool(head.attention_bias)
        if qkv_bias and format == "speculators":
            raise ValueError("speculators' EAGLE layer config cannot express q/k/v biases only: use format='eagle'")
        tensors = {f"{fc_name}.weight": params["fc"].T}  # [D, 2D]: [embed; f] columns
        if drafter.options.fc_bias:
            tensors[f"{fc_name}.bias"] = params["fc_bias"]  # [D]
        tensors |= _layer_tensors(head, weights, prefix, qkv_bias, input_norm=False)
        if format == "speculators":
            fusion_bias = drafter.options.fc_bias
            return _speculators_json("eagle", layer, target_name, target_config, fusion_bias=fusion_bias), tensors
        if not isinstance(target, Model):
            raise ValueError(
                "EAGLE-1 checkpoints carry a copy of the target's embedding (embed_tokens.weight; eagle-llm loads "
                "them strictly): pass target=<the target Model> to save_drafter"
            )
        tensors["embed_tokens.weight"] = np.asarray(jax.device_get(target.params["embed"]))  # [V, D]
        return {**layer, "bias": bool(drafter.options.fc_bias), **({"qkv_bias": True} if qkv_bias else {})}, tensors
    prefix = "layers.0" if format == "speculators" else "midlayer"
    tensors = {"fc.weight": params["fc"].T}  # [D, 3D]: fc [3D, D] over the raw target states
    tensors |= _layer_tensors(head, weights, prefix, False, input_norm=True)
    tensors[f"{prefix}.hidden_norm.weight"] = params["hidden_norm"]["scale"]  # [D]
    tensors["norm.weight"] = params["final_norm"]["scale"]  # [D]
    tensors["lm_head.weight"] = params["lm_head"].T  # [Vd, D]
    vocab, draft_vocab = head.vocab_size, drafter.options.draft_vocab_size
    if "d2t" in params or draft_vocab < vocab:  # the reference omits both for a full-vocabulary head
        d2t = np.asarray(params.get("d2t", np.zeros(draft_vocab)), np.int64)  # [Vd]: target id = i + d2t[i]
        t2d = np.zeros(vocab, bool)  # [V]
        t2d[np.arange(draft_vocab) + d2t] = True
        tensors |= {"d2t": d2t, "t2d": t2d}
    extra = {"draft_vocab_size": draft_vocab} | _aux_ids(drafter.feature_layers, target_config)
    if format == "speculators":
        return _speculators_json("eagle3", layer, target_name, target_config, **extra), tensors
    return {**layer, **extra}, tensors


def _layer_tensors(head: ModelConfig, layer: dict, prefix: str, qkv_bias: bool, input_norm: bool) -> dict:
    """One decoder layer's tensors in HF names; q/k/v [H·hd, D] (EAGLE-3's: [H·hd, 2D])."""
    attn, p = layer["attn"], f"{prefix}.self_attn"
    out = {f"{p}.{n}_proj.weight": _merge_heads_in(attn[f"{n}_proj"]) for n in "qkv"}  # [.., D, heads, hd] -> torch
    if qkv_bias:  # EAGLE-1's Qwen2 heads: q, k and v only
        out |= {f"{p}.{n}_proj.bias": attn[f"{n}_bias"].reshape(-1) for n in "qkv"}
    out[f"{p}.o_proj.weight"] = _merge_heads_out(attn["o_proj"])  # [D, H·hd]
    out |= _mlp_to_hf(head, layer["mlp"], prefix)
    if input_norm:
        out[f"{prefix}.input_layernorm.weight"] = layer["input_norm"]["scale"]
    out[f"{prefix}.post_attention_layernorm.weight"] = layer["post_attention_norm"]["scale"]
    return out


def _layer_json(head: ModelConfig) -> dict:
    """The head's one-layer Llama config as published heads write it: rope_theta and rope_scaling
    at the top level (transformers 4 and 5 both read them; EAGLE's own config class only these)."""
    scaling = dict(head.rope_scaling) if head.rope_scaling else None
    if scaling is not None:
        scaling["type"] = scaling["rope_type"]  # eagle-llm reads rope_scaling["type"]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": head.vocab_size,
        "hidden_size": head.hidden_size,
        "intermediate_size": head.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": head.num_attention_heads,
        "num_key_value_heads": head.num_key_value_heads,
        "head_dim": head.resolved_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": head.max_position_embeddings,
        "rms_norm_eps": head.rms_norm_eps,
        "rope_theta": head.rope_theta,
        "rope_scaling": scaling,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": head.dtype,  # replaced by the stored dtype (_set_dtype)
    }


def _set_dtype(config: dict, tensors: dict) -> None:
    """Record the dtype the floating tensors are *stored* in (bfloat16 after `--dtype bfloat16`),
    not the head's compute dtype: transformers and vLLM read torch_dtype as the checkpoint's. The
    layer's config and, for speculators (a transformers config itself), the top level."""
    sizes: dict[str, int] = {}
    for array in tensors.values():
        if np.issubdtype(array.dtype, np.floating) or array.dtype.name == "bfloat16":
            sizes[array.dtype.name] = sizes.get(array.dtype.name, 0) + array.size
    stored = max(sizes, key=sizes.get)  # one dtype in practice (cast_floating casts every tensor)
    if "transformer_layer_config" in config:
        config["transformer_layer_config"]["torch_dtype"] = stored
    config["torch_dtype"] = stored


def _aux_ids(layers: tuple[int, ...], target: ModelConfig | None) -> dict:
    """{"eagle_aux_hidden_state_layer_ids": [...]} in vLLM's convention, or {} for the default (module docstring)."""
    if target is not None:
        n = target.num_hidden_layers
        if tuple(layers) == (1, n // 2 - 1, n - 4):
            return {}
    return {"eagle_aux_hidden_state_layer_ids": [int(i) + 1 for i in layers]}


def _speculators_json(kind: str, layer: dict, target_name, target: ModelConfig | None, **fields) -> dict:
    """A speculators config.json: what vLLM's speculators reader checks (speculators_config's
    proposal_methods[0].speculative_tokens and verifier.name_or_path, transformer_layer_config)."""
    architecture = _ARCHITECTURE_OF.get(target.model_type) if target is not None else None
    verifier = {"name_or_path": target_name, "architectures": [architecture] if architecture else []}
    layer = {k: v for k, v in layer.items() if k != "architectures"}
    if kind == "eagle":
        head = {
            "architectures": ["EagleSpeculator"],
            "speculators_model_type": "eagle",
            "transformer_layer_architecture": "LlamaDecoderLayer",
            "layernorms": False,
            "fusion_bias": bool(fields["fusion_bias"]),
        }
    else:
        # norm_before_residual: vLLM's speculators reader defaults it to true, so it is written.
        head = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", **fields}
        head["norm_before_residual"] = False
    proposal = {"proposal_type": "greedy", "speculative_tokens": _SPECULATIVE_TOKENS}
    return {
        **head,
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": kind,
            "proposal_methods": [proposal],
            "default_proposal_method": "greedy",
            "verifier": verifier,
        },
    }


# --- Medusa ---------------------------------------------------------------------------------


def _medusa(drafter: Medusa, params, target_name, target: ModelConfig | None) -> dict:
    w = params["w"]  # [H, D, D] or [H, L, D, D]
    if w.ndim == 4 and w.shape[1] > 1:
        tied = all(np.array_equal(params[k][:, 0], params[k][:, i]) for k in ("w", "b") for i in range(1, w.shape[1]))
        if not tied:
            raise ValueError(
                f"these Medusa heads have {w.shape[1]} different residual blocks per head; FasterDecoding's Medusa "
                "repeats one block object (the blocks of a head share their weights), so it cannot hold them: save "
                "them with format='specjax'"
            )
    vocab = drafter.vocab_size or (target.vocab_size if target is not None else None)
    if "lm_head" in params:
        vocab = int(params["lm_head"].shape[-1])
    config = {
        "medusa_num_heads": drafter.num_heads,
        "medusa_num_layers": drafter.num_layers,
        "base_model_name_or_path": target_name,
        "hidden_size": drafter.hidden_size,  # vLLM's MedusaConfig reads these two
    }
    return config | ({"vocab_size": vocab} if vocab else {})


def _medusa_tensors(params) -> dict:
    w, b = params["w"], params["b"]
    if w.ndim == 3:  # specjax's own layout, one block per head
        w, b = w[:, None], b[:, None]  # [H, 1, D, D], [H, 1, D]
    out = {}
    for h in range(w.shape[0]):
        for i in range(w.shape[1]):
            out[f"{h}.{i}.linear.weight"] = w[h, i].T  # torch [out, in]
            out[f"{h}.{i}.linear.bias"] = b[h, i]
        if "lm_head" in params:
            out[f"{h}.{w.shape[1]}.weight"] = params["lm_head"][h].T  # [V, D]: Medusa-1's own LM head
    return out


__all__ = ["FORMATS", "write_published"]
