"""Checking a generation's arguments and planning it: the prompt batch, the static Plan (a
jit cache key), the drafter's weights and, for adaptive speculation, its costs."""

from __future__ import annotations

import numpy as np

from specjax.config import GenerationConfig, SpeculativeConfig
from specjax.core.acceptance import default_rule
from specjax.core.state import Plan
from specjax.drafters import Drafter
from specjax.engine.adaptive import as_adaptive, plan_tokens, resolve_adaptive
from specjax.engine.prompts import PromptBatch, prepare_prompts
from specjax.trees.tree import Tree
from specjax.trees.tree_acceptance import default_tree_rule


def plan_generation(
    target,
    prompts,
    config: GenerationConfig,
    drafter: Drafter | None = None,
    speculative: SpeculativeConfig | None = None,
) -> tuple[PromptBatch, Plan, object, object]:
    """(prompt batch, plan, the drafter's weights, adaptive costs or None) after checking every
    argument. `drafter` None is plain decoding (`speculative` is then ignored)."""
    if not isinstance(config, GenerationConfig):
        raise ValueError(f"config must be a specjax.GenerationConfig, got {type(config).__name__}")
    sampling = config.sampling
    if drafter is None:
        batch = prepare_prompts(target, prompts, config.max_new_tokens, headroom=0)
        plan = Plan(target=target.config, drafter=None, num_speculative_tokens=0, sampling=sampling, rule=None,
                    cache=config.cache)  # fmt: skip
        return batch, plan, None, None
    speculative = speculative or SpeculativeConfig()
    tree, k = speculative.tree, speculative.num_speculative_tokens
    if tree is not None:
        if not isinstance(tree, Tree):
            raise ValueError(f"tree must be a specjax.Tree (Tree.from_paths, Tree.chain, Tree.preset), got {tree!r}")
        drafter.check_tree(target.config, tree)
        k = tree.num_nodes  # a tree's nodes occupy N slots past the root, whatever its depth
    elif not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {k!r}")
    else:
        drafter.check(target.config, int(k))
    adaptive = as_adaptive(speculative.adaptive)
    k = plan_tokens(adaptive, k)
    batch = prepare_prompts(target, prompts, config.max_new_tokens, headroom=k + 1)
    rule = speculative.rule
    plan = Plan(
        target=target.config,
        drafter=drafter.without_weights(),
        num_speculative_tokens=int(k),
        sampling=sampling,
        rule=rule or (default_rule(sampling) if tree is None else default_tree_rule(sampling)),
        cache=config.cache,
        tree=tree,
    )
    plan, costs = resolve_adaptive(adaptive, plan, target, drafter, batch, rule)
    return batch, plan, drafter.weights(), costs
