"""Plain autoregressive decoding: the baseline every speedup is measured against."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.engine.loop import DEFAULT_CACHE, CacheConfig, commit, gather_tokens, prefill, token_buffer
from specjax.engine.output import GenerationOutput, PreparedGeneration, collect_output
from specjax.engine.prompts import prepare_prompts
from specjax.engine.sampling import SamplingConfig, select
from specjax.io.model import Model
from specjax.models import KVCache, ModelConfig, forward


@struct.dataclass
class DecodeState:
    tokens: jax.Array  # [B, S] int32: prompt + generated tokens, slot = position
    lengths: jax.Array  # [B] int32: committed tokens per row, prompt included
    prompt_lengths: jax.Array  # [B] int32
    done: jax.Array  # [B] bool
    cache: KVCache
    rng: jax.Array
    max_new_tokens: jax.Array  # [] int32
    eos_token_id: jax.Array  # [] int32, -1 when there is none
    row_rounds: jax.Array  # [B] int32: steps in which each row was still generating
    forwards: jax.Array  # [] int32: batched target forwards (steps)


def decode_step(config: ModelConfig, sampling: SamplingConfig, params, state: DecodeState) -> DecodeState:
    """One token per live row: feed the last committed token, choose the next one."""
    rng, key = jax.random.split(state.rng)
    last = (state.lengths - 1)[:, None]  # [B, 1]
    logits, cache = forward(config, params, gather_tokens(state.tokens, last), last, state.cache)
    next_token = select(key, logits[:, 0], sampling)  # [B]
    tokens, lengths, done = commit(
        state.tokens,
        state.lengths,
        state.prompt_lengths,
        state.done,
        next_token[:, None],
        jnp.ones_like(state.lengths),
        state.max_new_tokens,
        state.eos_token_id,
    )
    return state.replace(
        tokens=tokens,
        lengths=lengths,
        done=done,
        cache=cache,
        rng=rng,
        row_rounds=state.row_rounds + (~state.done).astype(jnp.int32),
        forwards=state.forwards + 1,
    )


def init_state(
    params,
    prompt,
    prompt_lengths,
    max_new_tokens,
    eos_token_id,
    rng,
    config,
    cache_length,
    cache=DEFAULT_CACHE,
    done=None,
) -> DecodeState:
    """Prefill the cache and return the state before the first step.

    `done` [B] bool marks rows finished from the start (padding rows of a batch bucket);
    None: every row generates.
    """
    batch = prompt.shape[0]
    return DecodeState(
        tokens=token_buffer(prompt, cache_length),
        lengths=prompt_lengths,
        prompt_lengths=prompt_lengths,
        done=jnp.zeros((batch,), bool) if done is None else done,
        cache=prefill(config, params, prompt, prompt_lengths, cache_length, cache),
        rng=rng,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        row_rounds=jnp.zeros((batch,), jnp.int32),
        forwards=jnp.zeros((), jnp.int32),
    )


@functools.partial(jax.jit, static_argnames=("config", "sampling", "cache_length", "cache"))
def _generate(
    params, prompt, prompt_lengths, done, max_new_tokens, eos_token_id, rng, *, config, sampling, cache_length, cache
):
    state = init_state(
        params, prompt, prompt_lengths, max_new_tokens, eos_token_id, rng, config, cache_length, cache, done
    )

    def cond_fn(state):
        return ~jnp.all(state.done)

    def body_fn(state):
        return decode_step(config, sampling, params, state)

    return jax.lax.while_loop(cond_fn, body_fn, state)


def prepare_generate(
    model: Model,
    prompts,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    eos_token_id: int | None = None,
    cache_config: CacheConfig | None = None,
) -> PreparedGeneration:
    """Check and pad the inputs of `generate` once; run them (repeatedly) later.

    Benchmarks use this to time only the compiled loop: `prepared.launch(n)` dispatches it.
    """
    sampling = SamplingConfig(temperature, top_k, top_p)
    batch = prepare_prompts(model, prompts, max_new_tokens, headroom=0)
    prompt, prompt_lengths, done, eos, rng = batch.loop_inputs(eos_token_id, seed)

    def launch(n: int) -> DecodeState:
        return _generate(
            model.params,
            prompt,
            prompt_lengths,
            done,
            jnp.int32(n),
            eos,
            rng,
            config=model.config,
            sampling=sampling,
            cache_length=batch.cache_length,
            cache=cache_config or DEFAULT_CACHE,
        )

    def collect(state: DecodeState) -> GenerationOutput:
        tokens, lengths, row_rounds, forwards, eos = jax.device_get(
            (state.tokens, state.lengths, state.row_rounds, state.forwards, state.eos_token_id)
        )
        # Only the caller's rows: padding rows of the batch bucket are dropped.
        return collect_output(
            np.asarray(tokens),
            batch.lengths,
            lengths,
            row_rounds,
            forwards,
            num_rows=batch.num_rows,
            eos_token_id=int(eos),
        )

    return PreparedGeneration(
        max_new_tokens=max_new_tokens,
        batch_size=batch.batch_size,
        cache_length=batch.cache_length,
        launch_fn=launch,
        collect_fn=collect,
        tokenizer=model.tokenizer if batch.is_text else None,
    )


def generate(
    model: Model,
    prompts,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    eos_token_id: int | None = None,
    cache_config: CacheConfig | None = None,
) -> GenerationOutput:
    """Plain decoding of a ragged batch in one jitted loop.

    `prompts` is a list of token-id lists, or of strings when the model has a tokenizer
    (then `out.text` holds the decoded continuations).
    """
    return prepare_generate(
        model, prompts, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id, cache_config
    ).run()
