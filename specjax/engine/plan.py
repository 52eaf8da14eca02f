"""Checking a generation's arguments and planning it: the prompt batch, the static Plan (a
jit cache key) and the drafter's weights. Adaptive speculation's costs are not planned
here: they are an input, resolved by engine/costs.py before the loop runs."""

from __future__ import annotations

import numpy as np

from specjax.config import GenerationConfig, SpeculativeConfig
from specjax.core.acceptance import default_rule
from specjax.core.sampling import SamplingConfig
from specjax.core.state import Plan
from specjax.core.verify_widths import as_verify_schedule
from specjax.drafters import Drafter
from specjax.engine.adaptive_policy import AdaptiveConfig
from specjax.engine.prompts import PromptBatch, prepare_prompts
from specjax.trees.tree import Tree
from specjax.trees.tree_acceptance import default_tree_rule


def default_rule_for(sampling: SamplingConfig, tree_rounds: bool):
    """The acceptance rule when the caller names none, for rounds of chains or of token
    trees (adaptive trees included). The one place it is chosen: the generation's plan and
    the round-cost timers (engine/timed_loops.py) both ask here."""
    return default_tree_rule(sampling) if tree_rounds else default_rule(sampling)


def as_adaptive(adaptive) -> AdaptiveConfig | None:
    """SpeculativeConfig.adaptive (False, True, an AdaptiveConfig, or a mapping from YAML or
    JSON) as an AdaptiveConfig, or None when adaptive speculation is off."""
    if adaptive is False or adaptive is None:
        return None
    if adaptive is True:
        return AdaptiveConfig()
    if isinstance(adaptive, dict):
        return AdaptiveConfig(**adaptive)
    if not isinstance(adaptive, AdaptiveConfig):
        raise ValueError(f"adaptive must be True, False or a specjax.AdaptiveConfig, got {adaptive!r}")
    return adaptive


def plan_generation(
    target,
    prompts,
    config: GenerationConfig,
    drafter: Drafter | None = None,
    speculative: SpeculativeConfig | None = None,
) -> tuple[PromptBatch, Plan, object]:
    """(prompt batch, plan, the drafter's weights) after checking every argument. `drafter`
    None is plain decoding (`speculative` is then ignored)."""
    if not isinstance(config, GenerationConfig):
        raise ValueError(f"config must be a specjax.GenerationConfig, got {type(config).__name__}")
    sampling = config.sampling
    if drafter is None:
        batch = prepare_prompts(target, prompts, config.max_new_tokens, headroom=0)
        plan = Plan(target=target.config, drafter=None, num_speculative_tokens=0, sampling=sampling, rule=None,
                    cache=config.cache)  # fmt: skip
        return batch, plan, None
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
    adaptive = _adaptive_candidates(as_adaptive(speculative.adaptive), tree, int(k), target, drafter)
    schedule = as_verify_schedule(speculative.verify_schedule)
    if schedule is not None:
        if tree is not None or adaptive is not None:  # SpeculativeConfig refuses both already
            raise ValueError("verify_schedule runs chain rounds: pass neither a tree nor adaptive with it")
        schedule = schedule.resolved(int(k))
    if adaptive is not None and adaptive.trees:
        k = max(t.num_nodes for t in adaptive.trees)  # slots a round may write: the largest tree's nodes
    batch = prepare_prompts(target, prompts, config.max_new_tokens, headroom=k + 1)
    tree_rounds = tree is not None or (adaptive is not None and bool(adaptive.trees))
    plan = Plan(
        target=target.config,
        drafter=drafter.without_weights(),
        num_speculative_tokens=int(k),
        sampling=sampling,
        rule=speculative.rule or default_rule_for(sampling, tree_rounds),
        cache=config.cache,
        tree=tree,
        adaptive=adaptive,
        verify_schedule=schedule,
    )
    return batch, plan, drafter.weights()


def _adaptive_candidates(config: AdaptiveConfig | None, tree, k_max: int, target, drafter) -> AdaptiveConfig | None:
    """The static part of adaptive speculation (its candidates fixed for K_MAX and checked
    against the drafter, without costs or how to get them), or None when it is off."""
    if config is None:
        return None
    if tree is not None:
        raise ValueError(
            "adaptive speculation chooses its own rounds: pass no tree (AdaptiveConfig(trees=...) chooses among trees)"
        )
    static = config.resolved(k_max)
    if static.trees:
        for t in static.trees:
            drafter.check_tree(target.config, t)
    else:
        for k in static.ks:
            if k:
                drafter.check(target.config, k)
    return static
