"""Model definitions. Installed as `specjax.models`.

`forward`, `full_forward`, `graphdef` and `init_params` dispatch on `config.model_type`,
so callers never ask which family a model belongs to.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from flax import nnx

from .attention import BlockMask, Packed, TreeMask
from .cache import KVCache, init_cache
from .config import LLAMA_FAMILY, MODEL_TYPES, ModelConfig
from .gemma import Gemma2, Gemma3
from .gpt2 import GPT2
from .llama import Llama, feature_layers, feature_width
from .moe import Mixtral
from .qwen3 import Qwen3, Qwen3Moe
from .tree_layout import PathLayout

# Llama, Qwen2, Mistral and Phi-3 run the Llama module itself (see config.LLAMA_FAMILY).
_MODULES = {
    **dict.fromkeys(LLAMA_FAMILY, Llama),
    "qwen3": Qwen3,
    "qwen3_moe": Qwen3Moe,
    "gemma2": Gemma2,
    "gemma3_text": Gemma3,
    "mixtral": Mixtral,
    "gpt2": GPT2,
}


def _build(config: ModelConfig, seed: int) -> nnx.Module:
    return _MODULES[config.model_type](config, rngs=nnx.Rngs(seed))


@functools.cache
def graphdef(config: ModelConfig) -> nnx.GraphDef:
    """The static structure of the model for `config` (built once, without allocating)."""
    return nnx.split(nnx.eval_shape(lambda: _build(config, 0)))[0]


def init_params(config: ModelConfig, seed: int = 0) -> dict:
    """Random parameters as a plain nested dict of arrays (std 0.02, norms at identity, biases at 0)."""
    return nnx.to_pure_dict(nnx.state(_build(config, seed), nnx.Param))


def forward(
    config: ModelConfig,
    params: dict,
    tokens,
    positions,
    cache: KVCache,
    tree: TreeMask | BlockMask | None = None,
    features: bool | tuple[int, ...] = False,
    packed: Packed | None = None,
):
    """Pure forward: (params, tokens [B, T], positions [B, T], cache) -> (logits [B, T, V], cache).

    `tree` (a TreeMask) verifies a token tree: tokens go to `tree.slots` and attend to the
    committed prefix plus their ancestors (models/attention.py); a BlockMask drafts a block
    of tokens at slot = position, causal or bidirectional within it. Either leaves
    `cache.lengths` to the caller. `features=True` also
    returns the hidden states the LM head reads, [B, T, D]: (logits, cache, features);
    `features=(i, j, ..)` returns instead the outputs of blocks i, j, .. concatenated,
    [B, T, n * D] (llama.decode; a bad index is a ValueError naming it). `packed` (a
    Packed) computes only the tokens it admits, a prefix of each row, in one row of N
    products (models/attention.py); the rest of the call's logits and features are zeros.
    """
    if packed is None:
        return nnx.merge(graphdef(config), params)(tokens, positions, cache, tree, features)
    if tree is not None or config.model_type == "gpt2":
        raise ValueError(f"a packed call takes no tree or block mask, and no {config.model_type} model")
    if tuple(tokens.shape) != tuple(packed.shape):
        raise ValueError(f"a packed call's tokens are {tuple(tokens.shape)}, its Packed says {packed.shape}")
    return nnx.merge(graphdef(config), params)(tokens, positions, cache, tree, features, packed=packed)


def full_forward(config: ModelConfig, params: dict, tokens, features: bool | tuple[int, ...] = False):
    """Logits of a whole batch with no prior context: tokens [B, T] -> [B, T, V]; with
    `features`, (logits, hidden states [B, T, D] or [B, T, n * D]) as `forward` gives them."""
    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    out = forward(config, params, tokens, positions, init_cache(config, b, t), features=features)
    return (out[0], out[2]) if features else out[0]


__all__ = [
    "MODEL_TYPES",
    "BlockMask",
    "KVCache",
    "ModelConfig",
    "Packed",
    "PathLayout",
    "TreeMask",
    "feature_layers",
    "feature_width",
    "forward",
    "full_forward",
    "graphdef",
    "init_cache",
    "init_params",
]
