"""A draft model with another tokenizer than the target's: token-level intersection (TLI;
Timor et al., arXiv 2502.05202, "Accelerating LLM Inference with Lossless Speculative
Decoding Algorithms for Heterogeneous Vocabularies"; Hugging Face's
`UniversalSpeculativeDecodingGenerator`).

The draft proposes only tokens whose bytes are exactly one target token (the intersection,
drafters/vocab_tables.py), drawn from its distribution restricted to them (-inf elsewhere,
then the same SamplingConfig as the target's) and mapped to target ids. q is that
restricted, processed distribution scattered into target ids, so speculative sampling is
exact against the target whatever the draft is.

The draft keeps its own KV cache in draft-token positions, synced to the committed target
tokens by feeding their pieces (drafters/foreign_draft.py, shared with universal assisted
generation). A round:
  1. catch-up: feed the pieces of target tokens [synced, L) (`feed_pieces`); the last fed
     piece's logits give draft 1.
  2. K drafts, each fed back (as its draft id, one piece) but the K-th.
  3. update: the accepted drafts that were fed are committed pieces: synced and
     cache.lengths advance by min(num_accepted, K - 1). The last committed token (the
     correction or bonus) is never fed, so every round has something to catch up on.
Behind another drafter (Fallback) the accepted tokens may be another drafter's: then
nothing fed while drafting is trusted (`tolerating_lag`) and the catch-up re-feeds them.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.core.sampling import SamplingConfig
from specjax.drafters.base import DraftContext, Proposal
from specjax.drafters.foreign_draft import CrossVocabState, ForeignDraft
from specjax.drafters.proposing import draw
from specjax.models import forward


@dataclasses.dataclass(frozen=True)
class CrossVocab(ForeignDraft):
    """A draft `Model` with its own tokenizer, for a target with another (module docstring).

    `CrossVocab.between(draft, target)` builds the tables from the two models' tokenizers.
    catch_up: draft tokens per catch-up forward (a wider one catches up in fewer forwards);
    length_ratio: draft cache slots per target cache slot.
    """

    trust_drafts: bool = True  # False behind another drafter: accepted tokens may not be ours
    name = "tli"
    title = "token-level intersection"

    def tolerating_lag(self, lag: int) -> CrossVocab:
        return dataclasses.replace(self, trust_drafts=False)

    def restricted(self, tables, logits):
        """logits [.., V_draft] with every draft token outside the intersection at -inf."""
        return jnp.where(tables["draft_to_target"] >= 0, logits, -jnp.inf)

    def draw(self, key, logits, tables, sampling: SamplingConfig):
        """Draft token [B] and the draft-vocabulary distribution [B, V_draft] it was drawn
        from (None when greedy), from the draft's logits [B, V_draft]."""
        return draw(key, self.restricted(tables, logits), sampling)

    def propose(self, weights, state: CrossVocabState, ctx: DraftContext, key):
        params, tables = weights
        k, sampling = ctx.num_speculative_tokens, ctx.sampling
        logits, cache, synced = self.catch_up_to(params, tables, state, ctx)

        def step(carry, step_key):
            cache, position, logits = carry
            token, q = self.draw(step_key, logits, tables, sampling)
            feed = tables["draft_feed"][token][:, None]
            out, cache = forward(self.config, params, feed, position[:, None], cache)
            return (cache, position + 1, out[:, 0].astype(jnp.float32)), (token, q)

        keys = jax.random.split(key, k)
        (fed_cache, _, logits_k), (tokens, qs) = jax.lax.scan(step, (cache, cache.lengths, logits), keys[:-1])
        last_token, last_q = self.draw(keys[-1], logits_k, tables, sampling)
        drafts = jnp.concatenate([tokens.T, last_token[:, None]], axis=1)  # [B, K] draft ids
        targets = tables["draft_to_target"][drafts]  # [B, K]: in the intersection by construction
        q = None
        if last_q is not None:
            q_draft = jnp.concatenate([qs.transpose(1, 0, 2), last_q[:, None]], axis=1)  # [B, K, V_draft]
            q = self.target_q(q_draft, tables, ctx.target.vocab_size)
        state = CrossVocabState(
            cache=fed_cache.replace(lengths=cache.lengths),
            synced=synced,
            fed=jnp.full_like(synced, k - 1),
        )
        return Proposal(tokens=targets.astype(jnp.int32), q=q), state

    @staticmethod
    def target_q(q_draft, tables, target_vocab: int):
        """[B, K, V_draft] -> [B, K, V_target]: each draft token's mass at its target id (summed
        over draft tokens with the same bytes); outside the intersection q_draft is 0."""
        ids = tables["draft_to_target"]
        index = jnp.where(ids >= 0, ids, target_vocab)  # past the end: dropped
        shape = (*q_draft.shape[:-1], target_vocab)
        return jnp.zeros(shape, jnp.float32).at[..., index].add(q_draft, mode="drop")

    def update(self, weights, state: CrossVocabState, ctx: DraftContext, num_accepted):
        trusted = jnp.minimum(num_accepted, state.fed) if self.trust_drafts else jnp.zeros_like(state.fed)
        # Never past the last committed token: the next catch-up must feed at least it.
        trusted = jnp.clip(jnp.minimum(trusted, ctx.lengths - 1 - state.synced), 0, None)
        cache = state.cache.replace(lengths=state.cache.lengths + trusted)
        return CrossVocabState(cache=cache, synced=state.synced + trusted, fed=jnp.zeros_like(state.fed))
