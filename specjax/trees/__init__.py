"""Static token trees: the structure (tree.py), its acceptance rules (acceptance.py) and tuning (tune.py)."""

from specjax.trees.acceptance import tree_greedy_rule, tree_no_residual_rule, tree_rejection_rule
from specjax.trees.tree import PRESETS, Tree

__all__ = ["PRESETS", "Tree", "tree_greedy_rule", "tree_no_residual_rule", "tree_rejection_rule"]
