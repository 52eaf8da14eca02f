"""A constraint compiled to a dense token-level automaton: next_state [S, V].

outlines-core builds the automaton: the constraint's regex (a JSON schema's, built by
`outlines_core.json_schema`) as a DFA over bytes, walked along every token's bytes, gives
for each state the tokens that keep the text a prefix of some match and the state each
leads to (an `Index`). Here that becomes one table the device gathers from:

    next_state[s, v]  the state after token v in state s; -1: v is forbidden in s
    final[s]          s accepts (the text so far is a whole match)

EOS (the generation's stop ids) leads from an accepting state to itself and is forbidden
elsewhere, so a row can only stop on a whole match, and a state that accepts with no way
on allows only EOS (forced). States from which no accepting state can be reached are cut
out, with every token leading into them: a row never enters a dead end. Rows with
different constraints share one table, their states offset (`stack_tables`); a row's
start state says which automaton it runs.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import deque

import numpy as np

from specjax.constraints.constraint import Constraint
from specjax.constraints.vocabulary import token_bytes

STATE_ROUND = 64  # states are padded to a multiple of this: similar constraints share a compiled loop


@dataclasses.dataclass(frozen=True, eq=False)
class GrammarTable:
    """One or several compiled constraints. next_state [S, V] int16 (int32 past 32,767
    states), -1 = forbidden; final [S] bool; starts [R] int32: the start state of each
    constraint stacked in (R = 1 for one). Rows past the real states pad S (unreachable)."""

    next_state: np.ndarray
    final: np.ndarray
    starts: np.ndarray

    @property
    def num_states(self) -> int:
        return self.next_state.shape[0]

    @property
    def nbytes(self) -> int:
        return self.next_state.nbytes


def _dtype(num_states: int):
    return np.int16 if num_states <= np.iinfo(np.int16).max else np.int32


def _padded(num_states: int) -> int:
    return -(-num_states // STATE_ROUND) * STATE_ROUND


def compile_constraint(
    constraint: Constraint, spelled: tuple[bytes | None, ...], eos_ids: tuple[int, ...]
) -> GrammarTable:
    """The table of `constraint` over a vocabulary of len(spelled) ids (token_bytes), EOS
    being `eos_ids`. A ValueError names what is wrong: a bad regex or schema, a constraint
    no token sequence can satisfy, or a table over constraint.max_table_bytes."""
    if not eos_ids:
        raise ValueError("a constraint needs an EOS token to end on: set eos_token_id (ignore_eos keeps the model's)")
    return _compile(constraint, spelled, tuple(int(i) for i in eos_ids))


@functools.lru_cache(maxsize=4)  # tables can be large: keep the last few
def _compile(constraint: Constraint, spelled: tuple[bytes | None, ...], eos_ids: tuple[int, ...]) -> GrammarTable:
    import outlines_core

    vocab_size = len(spelled)
    stops = set(eos_ids)
    by_bytes: dict[bytes, list[int]] = {}
    for i, b in enumerate(spelled):
        if b is not None and i not in stops:
            by_bytes.setdefault(b, []).append(i)
    if not by_bytes:
        raise ValueError("a constraint needs a vocabulary: no token of the tokenizer spells any text")
    pattern = constraint.pattern()
    try:
        index = outlines_core.Index(pattern, outlines_core.Vocabulary(eos_ids[0], by_bytes))
    except (ValueError, TypeError, RuntimeError) as error:
        raise ValueError(f"cannot compile the constraint's regex {_short(pattern)!r}: {error}") from None
    # Per state: the tokens it allows and where each leads (numpy: SmolLM2 schemas have ~10^6).
    edges = {
        s: (np.fromiter(out.keys(), np.int64, len(out)), np.fromiter(out.values(), np.int64, len(out)))
        for s, out in index.get_transitions().items()
    }
    successors = {s: set(np.unique(targets).tolist()) for s, (_, targets) in edges.items()}
    finals = set(index.get_final_states())
    start = index.get_initial_state()
    order = _live_states(start, successors, finals)
    if not order:
        raise ValueError(f"the constraint {constraint.describe()!r} matches no text this tokenizer's tokens can spell")
    num_states = _padded(len(order))
    dtype = _dtype(num_states)
    size = num_states * vocab_size * np.dtype(dtype).itemsize
    if size > constraint.max_table_bytes:
        raise ValueError(
            f"the constraint {constraint.describe()!r} compiles to {len(order)} states x {vocab_size} tokens "
            f"({size / 2**20:.0f} MiB), over max_table_bytes ({constraint.max_table_bytes / 2**20:.0f} MiB): "
            "simplify it (bound strings and arrays) or raise Constraint.max_table_bytes"
        )
    ids = np.asarray(order, np.int64)  # outlines-core state -> dense index: searchsorted on the sorted ids
    by_id = np.argsort(ids)
    next_state = np.full((num_states, vocab_size), -1, dtype)
    final = np.zeros((num_states,), bool)
    eos = np.asarray([i for i in eos_ids if 0 <= i < vocab_size], np.int64)
    for i, s in enumerate(order):
        if s in edges:
            tokens, targets = edges[s]
            at = np.minimum(np.searchsorted(ids[by_id], targets), len(ids) - 1)
            live = ids[by_id][at] == targets  # transitions into dead states are dropped
            next_state[i, tokens[live]] = by_id[at[live]]
        next_state[i, eos] = -1  # EOS is the table's to place, below
        if s in finals:
            final[i] = True
            next_state[i, eos] = i  # stop only on a whole match; after EOS the row is done
    return GrammarTable(next_state, final, np.zeros((1,), np.int32))


def _live_states(start, successors: dict, finals: set) -> list:
    """States reachable from `start` (successors: state -> the states it leads to) from
    which an accepting state is reachable, start first (empty when the start is dead)."""
    reached, queue = {start}, deque([start])
    while queue:
        for n in successors.get(queue.popleft(), ()):
            if n not in reached:
                reached.add(n)
                queue.append(n)
    into: dict = {}
    for s in reached:
        for n in successors.get(s, ()):
            into.setdefault(n, set()).add(s)
    live = {s for s in reached if s in finals}
    queue = deque(live)
    while queue:
        for s in into.get(queue.popleft(), ()):
            if s not in live:
                live.add(s)
                queue.append(s)
    if start not in live:
        return []
    return [start, *sorted(s for s in live if s != start)]


def free_table(vocab_size: int) -> GrammarTable:
    """One accepting state allowing every token: an unconstrained row among constrained ones."""
    return GrammarTable(np.zeros((1, vocab_size), np.int16), np.ones((1,), bool), np.zeros((1,), np.int32))


def stack_tables(tables: list[GrammarTable]) -> GrammarTable:
    """One table holding every table's states, offset; starts lists each one's start state."""
    offsets = np.cumsum([0] + [t.num_states for t in tables[:-1]])
    num_states = _padded(sum(t.num_states for t in tables))
    dtype = _dtype(num_states)
    vocab_size = tables[0].next_state.shape[1]
    next_state = np.full((num_states, vocab_size), -1, dtype)
    final = np.zeros((num_states,), bool)
    for table, offset in zip(tables, offsets, strict=True):
        rows = slice(offset, offset + table.num_states)
        block = table.next_state.astype(dtype)
        next_state[rows] = np.where(block >= 0, block + offset, -1)
        final[rows] = table.final
    starts = np.concatenate([t.starts + o for t, o in zip(tables, offsets, strict=True)]).astype(np.int32)
    return GrammarTable(next_state, final, starts)


def grammar_for_rows(
    constraints: tuple[Constraint | None, ...], tokenizer, vocab_size: int, eos_ids: tuple[int, ...], rows: int
) -> tuple[GrammarTable, np.ndarray]:
    """The table serving every row and the start state of each of `rows` rows [rows] int32:
    row r < len(constraints) runs constraints[r] (None: free), the rest (a batch bucket's
    padding, finished from the start) row 0's."""
    spelled = None
    distinct: dict = {}
    for c in constraints:
        if c not in distinct:
            if c is None:
                distinct[c] = free_table(vocab_size)
            else:
                spelled = spelled or token_bytes(tokenizer, vocab_size)
                distinct[c] = compile_constraint(c, spelled, eos_ids)
    table = stack_tables(list(distinct.values()))
    start_of = dict(zip(distinct, table.starts, strict=True))
    starts = np.asarray([start_of[c] for c in constraints], np.int32)
    starts = np.concatenate([starts, np.full((rows - len(starts),), starts[0], np.int32)])
    return table, starts


def _short(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."
