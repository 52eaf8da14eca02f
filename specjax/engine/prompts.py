"""Checking and padding a ragged batch of prompts into the static shapes jit wants."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import jax
import numpy as np

from specjax.core.loop import eos_ids
from specjax.io.model import Model, _check_token_ids
from specjax.parallel.placement import model_mesh, pad_rows, place_rows

_MIN_PROMPT_BUCKET = 16
_CACHE_ROUNDING = 64
_BATCH_BUCKET_STEP = 8  # batch buckets: powers of two up to this, then its multiples


@dataclasses.dataclass(frozen=True)
class PromptBatch:
    """A ragged batch padded to static shapes: rows to a batch bucket, tokens to a length bucket.

    Rows `num_rows` and beyond are padding (see `_batch_bucket`): copies of row 0's prompt
    that start `done`, so they append nothing, count in no statistic, and every
    computation on them reads valid tokens. Collect steps drop them.
    """

    tokens: np.ndarray  # [B_bucket, T_bucket] int32, each row right-padded with zeros
    lengths: np.ndarray  # [B_bucket] int32, true prompt lengths
    cache_length: int  # slots per row of every cache and of the token buffer
    num_rows: int  # the caller's rows (the first num_rows); the rest pad the batch to its bucket
    is_text: bool = False  # prompts came as strings: decode the output to text too
    mesh: Any = None  # the mesh the model's params live on: rows go to its "data" axis (specjax/parallel)

    @property
    def batch_size(self) -> int:
        """The caller's number of rows (padding rows excluded)."""
        return self.num_rows

    @property
    def bucket_rows(self) -> int:
        """Rows the compiled program runs: `batch_size` padded to its bucket."""
        return self.tokens.shape[0]

    def loop_inputs(self, eos_token_id, seed: int, padded: bool = True) -> tuple:
        """Device arrays every generation loop starts from: (prompt, lengths, done, stop ids [E], rng key).
        `eos_token_id`: None, an id or a list of ids.

        `done` [B] marks the padding rows finished from the start. `padded=False` returns
        only the caller's rows (for a state the caller inspects row by row).
        """
        rows = self.bucket_rows if padded else self.num_rows
        done = np.arange(rows) >= self.num_rows
        eos = jax.device_put(eos_ids(eos_token_id))  # [E]: -1 when there is none
        # device_put, not jnp.asarray: in jax 0.10 jnp.asarray of a numpy array compiles a
        # small "stage" program per shape, three more live executables per batch shape.
        prompt, lengths, done = place_rows((self.tokens[:rows], self.lengths[:rows], done), self.mesh)
        return prompt, lengths, done, eos, jax.random.key(seed)


def _bucket(n: int) -> int:
    """Prompt lengths are padded to powers of two so that few shapes ever compile."""
    return max(_MIN_PROMPT_BUCKET, 1 << (n - 1).bit_length())


def _batch_bucket(n: int) -> int:
    """Rows a batch of n prompts runs as: powers of two up to 8, then multiples of 8.

    1, 2, 4, 8, 16, 24, 32, ...: 3 -> 4, 5 -> 8, 9 -> 16, 17 -> 24. Each batch size
    otherwise compiles its own programs; with buckets, sizes 1..64 compile 11 shapes, not 64,
    at the cost of fewer than 2x the rows (up to 8) or at most 7 extra rows (above). Padding rows copy
    row 0's prompt and start done (`PromptBatch`), so outputs and statistics do not change.
    """
    if n <= _BATCH_BUCKET_STEP:
        return 1 << (n - 1).bit_length()
    return -(-n // _BATCH_BUCKET_STEP) * _BATCH_BUCKET_STEP


def _encode(model: Model, prompts) -> tuple[list, bool]:
    """Strings (one, or a list) become token ids with the model's tokenizer."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if not (isinstance(prompts, list | tuple) and prompts and all(isinstance(p, str) for p in prompts)):
        return prompts, False
    if model.tokenizer is None:
        raise ValueError("text prompts need a model with a tokenizer; pass lists of token ids instead")
    return [model.tokenizer.encode(p) for p in prompts], True


_warned_context: set = set()  # (config, trained context): warn once per model per process


def warn_past_trained_context(model: Model, tokens: int) -> None:
    """Warn (once per model) when a request of `tokens` positions runs past the context the
    model was trained on: it accepts max_position_embeddings positions, but the embedded
    pair, trained on 256-byte windows, turns to gibberish past them and speculation slows."""
    trained = model.trained_context
    key = (model.config, trained)
    if trained is None or tokens <= trained or key in _warned_context:
        return
    _warned_context.add(key)
    warnings.warn(
        f"prompt + max_new_tokens = {tokens} tokens runs past the {trained}-token windows this model was "
        f"trained on (its max_position_embeddings is {model.config.max_position_embeddings}); past them its "
        "output degrades, and so does speculation",
        UserWarning,
        stacklevel=4,
    )


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
    warn_past_trained_context(model, longest + max_new_tokens)
    needed = longest + max_new_tokens + headroom
    limit = model.config.max_position_embeddings
    if needed > limit:
        raise ValueError(
            f"the longest prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) "
            f"+ headroom ({headroom}) = {needed} exceeds max_position_embeddings ({limit})"
        )
    bucket = _bucket(longest)
    num_rows = len(rows)
    # Padding rows: row 0's prompt, masked done; on a mesh, up to a multiple of its "data" axis.
    mesh = model_mesh(model)
    rows += [rows[0]] * (pad_rows(_batch_bucket(num_rows), mesh) - num_rows)
    tokens = np.zeros((len(rows), bucket), np.int32)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    cache_length = -(-max(bucket, needed) // _CACHE_ROUNDING) * _CACHE_ROUNDING
    lengths = np.array([len(r) for r in rows], np.int32)
    return PromptBatch(
        tokens=tokens, lengths=lengths, cache_length=cache_length, num_rows=num_rows, is_text=is_text, mesh=mesh
    )
