"""The generation API: one entry point over one loop, two settings objects.

    generate(target, prompts, config=None, *, draft=None, speculative=None) -> GenerationOutput
    prepare(...)     the same call checked and planned, to run (repeatedly) later
    init_state(...)  the state before the first round, to drive rounds yourself with step()
    step(target, state, *, draft=None)   one jitted round; the state is donated
    state_output(state)                  tokens and statistics of any state

No draft and no `speculative` is plain decoding (gpt-fast's "no draft model"). `draft` is a
`Model` (a draft model) or any `Drafter`; `speculative` (a SpeculativeConfig) says how to
speculate: K, a tree, adaptive K, the rule, and, when `draft` is not given, which drafter by
name (vLLM's `method` / `model`). `config` (a GenerationConfig) says how to generate.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping

from specjax.config import GenerationConfig, SpeculativeConfig
from specjax.constraints import as_constraints, grammar_for_rows, init_grammar
from specjax.core.loop import empty_cache
from specjax.core.state import LoopState
from specjax.drafters import Drafter, as_drafter, make_drafter
from specjax.engine.costs import resolve_costs, resolve_verify_costs
from specjax.engine.generation import jit_init_state, jit_round, prepared_generation
from specjax.engine.generation import state_output as _state_output
from specjax.engine.output import GenerationOutput, PreparedGeneration
from specjax.engine.plan import plan_generation
from specjax.io.model import Model, init_model
from specjax.models import ModelConfig

# The keyword arguments of the entry points before GenerationConfig (specjax/legacy.py), with their defaults.
_DEFAULTS = dict(max_new_tokens=64, temperature=0.0, top_k=None, top_p=None, seed=0, eos_token_id=None)


def load_drafter(
    spec: str | SpeculativeConfig | Mapping,
    target: Model | ModelConfig | None = None,
    *,
    load=None,
    seed: int = 0,
    **fields,
) -> Drafter:
    """Any drafter by name, with one call: `load_drafter("smollm2-eagle3", target)`.

    spec: a name (a shipped drafter, "prompt-lookup", "layer-skip:N", a model name, a local
    directory: its own files say what kind it is), a mapping as in bench configs
    ({method: ngram, prompt_lookup_max: 3}), or a SpeculativeConfig; `fields` override the
    spec's fields (e.g. allow_transfer=True). target: the Model the drafter serves (a head
    is checked against it: a Model's weights, a ModelConfig's config only). load: how model
    names load (default `specjax.load_model`, random presets drawn with seed + 1, as the CLI).
    """
    from specjax.io.presets import load_model

    spec = SpeculativeConfig.parse(spec)
    if fields:
        spec = spec.replace(**fields)
    if load is None:

        def load(name: str | ModelConfig) -> Model:  # random presets and shapes draw with seed + 1, as the CLI
            return init_model(name, seed=seed + 1) if isinstance(name, ModelConfig) else load_model(name, seed=seed + 1)

    return make_drafter(spec, load, target)


def _resolve(target, config, draft, speculative) -> tuple[GenerationConfig, Drafter | None, SpeculativeConfig | None]:
    if not isinstance(target, Model):
        raise ValueError(f"target must be a specjax.Model (specjax.load_model, specjax.init_model), got {target!r}")
    config = GenerationConfig() if config is None else config
    if not isinstance(config, GenerationConfig):
        raise ValueError(f"config must be a specjax.GenerationConfig, got {type(config).__name__}")
    # From here on eos_token_id holds the ids rows stop at (None: none), the target's by default.
    stop = config.stop_ids(target)
    config = config.replace(eos_token_id=stop, ignore_eos=stop is None)
    if speculative is not None and not isinstance(speculative, SpeculativeConfig):
        raise ValueError(f"speculative must be a specjax.SpeculativeConfig, got {type(speculative).__name__}")
    if draft is not None:
        return config, as_drafter(draft), speculative or SpeculativeConfig()
    if speculative is None:
        return config, None, None
    return config, load_drafter(speculative, target, seed=config.seed), speculative


def _grammar(target: Model, config: GenerationConfig, batch, rows: int):
    """The GrammarState of a constrained call (`rows` start states: the batch's rows, then
    padding rows running row 0's), or None. EOS is the call's stop ids, else (ignore_eos)
    the tokenizer's: a row that completes its match then emits EOS until its budget ends."""
    constraints = as_constraints(config.constraint, batch.num_rows)
    if constraints is None:
        return None
    if batch.mesh is not None:
        raise ValueError("constrained generation on a mesh is not supported yet: drop the mesh or the constraint")
    eos = config.eos_token_id
    if eos is None:
        eos = getattr(target.tokenizer, "eos_token_id", None)
    eos_ids = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
    table, starts = grammar_for_rows(constraints, target.tokenizer, target.config.vocab_size, eos_ids, rows)
    return init_grammar(table.next_state, starts)


def prepare(
    target: Model,
    prompts,
    config: GenerationConfig | None = None,
    *,
    draft: Model | Drafter | None = None,
    speculative: SpeculativeConfig | None = None,
) -> PreparedGeneration:
    """Check and plan a generation once; `.run()` it, or `.launch(n)` it to time the loop."""
    config, drafter, speculative = _resolve(target, config, draft, speculative)
    batch, plan, weights = plan_generation(target, prompts, config, drafter, speculative)
    plan = resolve_verify_costs(target, drafter, plan, batch)  # a schedule's costs="measure", timed or cached
    costs = resolve_costs(target, drafter, speculative, plan, batch)  # adaptive K's input, or None
    grammar = _grammar(target, config, batch, batch.bucket_rows)
    prepared = prepared_generation(target, batch, plan, weights, None if costs is None else costs.vector,
                                   config.max_new_tokens, config.eos_token_id, config.seed, grammar)  # fmt: skip
    return dataclasses.replace(prepared, costs=costs)  # the call carries where its costs came from


def generate(
    target: Model,
    prompts,
    config: GenerationConfig | None = None,
    *,
    draft: Model | Drafter | None = None,
    speculative: SpeculativeConfig | None = None,
    **legacy,
) -> GenerationOutput:
    """Generate from a ragged batch of prompts (token-id lists, or strings when the target has
    a tokenizer; `out.text` then holds the decoded continuations).

    Greedy output with any drafter equals plain greedy output token for token; sampled
    output is distributed exactly as the target's (speculative rejection sampling).
    The keyword form of the earlier API (`generate(model, prompts, max_new_tokens=..,
    temperature=..)`) still works for one release, with a DeprecationWarning.
    """
    if legacy or isinstance(config, int):
        config = legacy_config(config, legacy, "generate(model, prompts, max_new_tokens=..., ...)")
    return prepare(target, prompts, config, draft=draft, speculative=speculative).run()


def init_state(
    target: Model,
    prompts,
    config: GenerationConfig | None = None,
    *,
    draft: Model | Drafter | None = None,
    speculative: SpeculativeConfig | None = None,
) -> LoopState:
    """Prefill and return the state before the first round, holding exactly the caller's rows
    (no batch-bucket padding), so its arrays and `state_output` read row for row. Drive it
    with `state = step(target, state, draft=...)`: what `generate` does in one compiled loop."""
    import jax.numpy as jnp

    config, drafter, speculative = _resolve(target, config, draft, speculative)
    batch, plan, weights = plan_generation(target, prompts, config, drafter, speculative)
    plan = resolve_verify_costs(target, drafter, plan, batch)
    costs = resolve_costs(target, drafter, speculative, plan, batch)  # a bare state keeps only the values
    prompt, prompt_lengths, done, eos, rng = batch.loop_inputs(config.eos_token_id, config.seed, padded=False)
    kv = None if batch.mesh is not None else empty_cache(plan.target, prompt.shape[0], batch.cache_length, plan.cache)
    return jit_init_state(
        target.params, weights, prompt, prompt_lengths, jnp.int32(config.max_new_tokens), eos, rng, plan=plan,
        cache_length=batch.cache_length, done=done, costs=None if costs is None else costs.vector, kv=kv,
        grammar=_grammar(target, config, batch, batch.num_rows),
    )  # fmt: skip


def step(target: Model, state: LoopState, *, draft: Model | Drafter | None = None) -> LoopState:
    """One jitted round (a plain step, or draft, verify, commit per row); with adaptive K or a
    verify schedule, one run of rounds that keep choosing the same K or width (a schedule's:
    at most engine/verify_schedule.py ROUNDS_PER_CALL), as the compiled loop runs them. `state`
    is donated. `draft` must be the drafter the state was initialised with (its weights are read here)."""
    expected = state.plan.drafter
    if (draft is None) != (expected is None):
        raise ValueError(
            "this state decodes plainly: pass no draft"
            if expected is None
            else f"this state was initialised with drafter {expected!r}: pass it as draft="
        )
    drafter = None if draft is None else as_drafter(draft)
    if drafter is not None and drafter.without_weights() != expected:
        raise ValueError(f"state was initialised with drafter {expected!r}, not {drafter.without_weights()!r}")
    return jit_round(target.params, None if drafter is None else drafter.weights(), state)


def state_output(state: LoopState) -> GenerationOutput:
    """Tokens and statistics of a (possibly unfinished) state."""
    return _state_output(state)


# --- The entry points before GenerationConfig (specjax/legacy.py wraps the rest) ---------------


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated and goes in the next release; use {new}", DeprecationWarning, stacklevel=3)


def _config(values: dict) -> GenerationConfig:
    values = dict(values)
    values["cache"] = values.pop("cache_config", None)
    values["ignore_eos"] = values.get("eos_token_id") is None  # these entry points never stopped unless told
    return GenerationConfig.at_temperature(**values)


def legacy_config(max_new_tokens, kwargs: dict, old: str) -> GenerationConfig:
    """A GenerationConfig from the old keyword arguments (temperature 0 = greedy)."""
    unknown = sorted(set(kwargs) - {*_DEFAULTS, "cache_config"})
    if unknown:
        raise TypeError(f"generate() got an unexpected keyword argument {unknown[0]!r}")
    _warn(old, "generate(model, prompts, specjax.GenerationConfig(max_new_tokens=..., ...))")
    if max_new_tokens is not None:
        kwargs = {**kwargs, "max_new_tokens": max_new_tokens}
    return _config({**_DEFAULTS, **kwargs})
