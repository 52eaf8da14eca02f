"""Drafters compose: `Fallback(first, then)` proposes with `first` where it found something
(`Proposal.found`) and with `then` in the other rows.

The typical pair is `Fallback(PromptLookup(), DraftModel(draft))`: copying is free where
the output repeats the context, and the draft model covers the rest. Static shapes mean
both run every round; what composing buys is acceptance, not draft time.

A model drafter behind another drafter must catch up further: when `first`'s proposal is
accepted for K tokens, the draft model has fed none of them, so its cache can lag the
committed sequence by K + 1 tokens (`Drafter.tolerating_lag(K + 1)`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.drafters.base import DraftContext, Drafter, Proposal
from specjax.drafters.convert import as_drafter
from specjax.io.model import Model
from specjax.models import ModelConfig


def _one_hot(tokens, vocab_size):
    return jax.nn.one_hot(tokens, vocab_size, dtype=jnp.float32)  # [B, K, V]


@dataclasses.dataclass(frozen=True)
class Fallback(Drafter):
    """Rows where `first` found a proposal use it; the others use `then`.

    Either may be a `Model`: it drafts as a `DraftModel`, as everywhere a drafter is taken.
    """

    first: Drafter | Model
    then: Drafter | Model
    name = "fallback"

    def __post_init__(self):
        object.__setattr__(self, "first", as_drafter(self.first))
        object.__setattr__(self, "then", as_drafter(self.then))

    def _then(self, k: int) -> Drafter:
        return self.then.tolerating_lag(k + 1)

    def weights(self):
        return (self.first.weights(), self.then.weights())

    def without_weights(self) -> Fallback:
        return Fallback(self.first.without_weights(), self.then.without_weights())

    def check(self, target_config: ModelConfig, num_speculative_tokens: int) -> None:
        self.first.check(target_config, num_speculative_tokens)
        self.then.check(target_config, num_speculative_tokens)

    def init(self, weights, ctx: DraftContext, prompt, cache_length: int):
        then = self._then(ctx.num_speculative_tokens)
        return (
            self.first.init(weights[0], ctx, prompt, cache_length),
            then.init(weights[1], ctx, prompt, cache_length),
        )

    def propose(self, weights, state, ctx: DraftContext, key):
        key_first, key_then = jax.random.split(key)
        first, first_state = self.first.propose(weights[0], state[0], ctx, key_first)
        then, then_state = self._then(ctx.num_speculative_tokens).propose(weights[1], state[1], ctx, key_then)
        use_first = jnp.ones(first.tokens.shape[:1], bool) if first.found is None else first.found  # [B]
        tokens = jnp.where(use_first[:, None], first.tokens, then.tokens)  # [B, K]
        if first.q is None and then.q is None:
            q = None
        else:
            vocab = ctx.target.vocab_size
            q_first = _one_hot(first.tokens, vocab) if first.q is None else first.q
            q_then = _one_hot(then.tokens, vocab) if then.q is None else then.q
            q = jnp.where(use_first[:, None, None], q_first, q_then)  # [B, K, V]
        found = use_first if then.found is None else use_first | then.found
        return Proposal(tokens=tokens, q=q, found=found), (first_state, then_state)

    def abstains(self, weights, state, ctx: DraftContext):
        first = self.first.abstains(weights[0], state[0], ctx)
        then = self._then(ctx.num_speculative_tokens).abstains(weights[1], state[1], ctx)
        return None if first is None or then is None else first & then  # [B]: neither has a proposal

    def update(self, weights, state, ctx: DraftContext, num_accepted):
        then = self._then(ctx.num_speculative_tokens)
        return (
            self.first.update(weights[0], state[0], ctx, num_accepted),
            then.update(weights[1], state[1], ctx, num_accepted),
        )

    def stats(self, state):
        first = {f"first.{k}": v for k, v in self.first.stats(state[0]).items()}
        then = {f"then.{k}": v for k, v in self.then.stats(state[1]).items()}
        return {**first, **then}
