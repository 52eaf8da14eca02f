"""Checking a speculative call's arguments and planning it: the prompt batch, the static
SpecPlan (a jit cache key), the drafter's weights and, for adaptive speculation, its costs."""

from __future__ import annotations

import numpy as np

from specjax.drafters import as_drafter
from specjax.engine.acceptance import default_rule
from specjax.engine.adaptive import plan_tokens, resolve_adaptive
from specjax.engine.loop import DEFAULT_CACHE
from specjax.engine.prompts import prepare_prompts
from specjax.engine.sampling import SamplingConfig
from specjax.engine.state import SpecPlan
from specjax.trees.acceptance import default_tree_rule
from specjax.trees.tree import Tree


def plan_generation(
    target,
    draft,
    prompts,
    num_speculative_tokens,
    max_new_tokens,
    temperature,
    top_k,
    top_p,
    rule,
    cache_config,
    tree=None,
    adaptive=False,
):
    """(prompt batch, plan, the drafter's weights, adaptive costs or None) after checking every argument."""
    sampling = SamplingConfig(temperature, top_k, top_p)
    drafter = as_drafter(draft)
    if tree is not None:
        if not isinstance(tree, Tree):
            raise ValueError(f"tree must be a specjax.Tree (Tree.from_paths, Tree.chain, Tree.preset), got {tree!r}")
        drafter.check_tree(target.config, tree)
        # A tree's nodes occupy N slots past the root, whatever its depth.
        num_speculative_tokens = tree.num_nodes
    elif not isinstance(num_speculative_tokens, int | np.integer) or num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {num_speculative_tokens!r}")
    else:
        drafter.check(target.config, int(num_speculative_tokens))
    num_speculative_tokens = plan_tokens(adaptive, num_speculative_tokens)
    batch = prepare_prompts(target, prompts, max_new_tokens, headroom=num_speculative_tokens + 1)
    plan = SpecPlan(
        target=target.config,
        drafter=drafter.without_weights(),
        num_speculative_tokens=int(num_speculative_tokens),
        sampling=sampling,
        rule=rule or (default_rule(sampling) if tree is None else default_tree_rule(sampling)),
        cache=cache_config or DEFAULT_CACHE,
        tree=tree,
    )
    plan, costs = resolve_adaptive(adaptive, plan, target, drafter, batch, rule)
    return batch, plan, drafter.weights(), costs
