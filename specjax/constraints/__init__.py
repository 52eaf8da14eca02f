"""Constrained generation: a JSON schema or a regular expression compiled to a token-level
automaton that the jitted loop steps on the device (docs/constraints.md).

    Constraint          what the output must match (constraint.py)
    token_bytes         the bytes each token id spells (vocabulary.py)
    GrammarTable        the compiled automaton, next_state [S, V] (table.py)
    GrammarState        its device form in the loop state, and the jittable steps (device.py)
"""

from specjax.constraints.constraint import Constraint, as_constraints
from specjax.constraints.table import GrammarTable, compile_constraint, grammar_for_rows, stack_tables
from specjax.constraints.vocabulary import token_bytes
from specjax.core.grammar import (
    GrammarState,
    after_commit,
    allowed,
    init_grammar,
    mask_logits,
    states_along,
    states_in_tree,
    step,
)

__all__ = [
    "Constraint",
    "GrammarState",
    "GrammarTable",
    "after_commit",
    "allowed",
    "as_constraints",
    "compile_constraint",
    "grammar_for_rows",
    "init_grammar",
    "mask_logits",
    "stack_tables",
    "states_along",
    "states_in_tree",
    "step",
    "token_bytes",
]
