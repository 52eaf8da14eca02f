"""Tuning a tree to a draft/target pair: measure acceptance by depth and rank, then expand.

`measure_acceptance` teacher-forces the draft on the target's own continuations of the
prompts: at every position it knows the target's distribution p (or its greedy token) and
the draft's q, hence the probability a_t[r] that the drafter's rank-r candidate is the one
accepted there:
  greedy:   a_t[r] = 1 if the draft's r-th most likely token is the target's token;
  sampling: candidates are i.i.d. draws from q tried by recursive rejection
            (trees/tree_acceptance.py), so a_t[r] = alpha_r * prod_{j<r} (1 - alpha_j) with
            alpha_j = sum min(r_j, q), r_0 = p, r_{j+1} = norm(max(r_j - q, 0)).
Depth enters through selection: a round reaches depth d only after d - 1 acceptances, and
easy text comes in runs, so acceptance at depth d is averaged over start positions s
weighted by the probability of reaching it, prod_{j<d-1} sum_r a_{s+j}[r] (each level
assumed as wide as `max_rank`).

`tune_tree` then takes the `num_nodes`-node tree of greatest expected accepted length
under that table by greedy expansion by path probability (`Tree.from_acceptance`), which
is optimal for this positional model when acceptance falls with rank. It is Sequoia's
acceptance-vector model measured by depth; Sequoia's dynamic programme additionally caps
depth for hardware cost, which `max_depth` does here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import GenerationConfig
from specjax.core.sampling import SamplingConfig, probabilities
from specjax.drafters import DraftModel, Eagle, LayerSkip
from specjax.drafters.layer_skip import early_exit
from specjax.engine.generation import prepared_generation
from specjax.engine.plan import plan_generation
from specjax.io.model import Model, logits
from specjax.models import full_forward
from specjax.models.heads import head_passes, teacher_forced
from specjax.trees.tree import Tree


def _draft_logits(draft, target: Model, batch: np.ndarray) -> np.ndarray:
    """The drafter's next-token logits at every position of `batch` [B, T], teacher-forced
    on the true prefix -> [B, T, V]. An EAGLE head reads the target's true features, so at
    depth > 1 (where it drafts from its own predicted features) this is optimistic."""
    if isinstance(draft, Model):
        return logits(draft, batch)
    if isinstance(draft, DraftModel) and draft.model is not None:
        return logits(draft.model, batch)
    if isinstance(draft, LayerSkip):
        return logits(Model(*early_exit(target.config, target.params, draft.layers)), batch)
    if isinstance(draft, Eagle) and draft.params is not None:
        layers, options = tuple(draft.feature_layers), draft.options
        tokens = jnp.asarray(batch)
        return np.asarray(
            _eagle_logits(draft.config, target.config, options, layers, draft.params, target.params, tokens)
        )
    raise ValueError(
        f"tune_tree needs a draft Model, DraftModel, LayerSkip or Eagle head, got {draft!r} "
        "(Medusa's heads guess each depth separately: use Tree.from_acceptance on your own table)"
    )


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _eagle_logits(config, target_config, options, layers, params, target_params, tokens):
    """The head's first draft step at every position of tokens [B, T] -> logits [B, T, V]:
    from the target's final-norm feature, or with `layers` (EAGLE-3, specjax's reduce or the
    published fc) from those blocks' raw outputs concatenated [B, T, n * D], as it drafts."""
    if not layers:
        return teacher_forced(config, params, target_config, target_params, tokens, options)[2]
    _, multi = jax.lax.stop_gradient(full_forward(target_config, target_params, tokens, features=layers))
    return head_passes(config, params, target_params, tokens, multi, options=options)[0]


def _rank_probabilities(p_logits, q_logits, token, sampling: SamplingConfig, max_rank: int) -> np.ndarray:
    """a[t, r] for one sequence: p_logits, q_logits [T, V]; token [T] the target's next tokens."""
    if sampling.greedy:
        top = np.argsort(-q_logits, axis=-1)[:, :max_rank]  # [T, R]
        return (top == token[:, None]).astype(np.float64)
    p = np.asarray(probabilities(p_logits, sampling), np.float64)
    q = np.asarray(probabilities(q_logits, sampling), np.float64)
    out = np.zeros((p.shape[0], max_rank))
    miss = np.ones(p.shape[0])  # probability that every earlier candidate was rejected
    r = p
    for j in range(max_rank):
        alpha = np.minimum(r, q).sum(-1)
        out[:, j] = miss * alpha
        miss = miss * (1 - alpha)
        residual = np.maximum(r - q, 0.0)
        mass = residual.sum(-1, keepdims=True)
        r = np.where(mass > 0, residual / np.where(mass > 0, mass, 1.0), r)
    return out


def measure_acceptance(
    target: Model,
    draft,
    prompts,
    temperature: float = 0.0,
    max_new_tokens: int = 64,
    max_depth: int = 8,
    max_rank: int = 8,
    seed: int = 0,
    **sampling,
) -> np.ndarray:
    """[max_depth, max_rank]: P(rank-r candidate accepted at depth d + 1 | its parent was)."""
    settings = {k: v for k, v in sampling.items() if k in ("top_k", "top_p", "min_p")}
    config = GenerationConfig.at_temperature(
        temperature, max_new_tokens=max_new_tokens, seed=seed, ignore_eos=True, **settings
    )
    batch, plan, weights = plan_generation(target, prompts, config)  # plain decoding: no round costs
    out = prepared_generation(target, batch, plan, weights, None, max_new_tokens, None, seed).run()
    encoded = prompts if not out.text else [target.tokenizer.encode(p) for p in prompts]
    sequences = [list(p) + list(t) for p, t in zip(encoded, out.tokens, strict=True)]
    width = max(len(s) for s in sequences)
    batch = np.zeros((len(sequences), width), np.int32)
    for i, s in enumerate(sequences):
        batch[i, : len(s)] = s
    # Right padding never reaches earlier positions of a causal model: one call per model.
    p_all, q_all = logits(target, batch), _draft_logits(draft, target, batch)
    numerator = np.zeros((max_depth, max_rank))
    denominator = np.zeros(max_depth)
    for i, (p, t) in enumerate(zip(encoded, out.tokens, strict=True)):
        if not t:
            continue
        span = slice(len(p) - 1, len(p) - 1 + len(t))  # positions predicting the generated tokens
        a = _rank_probabilities(p_all[i, span], q_all[i, span], np.asarray(t), config.sampling, max_rank)  # [T, R]
        reach = np.ones(len(t))  # P(reaching depth d from a round starting at s), per s
        for d in range(max_depth):
            starts = len(t) - d  # rounds starting at s see depth d + 1 at position s + d
            if starts <= 0:
                break
            numerator[d] += (reach[:starts, None] * a[d : d + starts]).sum(0)
            denominator[d] += reach[:starts].sum()
            reach = reach[:starts] * a[d : d + starts].sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        table = np.where(denominator[:, None] > 0, numerator / np.maximum(denominator[:, None], 1e-300), 0.0)
    return table


def tune_tree(
    target: Model,
    draft,
    prompts,
    num_nodes: int,
    temperature: float = 0.0,
    max_new_tokens: int = 64,
    max_depth: int = 8,
    max_rank: int = 8,
    seed: int = 0,
    **sampling,
) -> Tree:
    """The `num_nodes`-node tree with the greatest expected accepted length on `prompts`.

    Acceptance is measured by depth and rank (`measure_acceptance`) and the tree grown by
    greedy expansion by path probability (`Tree.from_acceptance`). `max_depth` caps depth.
    """
    table = measure_acceptance(
        target, draft, prompts, temperature, max_new_tokens, max_depth, max_rank, seed, **sampling
    )
    return Tree.from_acceptance(table, num_nodes)
