"""`Model`: a config plus a params pytree (plus a tokenizer once one is attached)."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models import ModelConfig, full_forward, init_params


@dataclasses.dataclass(frozen=True)
class Model:
    """What generation needs of a model. Draft and target are both a `Model`."""

    config: ModelConfig
    params: dict  # nested dict of arrays, the pure-dict form of the Flax NNX state
    tokenizer: Any = None
    # Tokens per training window, where known (config.json's "specjax_trained_context"). A
    # model accepts max_position_embeddings positions, but one trained on short windows
    # degrades past them; generation warns once when a request runs beyond (engine/prompts.py).
    trained_context: int | None = None
    # The id a parallel (PARD) draft was trained to read as "a token to guess", where it was
    # (config.json's "specjax_mask_token_id", written by `specjax distill` with parallel
    # enabled): ParallelDraft(model) uses it when given none.
    mask_token_id: int | None = None
    # The Hugging Face repo id the weights come from, where known (config.json's `_name_or_path`
    # when it names a repo; a GGUF file's `general.source.*`; a packaged model's): the name a
    # serving engine resolves, which published heads record as their verifier (drafters/formats/writers.py).
    hf_repo: str | None = None
    # The weights sha256 (`params_sha256`) of the float32 model this one was converted from
    # where the conversion changes what that hash sees (int8: other values and scale params;
    # specjax/io/weight_formats.py): heads trained for the float32 target fingerprint it, and
    # still load on the converted one (drafters/formats/native.py target_fingerprint).
    source_fingerprint: str | None = None

    @property
    def num_parameters(self) -> int:
        return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(self.params))


def params_sha256(params) -> str:
    """sha256 over every leaf in key-path order: its path, shape and values rounded to bfloat16
    (one checkpoint loaded in float32 or in bfloat16 keeps one fingerprint). A head's record
    of its target's weights (drafters/formats/native.py)."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if jnp.issubdtype(leaf.dtype, jnp.floating):
            leaf = leaf.astype(jnp.bfloat16)  # on the device: half the bytes to bring back
        digest.update(f"{jax.tree_util.keystr(path, simple=True, separator='.')}{tuple(leaf.shape)}".encode())
        digest.update(np.ascontiguousarray(jax.device_get(leaf)).tobytes())
    return digest.hexdigest()


_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_HUB_URL = re.compile(r"https?://(?:www\.)?(?:huggingface\.co|hf\.co)/([^/?#]+/[^/?#]+)")


def hf_repo_id(text) -> str | None:
    """`text` as a Hugging Face repo id ("org/name"), from the id itself or a huggingface.co URL
    (https://huggingface.co/org/name[/...]); None for anything else (a local path such as
    "/ckpt/model" or "./out", a bare name, another site's URL), so that only a name an engine
    can resolve on the Hub is recorded."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    url = _HUB_URL.match(text)
    repo = url.group(1).removesuffix(".git") if url else text
    return repo if _REPO_ID.fullmatch(repo) and ".." not in repo else None


def init_model(config: ModelConfig, seed: int = 0, mesh=None) -> Model:
    """A randomly initialised model (std 0.02 weights) for `config`.

    mesh: a jax.sharding.Mesh: params are created in place, each device computing only its
    shards (same values; layout of `specjax.shard_model`, specjax/parallel/layout.py).
    """
    if mesh is not None:
        from specjax.io.sharded_loading import init_sharded_params

        return Model(*init_sharded_params(config, seed, mesh))
    return Model(config=config, params=init_params(config, seed))


_full_forward = jax.jit(full_forward, static_argnums=0)


def logits(model: Model, token_ids) -> np.ndarray:
    """Full forward with no cache: token ids [B, T] (or [T]) -> float32 logits [B, T, V]."""
    tokens = jnp.asarray(np.atleast_2d(np.asarray(token_ids, dtype=np.int32)))
    _check_token_ids(model.config, tokens)
    # Learned position tables (GPT-2) have no entry past the limit; generation checks it too.
    if tokens.shape[1] > model.config.max_position_embeddings:
        raise ValueError(
            f"{tokens.shape[1]} tokens exceed max_position_embeddings ({model.config.max_position_embeddings})"
        )
    return np.asarray(_full_forward(model.config, model.params, tokens))


def _check_token_ids(config: ModelConfig, tokens) -> None:
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= config.vocab_size):
        raise ValueError(
            f"token ids must lie in [0, {config.vocab_size}) for this model, "
            f"got ids in [{tokens.min()}, {tokens.max()}]"
        )
