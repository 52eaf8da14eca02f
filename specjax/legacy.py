"""The entry points before GenerationConfig: thin wrappers over specjax.api, kept for one
release. Each warns (DeprecationWarning) and says what to write instead."""

from __future__ import annotations

from specjax import api
from specjax.api import _DEFAULTS, _config, _warn, legacy_config
from specjax.config import GenerationConfig, SpeculativeConfig


def _split(args: tuple, kwargs: dict) -> tuple[GenerationConfig, SpeculativeConfig]:
    """The old 14-name speculative keyword list (positional after `prompts`, as it was)."""
    names = ("num_speculative_tokens", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "eos_token_id",
             "rule", "cache_config", "tree", "adaptive")  # fmt: skip
    if len(args) > len(names):
        raise TypeError(f"too many positional arguments ({len(args)})")
    values = {**dict(zip(names, args, strict=False)), **kwargs}
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
    spec = {k: values.pop(k) for k in ("num_speculative_tokens", "rule", "tree", "adaptive") if k in values}
    config = _config({**_DEFAULTS, **values})
    return config, SpeculativeConfig(**spec)


def speculative_generate(target, draft, prompts, *args, **kwargs):
    _warn("speculative_generate(target, draft, prompts, ...)", "generate(target, prompts, config, draft=draft, "
          "speculative=SpeculativeConfig(num_speculative_tokens=...))")  # fmt: skip
    config, speculative = _split(args, kwargs)
    return api.generate(target, prompts, config, draft=draft, speculative=speculative)


def prepare_speculative_generate(target, draft, prompts, *args, **kwargs):
    _warn("prepare_speculative_generate(...)", "prepare(target, prompts, config, draft=..., speculative=...)")
    config, speculative = _split(args, kwargs)
    return api.prepare(target, prompts, config, draft=draft, speculative=speculative)


def init_speculative_state(target, draft, prompts, *args, **kwargs):
    _warn("init_speculative_state(...)", "init_state(target, prompts, config, draft=..., speculative=...)")
    config, speculative = _split(args, kwargs)
    return api.init_state(target, prompts, config, draft=draft, speculative=speculative)


def speculative_step(target, draft, state):
    _warn("speculative_step(target, draft, state)", "step(target, state, draft=draft)")
    return api.step(target, state, draft=draft)


def prepare_generate(model, prompts, max_new_tokens=64, *args, **kwargs):
    names = ("temperature", "top_k", "top_p", "seed", "eos_token_id", "cache_config")
    values = {**dict(zip(names, args, strict=False)), **kwargs}
    config = legacy_config(max_new_tokens, values, "prepare_generate(model, prompts, ...)")
    return api.prepare(model, prompts, config)
