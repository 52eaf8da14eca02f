"""Published draft heads as specjax drafters: EAGLE-1/2, EAGLE-3, Medusa-1/2 and speculators.

The format is told from the files and the tensor names, never from `architectures` (EAGLE-1
and EAGLE-3 configs both say LlamaForCausalLM):

  speculators  config.json has `speculators_model_type`: "eagle" (fusion_fc.*, transformer.*)
               or "eagle3" (the EAGLE-3 tensors, its layer under layers.0.)
  medusa       every tensor is {h}.{l}.linear.{weight,bias} or {h}.{L}.weight (Medusa-1's LM heads)
  eagle3       midlayer.* or d2t: fc.weight [D, 3D], midlayer.*, norm, lm_head [Vd, D], d2t, t2d
  eagle        fc.weight [D, 2D] and layers.0.*: EAGLE-1 and EAGLE-2 (the same weights)
  dflash       config.json has dflash_config or a DFlash architecture (or speculators_model_type
               "dflash"): a DFlash block head, read by drafters/formats/block_published.py

The readers map tensors to the params of specjax's own networks with the options of
models/heads.HeadOptions (see there); the layouts and their sources are in
docs/heads.md ("Published formats"). Every shape is checked against the target, and a
tensor no reader uses or a variant flag this file does not implement is a ValueError.

EAGLE-3's three target layers. The reference reads the *inputs* of HF layers (2, L//2, L-3),
transformers' hidden_states[i], which are the outputs of specjax blocks (1, L//2-1, L-4)
(`features=` of models.forward). A config may name them (`eagle_aux_hidden_state_layer_ids`):
vLLM reads id i as hidden_states[i] (block i - 1), SGLang as the output of layer i (block i).
`aux_convention="vllm"` is the default (speculators checkpoints are made for vLLM);
"sglang", or explicit specjax blocks `aux_layers=(i, j, k)`, override it.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from specjax.drafters.base import Drafter
from specjax.drafters.eagle import Eagle
from specjax.drafters.formats.block_published import SPECULATORS_BLOCK_TYPES, is_block_config, read_block
from specjax.drafters.formats.eagle3 import eagle3_params
from specjax.drafters.formats.files import (
    WEIGHT_FILES,
    HeadTensors,
    read_config,
    read_tensors,
    tensor_names,
    weights_file,
)
from specjax.drafters.medusa import Medusa
from specjax.io.hf_config import config_from_hf
from specjax.io.hf_weights import _attention_from_hf, _mlp_from_hf
from specjax.io.model import Model
from specjax.models import ModelConfig
from specjax.models.heads import HeadOptions, layer_head_config

AUX_CONVENTIONS = ("vllm", "sglang")
_MEDUSA_KEY = re.compile(r"(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)")


def detect_format(config: dict, names: list[str], source: Path) -> str:
    """ "speculators", "medusa", "eagle3" or "eagle" from config.json and the tensor names."""
    if "speculators_model_type" in config:
        return "speculators"
    if is_block_config(config):
        return "dflash"
    if names and all(_MEDUSA_KEY.fullmatch(n) for n in names):
        return "medusa"
    if any(n.startswith("midlayer.") for n in names) or "d2t" in names:
        return "eagle3"
    if "fc.weight" in names and any(n.startswith("layers.0.") for n in names):
        return "eagle"
    shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    raise ValueError(
        f"cannot tell which draft-head format {source} holds: its tensors ({shown or 'none'}) match none of "
        "EAGLE-1/2 (fc + layers.0.*), EAGLE-3 (midlayer.* / d2t), Medusa ({h}.{l}.linear.*), and config.json has "
        "no speculators_model_type"
    )


def published_format(directory: Path) -> str | None:
    """The published head format of `directory` ("speculators", "medusa", "eagle3", "eagle"),
    or None when it holds no published head (e.g. a Hugging Face model, also config.json
    beside model.safetensors): what `--drafter DIR` uses to tell a head from a draft model."""
    if not directory.is_dir() or not any((directory / name).is_file() for name in WEIGHT_FILES):
        return None
    source = weights_file(directory)
    try:
        return detect_format(read_config(directory), tensor_names(source), source)
    except ValueError:
        return None


def load_published(
    directory: Path,
    target: Model | ModelConfig | None,
    allow_transfer: bool = False,
    aux_layers=None,
    aux_convention: str = "vllm",
) -> Drafter:
    """The published head in `directory` as a drafter for `target` (see the module docstring)."""
    if target is None:
        raise ValueError(f"{directory} holds a published draft head, which is read against its target: pass it")
    if aux_convention not in AUX_CONVENTIONS:
        raise ValueError(f"aux_convention must be one of {', '.join(AUX_CONVENTIONS)}, got {aux_convention!r}")
    target_config = target.config if isinstance(target, Model) else target
    source = weights_file(directory)
    tensors = HeadTensors(read_tensors(source), source, target_config.dtype)
    config = read_config(directory)
    kind = detect_format(config, tensors.names(), source)
    if kind == "speculators" and config["speculators_model_type"] in SPECULATORS_BLOCK_TYPES:
        kind = "dflash"
    if kind == "speculators":
        kind, config = _speculators(config, directory)
    if kind == "dflash":
        drafter = read_block(config, tensors, target)
    elif kind == "medusa":
        drafter = _medusa(tensors, target_config)
    elif kind == "eagle":
        drafter = _eagle(config, tensors, target_config)
    else:
        layers = eagle3_layers(config, target_config.num_hidden_layers, aux_layers, aux_convention)
        drafter = _eagle3(config, tensors, target_config, layers)
    _check_embedding(tensors, target, allow_transfer)
    tensors.check_all_used()
    try:
        drafter.check(target_config, 1)
    except ValueError as e:
        raise ValueError(f"the {kind} head in {directory} cannot serve this target: {e}") from e
    return drafter


def _speculators(config: dict, directory: Path) -> tuple[str, dict]:
    """(eagle or eagle3, an EAGLE-style config) from a speculators config.json: its layer config
    with the speculators fields beside it, tensors renamed by the readers' prefixes."""
    kind = config["speculators_model_type"]
    source = directory / "config.json"
    if kind not in ("eagle", "eagle3"):
        raise ValueError(f"{source}: speculators_model_type {kind!r} is not supported (supported: eagle, eagle3)")
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError(f"{source} lacks transformer_layer_config, which a speculators config must have")
    if kind == "eagle":
        if config.get("layernorms"):
            raise ValueError(f"{source}: layernorms=true (the HASS/TTT norms) is not supported")
        if config.get("transformer_layer_architecture", "LlamaDecoderLayer") != "LlamaDecoderLayer":
            raise ValueError(f"{source}: transformer_layer_architecture {config['transformer_layer_architecture']!r}")
        return "eagle", {
            **layer,
            "bias": bool(config.get("fusion_bias", False)),
            "_prefix": ("fusion_fc", "transformer"),
        }
    # The variant flags travel with the config so that _eagle3 refuses those it cannot run
    # (fc_norm: EAGLE-3.1's norms on each fused layer; norm_output: a norm on the layer output).
    fields = (
        "draft_vocab_size",
        "norm_before_residual",
        "norm_before_fc",
        "fc_norm",
        "norm_output",
        "target_hidden_size",
    )
    extra = {k: config[k] for k in (*fields, "eagle_aux_hidden_state_layer_ids") if k in config}
    return "eagle3", {**layer, **extra, "_prefix": ("fc", "layers.0")}


def _layer_config(hf: dict, target: ModelConfig, what: str) -> ModelConfig:
    """The head's own layer config (its rope theta and scaling, eps, sizes) as a ModelConfig,
    checked to fit `target`. Always a Llama layer: the published heads are, whatever the target."""
    hf = {k: v for k, v in hf.items() if k not in ("architectures", "_prefix")}
    hf = {"num_hidden_layers": 1, **hf, "model_type": "llama"}
    if hf["num_hidden_layers"] != 1:
        raise ValueError(f"{what}: heads of {hf['num_hidden_layers']} layers are not supported (only 1)")
    layer = config_from_hf(hf, target.dtype, source=what)
    if hf.get("qkv_bias"):  # EAGLE-1's Qwen2 heads: biases on q, k and v only
        layer = layer.replace(attention_bias=True, o_proj_bias=False)
    for field in ("hidden_size", "vocab_size"):
        mine, theirs = getattr(layer, field), getattr(target, field)
        if mine != theirs:
            raise ValueError(f"{what} has {field}={mine}, the target {theirs}: the head was made for another target")
    return layer


def _eagle(config: dict, t: HeadTensors, target: ModelConfig) -> Eagle:
    """EAGLE-1/2: fc over [embed; f] (+ a bias), one layer without its input norm, no final
    norm, the target's LM head; position 0 hidden (the reference never feeds it)."""
    fc_name, prefix = config.get("_prefix", ("fc", "layers.0"))
    head = layer_head_config(target, _layer_config(config, target, f"{t.source.parent}/config.json"))
    d = head.hidden_size
    bias = bool(config.get("bias", True))  # EAGLE's own config: absent means a bias
    if bias != t.has(f"{fc_name}.bias"):
        raise ValueError(
            f"{t.source.parent}/config.json says {'a' if bias else 'no'} fc bias, but {t.source} "
            f"{'lacks' if bias else 'has'} {fc_name}.bias"
        )
    layer = {
        "attn": _attention_from_hf(head, t.get, f"{prefix}.self_attn"),
        "mlp": _mlp_from_hf(head, t.get, prefix),
        "post_attention_norm": {"scale": t.get(f"{prefix}.post_attention_layernorm.weight", (d,))},
    }
    params = {"fc": t.get(f"{fc_name}.weight", (d, 2 * d)).T, "layers": {0: layer}}  # fc [2D, D]: [embed; f] rows
    if bias:
        params["fc_bias"] = t.get(f"{fc_name}.bias", (d,))
    options = HeadOptions(fc_bias=bias, input_norm=False, final_norm=False, hide_first=True)
    return Eagle(params=params, config=head, options=options)


def eagle3_layers(config: dict, num_layers: int, aux_layers=None, convention: str = "vllm") -> tuple[int, ...]:
    """The specjax blocks (features= indices) whose outputs an EAGLE-3 head reads, for a target
    of `num_layers`: `aux_layers` as given, else the config's ids read by `convention`, else
    the reference's default (module docstring)."""
    if aux_layers is not None:
        return tuple(int(i) for i in aux_layers)
    ids = config.get("eagle_aux_hidden_state_layer_ids") or (config.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids"
    )
    if ids is None:
        layers = (1, num_layers // 2 - 1, num_layers - 4)  # HF hidden_states (2, L//2, L-3)
        if len(set(layers)) < 3 or min(layers) < 0:
            raise ValueError(
                f"EAGLE-3's default layers (HF 2, L//2, L-3) are not three distinct layers of a {num_layers}-layer "
                "target (it needs 7 or more): pass aux_layers=(i, j, k), specjax block indices"
            )
        return layers
    if convention == "sglang":
        return tuple(int(i) for i in ids)
    if 0 in ids:
        raise ValueError(f"eagle_aux_hidden_state_layer_ids {ids} names 0, the embedding output (vLLM convention)")
    return tuple(int(i) - 1 for i in ids)


def _eagle3(config: dict, t: HeadTensors, target: ModelConfig, layers: tuple[int, ...]) -> Eagle:
    what = f"{t.source.parent}/config.json"
    unsupported = {
        "norm_before_residual": config.get("norm_before_residual"),
        "norm_before_fc": config.get("norm_before_fc"),
        "fc_norm": config.get("fc_norm"),
        "norm_output": config.get("norm_output"),
        "use_aux_hidden_state=false": (config.get("eagle_config") or {}).get("use_aux_hidden_state") is False,
    }
    flags = [k for k, v in unsupported.items() if v]
    if flags:
        raise ValueError(f"{what}: EAGLE-3 variant {', '.join(flags)} is not supported")
    if config.get("target_hidden_size") not in (None, config.get("hidden_size")):
        raise ValueError(
            f"{what}: target_hidden_size {config['target_hidden_size']} != hidden_size {config.get('hidden_size')} "
            "(a head narrower than its target, with its own embedding) is not supported"
        )
    head = layer_head_config(target, _layer_config(config, target, what))
    prefix = config.get("_prefix", ("fc", "midlayer"))[1]
    params, vocab = eagle3_params(
        t, head, prefix, len(layers), int(config.get("draft_vocab_size") or target.vocab_size)
    )
    options = HeadOptions(
        fc_bias="fc_bias" in params, eagle3=True, feed_normed=False, hide_first=True, draft_vocab_size=vocab
    )
    return Eagle(params=params, config=head, feature_layers=layers, options=options)


def _medusa(t: HeadTensors, target: ModelConfig) -> Medusa:
    """Medusa-1/2: heads and blocks counted from the tensor names (the config's counts are known
    to be wrong on the Hub); a per-head LM head {h}.{L}.weight makes it Medusa-1."""
    found: dict[int, set[tuple[int, str]]] = {}
    for name in t.names():
        h, i, kind = _MEDUSA_KEY.fullmatch(name).groups()
        found.setdefault(int(h), set()).add((int(i), kind))
    heads = sorted(found)
    if heads != list(range(len(heads))):
        raise ValueError(f"{t.source}: Medusa heads {heads} are not numbered 0..{len(heads) - 1}")
    blocks = sorted(i for i, kind in found[0] if kind == "linear.weight")
    num_layers, d, v = len(blocks), target.hidden_size, target.vocab_size
    mine = t.tensors["0.0.linear.weight"].shape if t.has("0.0.linear.weight") else None
    if mine is not None and mine[-1] != d:
        raise ValueError(f"these Medusa heads read hidden size {mine[-1]}, the target's is {d}")
    lm_heads = t.has(f"0.{num_layers}.weight")
    w, b, lm = [], [], []
    for h in heads:
        w.append([t.get(f"{h}.{i}.linear.weight", (d, d)).T for i in range(num_layers)])  # torch [out, in]
        b.append([t.get(f"{h}.{i}.linear.bias", (d,)) for i in range(num_layers)])
        if lm_heads:
            lm.append(t.get(f"{h}.{num_layers}.weight", (v, d)).T)  # [D, V]
    params = {"w": jnp.asarray(w), "b": jnp.asarray(b)}  # [H, L, D, D], [H, L, D]
    if num_layers == 1:
        params = {"w": params["w"][:, 0], "b": params["b"][:, 0]}  # specjax's own layout
    if lm_heads:
        params["lm_head"] = jnp.stack(lm)  # [H, D, V]
    return Medusa(params=params, vocab_size=v)


def _check_embedding(t: HeadTensors, target: Model | ModelConfig, allow_transfer: bool) -> None:
    """A head that ships the target's embedding (EAGLE-1 always; EAGLE-3 and speculators at
    times) is compared with the target's: the one cheap test that a head of the right shapes
    was trained for another model. Not stored: specjax reads the target's at run time."""
    if not t.has("embed_tokens.weight"):
        return
    config = target.config if isinstance(target, Model) else target
    mine = np.asarray(t.raw("embed_tokens.weight", (config.vocab_size, config.hidden_size)), np.float32)
    if allow_transfer or not isinstance(target, Model):
        return
    theirs = np.asarray(target.params["embed"], np.float32)
    diff, scale = float(np.max(np.abs(mine - theirs))), float(np.max(np.abs(theirs)))
    if diff > 1e-2 * scale:  # bfloat16 rounding of either side stays far below
        raise ValueError(
            f"the embedding in {t.source} (embed_tokens.weight) is not the target's (max |difference| {diff:.3g} at "
            f"scale {scale:.3g}): the head was trained for another model; pass allow_transfer=True to load it anyway"
        )
