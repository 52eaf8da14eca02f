"""Checking and padding a ragged batch of prompts into the static shapes jit wants."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.io.model import Model, _check_token_ids

_MIN_PROMPT_BUCKET = 16
_CACHE_ROUNDING = 64


@dataclasses.dataclass(frozen=True)
class PromptBatch:
    tokens: np.ndarray  # [B, T_bucket] int32, each row right-padded with zeros
    lengths: np.ndarray  # [B] int32, true prompt lengths
    cache_length: int  # slots per row of every cache and of the token buffer
    is_text: bool = False  # prompts came as strings: decode the output to text too

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    def loop_inputs(self, eos_token_id: int | None, seed: int) -> tuple:
        """Device arrays every generation loop starts from: (prompt, lengths, eos id or -1, rng key)."""
        eos = jnp.int32(-1 if eos_token_id is None else eos_token_id)
        return jnp.asarray(self.tokens), jnp.asarray(self.lengths), eos, jax.random.key(seed)


def _bucket(n: int) -> int:
    """Prompt lengths are padded to powers of two so that few shapes ever compile."""
    return max(_MIN_PROMPT_BUCKET, 1 << (n - 1).bit_length())


def _encode(model: Model, prompts) -> tuple[list, bool]:
    """Strings (one, or a list) become token ids with the model's tokenizer."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if not (isinstance(prompts, list | tuple) and prompts and all(isinstance(p, str) for p in prompts)):
        return prompts, False
    if model.tokenizer is None:
        raise ValueError("text prompts need a model with a tokenizer; pass lists of token ids instead")
    return [model.tokenizer.encode(p) for p in prompts], True


def prepare_prompts(model: Model, prompts, max_new_tokens: int, headroom: int) -> PromptBatch:
    """Validate `prompts` (token-id lists, or strings if the model has a tokenizer) and right-pad them.

    `headroom` is how many slots past the last generated token a round may write
    (K + 1 for speculative decoding): positions must stay below max_position_embeddings,
    and slots must exist, because a scatter past the end would be silently dropped.
    """
    prompts, is_text = _encode(model, prompts)
    if isinstance(prompts, bytes) or not isinstance(prompts, list | tuple):
        raise ValueError("prompts must be a list of token-id lists (one per row) or of strings")
    if not prompts:
        raise ValueError("prompts is empty: pass at least one prompt")
    rows = []
    for i, prompt in enumerate(prompts):
        row = np.asarray(prompt, dtype=np.int64)
        if row.ndim != 1:
            raise ValueError(
                f"prompt {i} must be a flat list of token ids, got an array of shape {row.shape} "
                "(prompts is a list of prompts, one per row)"
            )
        if row.size == 0:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
        rows.append(row)
    if not isinstance(max_new_tokens, int | np.integer) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    _check_token_ids(model.config, np.concatenate(rows))

    longest = max(len(r) for r in rows)
    needed = longest + max_new_tokens + headroom
    limit = model.config.max_position_embeddings
    if needed > limit:
        raise ValueError(
            f"the longest prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) "
            f"+ headroom ({headroom}) = {needed} exceeds max_position_embeddings ({limit})"
        )
    bucket = _bucket(longest)
    tokens = np.zeros((len(rows), bucket), np.int32)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    cache_length = -(-max(bucket, needed) // _CACHE_ROUNDING) * _CACHE_ROUNDING
    lengths = np.array([len(r) for r in rows], np.int32)
    return PromptBatch(tokens=tokens, lengths=lengths, cache_length=cache_length, is_text=is_text)
