"""Saving and loading trained draft heads (Medusa, EAGLE-style, DFlash-style block heads, DSpark,
DFlash 2).

A head directory holds `drafter.json` (its kind, shape, and the target it was trained
for) and `model.safetensors` (the head's own weights only: the target's embedding and LM
head are read from the target at run time, never stored twice).

`load_head` also reads the heads others publish (EAGLE-1/2, EAGLE-3, Medusa-1/2,
speculators): drafters/formats/published.py; `save_drafter(..., format=...)` writes them:
drafters/formats/writers.py.

A head reads one target's hidden states, so `load_head` refuses another target: one of
other shapes always (the head cannot even run), and one of the same shapes but another
config or other weights (`target_fingerprint`) unless `allow_transfer=True` says the
transfer is deliberate (it runs, but its guesses are those learned for another model).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import load_file, save_file

from specjax.drafters.base import Drafter
from specjax.drafters.block_head import BlockHead
from specjax.drafters.dflash2 import DFlash2
from specjax.drafters.dspark import DSpark
from specjax.drafters.eagle import Eagle
from specjax.drafters.formats.files import WEIGHT_FILES
from specjax.drafters.formats.published import load_published
from specjax.drafters.formats.writers import write_published
from specjax.drafters.medusa import Medusa
from specjax.io.embedded import embedded_path
from specjax.io.model import Model, params_sha256
from specjax.models import ModelConfig
from specjax.models.heads import SPECJAX_HEAD, HeadOptions, head_config

FORMAT = "specjax-drafter-1"
_CONFIG = "drafter.json"
_TRANSFER = "allow_transfer=True"
# A BlockHead's fields; dspark's params add the Markov and confidence heads, dflash2's the
# convolution and the selector.
_BLOCK_KINDS = ("block_head", "dspark", "dflash2")
_BLOCK_CLASSES = {"block_head": BlockHead, "dspark": DSpark, "dflash2": DFlash2}
_DFLASH2_FIELDS = ("paths", "branch")  # DFlash 2's selector settings, kept in drafter.json
# What a published head's layer sets itself (published._drafter_config), kept in drafter.json.
_LAYER_FIELDS = ("head_dim", "rope_theta", "rope_scaling", "rms_norm_eps", "attention_bias", "o_proj_bias", "mlp_bias")


def is_head_directory(path) -> bool:
    return (Path(path) / _CONFIG).is_file()


def _flatten(params: dict, prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = np.asarray(jax.device_get(value))
    return out


def _unflatten(flat: dict[str, np.ndarray]) -> dict:
    out: dict = {}
    for name, value in flat.items():
        node = out
        *parents, leaf = name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


# --- The target a head was trained for ----------------------------------------------------


def _canonical_config(config: ModelConfig) -> dict:
    """The config as fingerprinted and stored: JSON values, keys sorted.

    Left out: `dtype` and `weights` (the precision and format the weights are held in, not
    which model they are: a head serves its target in every weight format) and
    fields set to None (what the model does not have), so a field added to ModelConfig later
    with a None default keeps every saved fingerprint valid. head_dim is the resolved one:
    None and an explicit hidden_size / num_attention_heads are one model.
    """
    fields = {**dataclasses.asdict(config), "head_dim": config.resolved_head_dim}
    del fields["dtype"], fields["weights"]
    return json.loads(json.dumps({k: v for k, v in sorted(fields.items()) if v is not None}))


def _config_sha256(config: ModelConfig) -> str:
    return hashlib.sha256(json.dumps(_canonical_config(config), sort_keys=True).encode()).hexdigest()


def _weights_sha256(target: Model) -> str:
    """The target's weights fingerprint (`params_sha256`: values rounded to bfloat16, so one
    checkpoint loaded in float32 or in bfloat16 keeps one fingerprint). A target converted to
    int8 weights (io/weight_formats.py) keeps that of the float32 weights it came from."""
    return target.source_fingerprint or params_sha256(target.params)


def target_fingerprint(target: Model | ModelConfig) -> dict[str, str]:
    """What identifies a head's target: {"config_sha256": ..., "weights_sha256": ...}.

    config_sha256 hashes the canonical JSON of its ModelConfig (`_canonical_config`);
    weights_sha256, present only for a Model, hashes all of its params (0.3 s for 135M
    parameters on a CPU; 1 s the first time, which compiles the casts). save_drafter
    stores both; load_head compares them.
    """
    if isinstance(target, Model):
        return {"config_sha256": _config_sha256(target.config), "weights_sha256": _weights_sha256(target)}
    if isinstance(target, ModelConfig):
        return {"config_sha256": _config_sha256(target)}
    raise TypeError(f"a head's target is a specjax Model or a ModelConfig, got {type(target)!r}")


def _eagle_head_dim(params: dict) -> int:
    """The attention head size an EAGLE head's layer was built with (the target's): q_proj [D, H, d_head].
    Its one layer is keyed 0 in memory and "0" once loaded."""
    layer = next(iter(params["layers"].values()))  # a block head's layers all have the one shape
    return int(np.shape(layer["attn"]["q_proj"])[-1])


def _shape_mismatches(config: dict, params: dict, target: ModelConfig) -> list[tuple[str, str]]:
    """(what the head was trained with, what `target` has) for each shape of the target's the
    head reads that `target` does not have."""
    kind = config["kind"]
    hidden = int(np.shape(params["w"])[-1]) if kind == "medusa" else int(np.shape(params["fc"])[1])
    wanted = [("hidden size", hidden, target.hidden_size)]
    if config.get("vocab_size"):  # 0: a Medusa built without its vocabulary
        wanted.append(("vocabulary", int(config["vocab_size"]), target.vocab_size))
    if kind in ("eagle", *_BLOCK_KINDS):
        wanted.append(("head dim", _eagle_head_dim(params), target.resolved_head_dim))
    out = [(f"{name} {mine}", f"{name} {theirs}") for name, mine, theirs in wanted if mine != theirs]
    layers = config.get("feature_layers") or []  # multi-layer features: blocks the target must have
    missing = [i for i in layers if i >= target.num_hidden_layers]
    if missing:
        of = config["target"].get("num_hidden_layers")
        out.append(
            (
                f"feature layers {layers}" + (f" (of {of} layers)" if of else ""),
                f"{target.num_hidden_layers} layers (feature layers {missing} do not exist)",
            )
        )
    return out


def _described(trained: dict) -> str:
    return trained.get("name") or "another target"


def _fields(config: dict, names: list[str]) -> str:
    return ", ".join(f"{k}={config.get(k)}" for k in names) or "another config"


def _check_target(label: str, config: dict, params: dict, target: Model | ModelConfig, allow_transfer: bool) -> None:
    """Raise a one-line ValueError naming both sides if the head at `label` cannot serve `target`."""
    trained = config["target"]
    target_config = target.config if isinstance(target, Model) else target
    shapes = _shape_mismatches(config, params, target_config)
    if shapes:
        raise ValueError(
            f"head {label} was trained for {_described(trained)} with {', '.join(mine for mine, _ in shapes)}; "
            f"the given target has {', '.join(theirs for _, theirs in shapes)}: a head reads its target's hidden "
            f"states, so these must match ({_TRANSFER} waives only the target fingerprint, never shapes)"
        )
    if allow_transfer or "config_sha256" not in trained:  # heads saved before fingerprints: shapes only
        return
    opt_out = (
        "the shapes fit, but the head learned another model's hidden states (expect low acceptance); pass "
        f"{_TRANSFER} to load_drafter (a drafter spec: {{method: head, model: {label}, allow_transfer: true}}) to "
        "transfer it deliberately"
    )
    if _config_sha256(target_config) != trained["config_sha256"]:
        mine, theirs = trained.get("config", {}), _canonical_config(target_config)
        differ = [k for k in sorted({*mine, *theirs}) if mine.get(k) != theirs.get(k)]
        more = f" and {len(differ) - 6} more fields" if len(differ) > 6 else ""
        raise ValueError(
            f"head {label} was trained for {_described(trained)} ({_fields(mine, differ[:6])}{more}); the given "
            f"target has {_fields(theirs, differ[:6])}{more}: {opt_out}"
        )
    if isinstance(target, Model) and trained.get("weights_sha256"):
        given = _weights_sha256(target)
        if given != trained["weights_sha256"]:
            raise ValueError(
                f"head {label} was trained for {_described(trained)} (weights sha256 "
                f"{trained['weights_sha256'][:12]}); the given target has its config but other weights (sha256 "
                f"{given[:12]}): {opt_out}"
            )


# --- Saving and loading -------------------------------------------------------------------


def save_drafter(
    drafter: Drafter,
    path,
    target_name: str | None = None,
    target: Model | ModelConfig | None = None,
    *,
    format: str = "specjax",
) -> Path:
    """Write a trained head to `path` (a directory), naming the target it was trained for.

    target: the Model it was trained for (its config and weights are fingerprinted, so
    load_head can refuse another), or only its ModelConfig (the config is).
    format: "specjax" (drafter.json + model.safetensors, the default), or a published layout
    that vLLM, SGLang and the reference code read: "eagle" (EAGLE-1/2), "eagle3", "speculators"
    or "medusa" (drafters/formats/writers.py). A head whose network is not the published one is a
    ValueError naming the differences; "eagle" also needs the target Model (its files carry the
    target's embedding). Published files hold no fingerprint: target_name is their only record.
    """
    if not isinstance(drafter, Medusa | Eagle | BlockHead) or drafter.params is None:
        raise ValueError(f"save_drafter saves trained heads (Medusa, Eagle or BlockHead with weights), got {drafter!r}")
    if format != "specjax":
        if isinstance(drafter, DSpark):  # a published block layout would drop its Markov and confidence heads
            raise ValueError(f"a DSpark head saves in specjax's own format only (format='specjax'), not {format!r}")
        if isinstance(drafter, DFlash2):  # nor its convolution and selector (no published DFlash 2 layout here)
            raise ValueError(f"a DFlash 2 head saves in specjax's own format only (format='specjax'), not {format!r}")
        return write_published(drafter, path, format, target_name, target)
    if isinstance(drafter, Medusa):
        shape = {"num_heads": drafter.num_heads, "hidden_size": drafter.hidden_size, "vocab_size": drafter.vocab_size}
    else:
        c = drafter.config
        shape = {
            "hidden_size": c.hidden_size,
            "vocab_size": c.vocab_size,
            "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads,
            "intermediate_size": c.intermediate_size,
            "feature_layers": list(drafter.feature_layers),  # [] = the final-norm feature
        }
        if isinstance(drafter, BlockHead):
            shape["num_hidden_layers"] = c.num_hidden_layers
            if c.model_type != "llama":  # qwen3 layers (q/k norms): the DFlash engines' own
                shape["layer"] = {"model_type": c.model_type}
            shape.update(mask_token_id=drafter.mask_token_id, block_size=drafter.block_size)
            if isinstance(drafter, DFlash2):
                shape.update({k: getattr(drafter, k) for k in _DFLASH2_FIELDS})
        elif drafter.options != SPECJAX_HEAD:  # a published variant; files of specjax's own head stay as they were
            shape["options"] = dataclasses.asdict(drafter.options)
            shape["layer"] = {k: _canonical_config(c).get(k) for k in _LAYER_FIELDS}
    config = {"format": FORMAT, "kind": drafter.name, **shape, "target": {"name": target_name}}
    if target is not None:
        target_config = target.config if isinstance(target, Model) else target
        mismatches = _shape_mismatches(config, drafter.params, target_config)
        if mismatches:
            head, given = (", ".join(side) for side in zip(*mismatches, strict=True))
            raise ValueError(f"this head was built with {head}, but the target it is saved for has {given}")
        config["target"] = {
            "name": target_name,
            "hidden_size": target_config.hidden_size,
            "vocab_size": target_config.vocab_size,
            "num_hidden_layers": target_config.num_hidden_layers,
            "head_dim": target_config.resolved_head_dim,
            **target_fingerprint(target),
            "config": _canonical_config(target_config),  # to name the fields that differ on a refusal
        }
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / _CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    save_file(_flatten(drafter.params), str(path / "model.safetensors"))
    return path


def cast_floating(params, dtype):
    """Floating-point leaves as `dtype`; integer ones (EAGLE-3's d2t) as they are."""
    dtype = jax.numpy.dtype(dtype)
    return jax.tree.map(lambda x: x.astype(dtype) if jax.numpy.issubdtype(x.dtype, jax.numpy.floating) else x, params)


def load_head(
    path,
    target: Model | ModelConfig | None = None,
    allow_transfer: bool = False,
    *,
    aux_layers: tuple[int, ...] | None = None,
    aux_convention: str = "vllm",
) -> Drafter:
    """A head saved by `save_drafter` (a directory, or the name of an embedded head such as
    stdlib-medusa), checked against `target` (a Model or ModelConfig) if given; or a
    published head (EAGLE-1/2, EAGLE-3, Medusa-1/2, speculators: a directory without
    drafter.json), read against `target`, which it then needs (drafters/formats/published.py).
    For EAGLE-3 heads, `aux_layers` (specjax block indices) or `aux_convention` ("vllm", the
    default, or "sglang") say which target layers it reads (formats/published.py's docstring).

    A ValueError naming both sides refuses a target whose shapes the head cannot read
    (hidden size, vocabulary, head dim, the blocks of multi-layer features), and one that
    is not the target it was trained for (another config, or for a Model other weights:
    `target_fingerprint`). allow_transfer=True waives the second check only, for a
    deliberate transfer. Heads saved before fingerprints are checked on shapes only.
    """
    label = str(path)
    path = (embedded_path(path) if isinstance(path, str) else None) or Path(path).expanduser()
    if not is_head_directory(path):
        if path.is_dir() and any((path / name).is_file() for name in WEIGHT_FILES):
            return load_published(path, target, allow_transfer, aux_layers, aux_convention)
        raise ValueError(
            f"{path} is not a specjax head directory (no {_CONFIG}) nor a published head "
            f"(none of {', '.join(WEIGHT_FILES)})"
        )
    config = json.loads((path / _CONFIG).read_text())
    if config.get("format") != FORMAT:
        raise ValueError(f"{path / _CONFIG} has format {config.get('format')!r}, expected {FORMAT!r}")
    if config["kind"] not in ("medusa", "eagle", *_BLOCK_KINDS):
        raise ValueError(f"unknown head kind {config['kind']!r} in {path}")
    params = jax.tree.map(jax.numpy.asarray, _unflatten(load_file(str(path / "model.safetensors"))))
    target_config = None if target is None else getattr(target, "config", target)
    if target_config is not None:  # a head stored in bfloat16 (to ship it small) computes in the target's dtype
        params = cast_floating(params, target_config.dtype)
    if target is not None:
        _check_target(label, config, params, target, allow_transfer)
    if config["kind"] == "medusa":
        drafter = Medusa(params=params, vocab_size=int(config["vocab_size"]))
    else:
        if target_config is None:
            names = {"block_head": "a block head", "dspark": "a DSpark head", "dflash2": "a DFlash 2 head"}
            what = names.get(config["kind"], "an EAGLE head")
            raise ValueError(f"{what} ({label}) is built around its target: pass the target to load_head")
        own = dict(config.get("layer", {}))  # a published variant's own layer fields
        if own.get("rope_scaling") is not None:
            own["rope_scaling"] = dict(own["rope_scaling"])
        layer = head_config(
            target_config,
            config["num_attention_heads"],
            config["num_key_value_heads"],
            config["intermediate_size"],
            **own,
        )
        if config["kind"] in _BLOCK_KINDS:
            layer = layer.replace(num_hidden_layers=int(config["num_hidden_layers"]))
            extra = {k: int(config[k]) for k in _DFLASH2_FIELDS if config["kind"] == "dflash2"}
            drafter = _BLOCK_CLASSES[config["kind"]](
                **extra,
                params=params,
                config=layer,
                feature_layers=tuple(config["feature_layers"]),
                mask_token_id=int(config["mask_token_id"]),
                block_size=int(config["block_size"]),
            )
            return _checked(drafter, label, config, target_config)
        options = HeadOptions(**config.get("options", {}))
        # Heads saved before multi-layer features have no "feature_layers": the final-norm feature.
        drafter = Eagle(
            params=params, config=layer, feature_layers=tuple(config.get("feature_layers", ())), options=options
        )
    return _checked(drafter, label, config, target_config)


def _checked(drafter: Drafter, label: str, config: dict, target_config: ModelConfig | None) -> Drafter:
    if target_config is not None:
        try:
            drafter.check(target_config, 1)
        except ValueError as e:
            raise ValueError(f"head {label} was trained for {_described(config['target'])}: {e}") from e
    return drafter
