"""DFlash-style block heads in the layouts engines load (docs/head_formats_block.md).

  dflash       z-lab's layout (vLLM's and SGLang's `DFlashDraftModel`): config.json is the draft's
               Qwen3 config plus block_size (drafts + 1: the anchor counts), num_target_layers and
               dflash_config {mask_token_id, target_layer_ids (target layer i = the output of
               specjax block i)}; model.safetensors: fc.weight [D, n·D], hidden_norm.weight,
               layers.{i}.* (a Qwen3 layer: q_norm / k_norm over d_head), norm.weight. No
               embedding and no LM head: every engine borrows the target's.
  speculators  speculators' `dflash` (speculators_model_type "dflash", release 0.7.0): the same
               tensors, the layer config under transformer_layer_config, aux_hidden_state_layer_ids
               = vLLM's ids (block i + 1), sample_from_anchor false; with the target Model also
               embed_tokens.weight and lm_head.weight (the target's, or the head's own [Vd, D]
               with d2t / t2d), as speculators' DFlash converter writes them.

The network every engine runs (z-lab dflash/model.py, vLLM qwen3_dflash.py, SGLang
models/dflash.py, speculators models/dflash/) is specjax's BlockHead exactly when the head's
layers are Qwen3 layers (config.model_type "qwen3": the per-head q/k RMSNorm, also on the
context keys), without sliding windows, reading no target block past L - 2. A head trained by
`specjax train-head` with `block.layer_type: qwen3` exports; one with Llama layers (the default)
is refused with what differs, as are DSpark and DFlash 2, whose published networks are others
(the doc above).
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from specjax.drafters.block_head import BlockHead
from specjax.drafters.dflash2 import DFlash2
from specjax.drafters.dspark import DSpark
from specjax.drafters.formats.eagle3 import _draft_to_target
from specjax.drafters.formats.files import HeadTensors
from specjax.io.hf_config import _ARCHITECTURE_OF, config_from_hf
from specjax.io.hf_weights import _attention_from_hf, _attention_to_hf, _mlp_from_hf, _mlp_to_hf
from specjax.io.model import Model
from specjax.models import ModelConfig
from specjax.models.heads import layer_head_config

# speculators_model_type values read here (the other block drafters are refused with why).
SPECULATORS_BLOCK_TYPES = ("dflash", "dspark", "dflash2")
# The speculators release whose DFlash config this follows (v0.7.0: aux_hidden_state_layer_ids,
# mask_token_id, sample_from_anchor beside a Qwen3 transformer_layer_config).
SPECULATORS_DFLASH_VERSION = "0.7.0"
_ARCHITECTURE = "DFlashDraftModel"  # what vLLM's and SGLang's registries map to their DFlash model
_DIFFERENT_NETWORKS = {
    DSpark: [
        "its Markov term is added to the state before the final norm, through the target's embedding "
        "(down [D, r], up [r, D]); speculators' DSpark adds a logit bias W2 · W1[previous token] after the "
        "LM head, W1 [V, r] a table of its own",
        "its output 0 takes no Markov term; speculators' DSpark (sample_from_anchor=true) drafts from the "
        "anchor's output too, conditioned on the anchor",
        "its confidence head reads norm(z) alone; speculators' reads [norm(h), W1[previous token]]",
    ],
    DFlash2: [
        "its two-tap convolution mixes the block's outputs once, after the layers; the published DFlash 2 "
        "(vLLM qwen3_dflash2.py) convolves inside every layer (attention_conv and mlp_conv, base_kernel "
        "[2, taps, D] plus kernel_projection)",
        "its selector scores paths with the target's embedding (prev, context, next [D, r]); the published "
        "one with codebooks of its own (predecessor_codebook, successor_codebook [V, r], hidden_projection)",
    ],
}


def block_differences(drafter: BlockHead, format: str, target: ModelConfig | None) -> list[str]:
    """What keeps `drafter` from being the published DFlash network in `format`, in words."""
    for kind, reasons in _DIFFERENT_NETWORKS.items():
        if isinstance(drafter, kind):
            return list(reasons)
    c, out = drafter.config, []
    if c.model_type != "qwen3":
        out.append(
            f"its layers are {c.model_type} layers without the per-head q/k RMSNorm (q_norm, k_norm over d_head, "
            "also on the context keys) that every DFlash layer applies (z-lab's Qwen3DFlashAttention, vLLM's "
            "DFlashQwen3Attention, SGLang's DFlashAttention); `specjax train-head` builds such Llama layers"
        )
    if c.sliding_window is not None:
        out.append(f"its layers attend within a sliding window of {c.sliding_window}; DFlash's here see all context")
    if target is not None and target.num_hidden_layers - 1 in drafter.feature_layers:
        out.append(
            f"it reads block {target.num_hidden_layers - 1}, the target's last, which the engines do not capture "
            "(transformers' hidden_states[L] is after the final norm; vLLM captures the inputs of layers 0..L-1)"
        )
    if "lm_head" in drafter.params and format == "dflash":
        out.append(
            "it has its own LM head, which z-lab's layout has no place for (SGLang ignores lm_head.weight and "
            "reads the target's): format='speculators' writes it with d2t"
        )
    return out


def block_files(drafter: BlockHead, params: dict, format: str, target_name, target) -> tuple[dict, dict]:
    """(config.json dict, tensors by name) of a block head in `format` ("dflash" or "speculators":
    the module docstring); params: its weights as numpy arrays. A ValueError names what keeps
    the head from being the published network."""
    if format not in ("dflash", "speculators"):
        raise ValueError(
            f"format={format!r} writes EAGLE or Medusa heads; a block head is written as 'dflash' or 'speculators'"
        )
    target_config = target.config if isinstance(target, Model) else target
    found = block_differences(drafter, format, target_config)
    if found:
        raise ValueError(
            f"this {drafter.name} head cannot be saved as DFlash (format={format!r}): {'; '.join(found)}. It "
            "computes another function than the published network, so relabelling its weights would change its "
            "proposals; save it with format='specjax'"
        )
    tensors = _block_tensors(drafter.config, params)
    layer = _qwen3_json(drafter.config)
    if format == "speculators":
        return _speculators_json(drafter, layer, target_name, target_config), tensors | _vocabulary_tensors(
            drafter.config, params, target
        )
    layers = {"mask_token_id": drafter.mask_token_id, "target_layer_ids": list(drafter.feature_layers)}
    config = {**layer, "block_size": drafter.block_size + 1, "dflash_config": layers}  # the block counts the anchor
    if target_config is not None:
        config["num_target_layers"] = target_config.num_hidden_layers
    return config, tensors


def _qwen3_json(c: ModelConfig) -> dict:
    """The draft's Qwen3 config: the head's sizes and rotary embedding, every layer full
    (non-causal) attention; torch_dtype is the caller's to set to the stored one."""
    n, scaling = c.num_hidden_layers, dict(c.rope_scaling) if c.rope_scaling else None
    if scaling is not None:
        scaling["type"] = scaling["rope_type"]  # older readers look for rope_scaling["type"]
    return {
        "architectures": [_ARCHITECTURE],
        "model_type": "qwen3",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": n,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.resolved_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": scaling,
        "attention_bias": bool(c.attention_bias),  # Qwen3's: q, k, v and o together
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": n,
        "layer_types": ["full_attention"] * n,
        "torch_dtype": c.dtype,
    }


def _block_tensors(c: ModelConfig, params: dict) -> dict:
    """fc [D, n·D], hidden_norm, layers.{i}.* in HF names, norm: torch [out, in] layout."""
    out = {"fc.weight": params["fc"].T, "hidden_norm.weight": params["hidden_norm"]["scale"]}
    for key, layer in sorted(params["layers"].items(), key=lambda kv: int(kv[0])):  # 0.. in memory, "0".. loaded
        p = f"layers.{int(key)}"
        out |= _attention_to_hf(c, layer["attn"], f"{p}.self_attn") | _mlp_to_hf(c, layer["mlp"], p)
        out[f"{p}.input_layernorm.weight"] = layer["input_norm"]["scale"]
        out[f"{p}.post_attention_layernorm.weight"] = layer["post_attention_norm"]["scale"]
    out["norm.weight"] = params["final_norm"]["scale"]
    return {k: np.asarray(v) for k, v in out.items()}


def _vocabulary_tensors(c: ModelConfig, params: dict, target) -> dict:
    """lm_head (+ d2t, t2d) and embed_tokens as speculators' converter writes them: the head's
    own LM head always; the target's LM head and embedding only with the target Model."""
    out = {}
    if "lm_head" in params:
        out["lm_head.weight"] = params["lm_head"].T  # [Vd, D]
        draft = out["lm_head.weight"].shape[0]
        if "d2t" in params or draft < c.vocab_size:
            d2t = np.asarray(params.get("d2t", np.zeros(draft)), np.int64)  # target id = i + d2t[i]
            t2d = np.zeros(c.vocab_size, bool)
            t2d[np.arange(draft) + d2t] = True
            out |= {"d2t": d2t, "t2d": t2d}
    if isinstance(target, Model):
        if target.config.weights != "float32":  # int8 rows are codes: the file would hold no embedding
            raise ValueError(f"write the head against the float32 target, not its {target.config.weights} weights")
        embed = np.asarray(jax.device_get(target.params["embed"]))  # [V, D]
        out["embed_tokens.weight"] = embed
        if "lm_head.weight" not in out:
            tied = c.tie_word_embeddings
            out["lm_head.weight"] = embed if tied else np.asarray(jax.device_get(target.params["lm_head"])).T
    return out


def _speculators_json(drafter: BlockHead, layer: dict, target_name, target: ModelConfig | None) -> dict:
    architecture = _ARCHITECTURE_OF.get(target.model_type) if target is not None else None
    layer = {k: v for k, v in layer.items() if k != "architectures"}
    draft_vocab = int(np.shape(drafter.params["lm_head"])[-1]) if "lm_head" in drafter.params else layer["vocab_size"]
    proposal = {"proposal_type": "greedy", "speculative_tokens": drafter.block_size}
    return {
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": "dflash",
        "speculators_version": SPECULATORS_DFLASH_VERSION,
        "transformer_layer_config": layer,
        "draft_vocab_size": draft_vocab,
        "block_size": drafter.block_size + 1,
        "aux_hidden_state_layer_ids": [i + 1 for i in drafter.feature_layers],  # vLLM's ids: block i + 1
        "mask_token_id": drafter.mask_token_id,
        "sliding_window_non_causal": False,
        "sample_from_anchor": False,
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [proposal],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": target_name, "architectures": [architecture] if architecture else []},
        },
    }


# --- Reading ---------------------------------------------------------------------------------


def is_block_config(config: dict) -> bool:
    """Whether a config.json (z-lab's layout) describes a DFlash-family draft."""
    names = config.get("architectures") or []
    return "dflash_config" in config or any(str(n).startswith(("DFlash", "DSpark")) for n in names)


def read_block(config: dict, t: HeadTensors, target: Model | ModelConfig) -> BlockHead:
    """The BlockHead a DFlash checkpoint (either layout) holds, for `target`."""
    target_config = target.config if isinstance(target, Model) else target
    what = f"{t.source.parent}/config.json"
    if "speculators_model_type" in config:
        layer, fields = _from_speculators(config, what)
    else:
        layer, fields = _from_zlab(config, what, target_config.num_hidden_layers)
    _refuse_variants(layer, t.source.parent, what)
    head = _head_config(layer, target_config, what)
    params = _block_params(t, head, len(fields["feature_layers"]))
    params |= _own_vocabulary(t, head, target, int(config.get("draft_vocab_size") or head.vocab_size))
    return BlockHead(params=params, config=head, **fields)


def _from_speculators(config: dict, what: str) -> tuple[dict, dict]:
    kind = config["speculators_model_type"]
    if kind == "dspark":
        raise ValueError(
            f"{what}: speculators' DSpark (a Markov logit bias W2 · W1[previous token] after the LM head) is not "
            "specjax's DSpark network (its Markov term enters before the final norm): not supported"
        )
    if kind != "dflash":
        raise ValueError(f"{what}: speculators_model_type {kind!r} is not supported (supported: dflash)")
    if config.get("sample_from_anchor"):
        raise ValueError(f"{what}: sample_from_anchor=true (the anchor's output drafts too) is not supported")
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError(f"{what} lacks transformer_layer_config, which a speculators config must have")
    ids = config.get("aux_hidden_state_layer_ids")
    if not ids or 0 in ids:
        raise ValueError(f"{what}: aux_hidden_state_layer_ids {ids} must name target layers 1.. (vLLM's ids)")
    if config.get("target_hidden_size") not in (None, layer.get("hidden_size")):
        raise ValueError(
            f"{what}: target_hidden_size != hidden_size (a head narrower than its target) is not supported"
        )
    fields = {
        "feature_layers": tuple(int(i) - 1 for i in ids),
        **_block_fields(config, config.get("mask_token_id"), what),
    }
    return layer, fields


def _from_zlab(config: dict, what: str, num_target_layers: int) -> tuple[dict, dict]:
    names = config.get("architectures") or []
    extra = config.get("dflash_config") or {}
    if any(n != _ARCHITECTURE for n in names) or {"conv_kernel_size", "selector_rank"} & set(extra):
        raise ValueError(
            f"{what}: architectures {names}: only {_ARCHITECTURE} is read (DFlash2DraftModel's per-layer "
            "convolutions and codebook selector are not specjax's DFlash 2 network)"
        )
    ids = extra.get("target_layer_ids")
    if ids is None:  # z-lab's build_target_layer_ids for the target's depth
        n, d = config.get("num_target_layers", num_target_layers), config["num_hidden_layers"]
        ids = [n // 2] if d == 1 else [round(1 + i * (n - 4) / (d - 1)) for i in range(d)]
    block = {**config, "block_size": config.get("block_size") or extra.get("block_size")}
    return config, {
        "feature_layers": tuple(int(i) for i in ids),
        **_block_fields(block, extra.get("mask_token_id"), what),
    }


def _block_fields(config: dict, mask, what: str) -> dict:
    if mask is None or config.get("block_size") is None:
        raise ValueError(f"{what}: a DFlash config needs mask_token_id and block_size (drafts + 1)")
    return {"mask_token_id": int(mask), "block_size": int(config["block_size"]) - 1}


def _refuse_variants(layer: dict, directory: Path, what: str) -> None:
    """The DFlash variants engines run that BlockHead cannot: causal or windowed layers, a mask
    embedding of its own, sink biases, another rotary layout."""
    extra = layer.get("dflash_config") or {}
    flags = {
        "sliding_attention layers": "sliding_attention" in (layer.get("layer_types") or [])
        or bool(extra.get("use_swa"))
        or bool(layer.get("use_sliding_window")),
        "causal layers": bool(layer.get("is_causal") or extra.get("causal")),
        "attention sink biases": bool(extra.get("attention_sink_bias") or layer.get("add_swa_attention_sink_bias")),
        "is_neox_style=false": layer.get("is_neox_style", True) is False,
        "mask_embedding.pt (a mask embedding of its own)": (directory / "mask_embedding.pt").exists(),
    }
    found = [k for k, v in flags.items() if v]
    if found:
        raise ValueError(f"{what}: DFlash variant with {', '.join(found)} is not supported")


def _head_config(layer: dict, target: ModelConfig, what: str) -> ModelConfig:
    """The head's Qwen3 layers (whatever model_type the file names: every engine runs Qwen3
    DFlash layers) on the target's width, vocabulary and positions."""
    keep = ("dflash_config", "architectures", "auto_map", "block_size", "num_target_layers", "layer_types")
    hf = {k: v for k, v in layer.items() if k not in keep} | {"model_type": "qwen3"}
    mine = config_from_hf(hf, target.dtype, source=what)
    for field in ("hidden_size", "vocab_size"):
        if getattr(mine, field) != getattr(target, field):
            raise ValueError(f"{what} has {field}={getattr(mine, field)}, the target {getattr(target, field)}")
    head = layer_head_config(target, mine)
    return head.replace(num_hidden_layers=mine.num_hidden_layers, model_type="qwen3")


def _block_params(t: HeadTensors, c: ModelConfig, num_features: int) -> dict:
    d = c.hidden_size
    layers = {}
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}"
        layers[i] = {
            "input_norm": {"scale": t.get(f"{p}.input_layernorm.weight", (d,))},
            "attn": _attention_from_hf(c, t.get, f"{p}.self_attn"),
            "post_attention_norm": {"scale": t.get(f"{p}.post_attention_layernorm.weight", (d,))},
            "mlp": _mlp_from_hf(c, t.get, p),
        }
    return {
        "fc": t.get("fc.weight", (d, num_features * d)).T,  # [n·D, D]
        "hidden_norm": {"scale": t.get("hidden_norm.weight", (d,))},
        "layers": layers,
        "final_norm": {"scale": t.get("norm.weight", (d,))},
    }


def _own_vocabulary(t: HeadTensors, c: ModelConfig, target, draft_vocab: int) -> dict:
    """{} when the file has no LM head or the target's own (speculators' converter copies it
    in); else the head's lm_head [D, Vd] (+ d2t)."""
    if not t.has("lm_head.weight"):
        return {}
    if t.has("d2t") or draft_vocab < c.vocab_size:
        d2t = _draft_to_target(t, draft_vocab, c.vocab_size)
        out = {"lm_head": t.get("lm_head.weight", (draft_vocab, c.hidden_size)).T}
        return out if d2t is None else out | {"d2t": d2t}
    if t.has("t2d"):
        t.raw("t2d", (c.vocab_size,))
    lm_head = t.get("lm_head.weight", (c.vocab_size, c.hidden_size))  # [V, D]
    if isinstance(target, Model):
        theirs = target.params["embed"] if c.tie_word_embeddings else target.params["lm_head"].T
        if np.array_equal(np.asarray(lm_head), np.asarray(theirs, np.asarray(lm_head).dtype)):
            return {}  # the target's, read from the target at run time
    return {"lm_head": lm_head.T}
