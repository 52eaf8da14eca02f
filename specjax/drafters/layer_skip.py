"""Self-speculation: the target's first N layers, its final norm and its LM head as the draft.

Draft & Verify (Zhang et al. 2023) and LayerSkip (Elhoushi et al. 2024) draft with a
shallower pass of the target itself: no second model to train, load or keep in memory.
Here the draft is the target's own model code run with `num_hidden_layers = N` on a view
of the target's params that keeps layers 0..N-1: the same arrays, passed into the same
jitted program, never copied.

Cache: the draft keeps its own KV cache for its N layers, N / L of the target's (L = the
target's layer count). The K/V of those layers at committed positions equal the target's
own (same weights, same inputs), so `init` copies them from the target's freshly prefilled
cache instead of running an N-layer prefill of its own: that prefill cost N / L of the
target's and, at 64 new tokens on SmolLM2 (10 / 30 layers), made adaptive speculation lose
~5% to plain decoding while it took plain steps (results/smollm2_e11_layer_skip). Sharing one
cache during decoding would also save the memory, but would need the drafter to write into
the target's cache, which this interface keeps out of a drafter's reach.

Without early-exit training (LayerSkip's layer dropout and shared exit loss), the first N
layers of a model predict poorly through the final LM head; acceptance measures it.
"""

from __future__ import annotations

import dataclasses

from flax import struct

from specjax.core.loop import prefill
from specjax.drafters.base import DraftContext
from specjax.drafters.common import CatchesUp
from specjax.drafters.draft_model import committed_cache, propose_autoregressive, propose_tree
from specjax.models import KVCache, ModelConfig


@struct.dataclass
class LayerSkipState:
    cache: KVCache  # [N, B, S, n_kv, d_head]: the draft's N layers only


def early_exit(config: ModelConfig, params: dict, layers: int) -> tuple[ModelConfig, dict]:
    """The config and params view of the first `layers` layers (plus final norm and head)."""
    config = dataclasses.replace(config, num_hidden_layers=layers)
    params = {**params, "layers": {i: params["layers"][i] for i in range(layers)}}
    return config, params


@dataclasses.dataclass(frozen=True)
class LayerSkip(CatchesUp):
    """Draft with the target's first `layers` layers (0 < layers < the target's layer count)."""

    layers: int
    catch_up: int = 2  # width of the per-round catch-up forward (see drafters/draft_model.py)
    tree_candidates: str = "sample"  # as DraftModel.tree_candidates
    name = "layer_skip"
    supports_trees = True

    def check(self, target_config: ModelConfig, num_speculative_tokens: int) -> None:
        total = target_config.num_hidden_layers
        if not 0 < self.layers < total:
            raise ValueError(
                f"LayerSkip(layers={self.layers}) needs 0 < layers < the target's num_hidden_layers ({total})"
            )

    def init(self, weights, ctx: DraftContext, prompt, cache_length: int) -> LayerSkipState:
        if ctx.target_cache is not None:  # the same K/V the draft's own prefill would compute
            target = ctx.target_cache
            return LayerSkipState(cache=target.replace(k=target.k[: self.layers], v=target.v[: self.layers]))
        config, params = early_exit(ctx.target, ctx.target_params, self.layers)
        return LayerSkipState(cache=prefill(config, params, prompt, ctx.lengths, cache_length, ctx.cache))

    def propose(self, weights, state: LayerSkipState, ctx: DraftContext, key):
        config, params = early_exit(ctx.target, ctx.target_params, self.layers)
        proposal, cache = propose_autoregressive(config, params, state.cache, ctx, key, catch_up=self.catch_up)
        return proposal, LayerSkipState(cache=cache)

    def propose_tree(self, weights, state: LayerSkipState, ctx: DraftContext, key):
        config, params = early_exit(ctx.target, ctx.target_params, self.layers)
        proposal, cache = propose_tree(config, params, state.cache, ctx, key, self.catch_up, self.tree_candidates)
        return proposal, LayerSkipState(cache=cache)

    def update_tree(self, weights, state: LayerSkipState, ctx: DraftContext, src, dst, num_accepted):
        return self.update(weights, LayerSkipState(cache=state.cache.move(src, dst)), ctx, num_accepted)

    def update(self, weights, state: LayerSkipState, ctx: DraftContext, num_accepted):
        return LayerSkipState(cache=committed_cache(state.cache, ctx))
