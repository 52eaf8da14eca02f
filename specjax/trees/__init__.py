"""Static token trees: the structure (tree.py), its acceptance rules (tree_acceptance.py) and tuning (tune.py)."""

from specjax.trees.tree import PRESETS, Tree
from specjax.trees.tree_acceptance import tree_greedy_rule, tree_no_residual_rule, tree_rejection_rule

__all__ = ["PRESETS", "Tree", "tree_greedy_rule", "tree_no_residual_rule", "tree_rejection_rule"]
