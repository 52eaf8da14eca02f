"""Prompt-lookup matching, on hand-made token buffers (no model)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from specjax.drafters.prompt_lookup import lookup

PAD = 0


def _run(rows, k=4, max_ngram=3, min_ngram=1, prefer="latest", width=16):
    """rows: committed tokens per row; the buffer is padded with PAD up to `width` slots."""
    tokens = np.full((len(rows), width), PAD, np.int32)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    lengths = jnp.asarray([len(r) for r in rows], jnp.int32)
    proposal, found = lookup(jnp.asarray(tokens), lengths, k, max_ngram, min_ngram, prefer)
    return np.asarray(proposal).tolist(), np.asarray(found).tolist()


def test_latest_and_earliest_occurrence():
    # The suffix [7] occurs at slots 0 and 3: what followed them was 1 and 2.
    row = [7, 1, 5, 7, 2, 5, 7]
    assert _run([row], k=2, max_ngram=1, prefer="latest") == ([[2, 5]], [True])
    assert _run([row], k=2, max_ngram=1, prefer="earliest") == ([[1, 5]], [True])


def test_longest_ngram_wins_then_falls_back():
    # Suffix [3, 4]: the bigram occurs once (followed by 8); the unigram [4] occurs later
    # (followed by 9). max_ngram 2 takes the bigram; min_ngram = max_ngram = 1 the unigram.
    row = [3, 4, 8, 4, 9, 3, 4]
    assert _run([row], k=1, max_ngram=2) == ([[8]], [True])
    assert _run([row], k=1, max_ngram=1) == ([[9]], [True])
    # With only 3-grams allowed nothing matches.
    assert _run([row], k=1, max_ngram=3, min_ngram=3)[1] == [False]


def test_no_match_proposes_the_last_token():
    assert _run([[1, 2, 3]], k=3) == ([[3, 3, 3]], [False])
    # A one-token row cannot have an earlier occurrence.
    assert _run([[5]], k=2) == ([[5, 5]], [False])


def test_continuation_running_into_the_end_repeats_periodically():
    # Suffix [1, 2] matched at slot 0; the continuation [3, 1, 2] reaches the end, then the
    # repetition it implies continues: 3 1 2 3 1 2 ...
    row = [1, 2, 3, 1, 2]
    assert _run([row], k=7, max_ngram=2) == ([[3, 1, 2, 3, 1, 2, 3]], [True])
    # The tightest period: [9, 9, 9] after suffix [9] (latest match at slot 1) proposes 9s.
    assert _run([[4, 9, 9]], k=3, max_ngram=1) == ([[9, 9, 9]], [True])


def test_padding_and_stale_slots_are_never_matched():
    # Slots past the length hold the suffix token (stale drafts) and a continuation: no match.
    tokens = np.array([[1, 2, 6, 6, 6, 7, 7, 7]], np.int32)
    proposal, found = lookup(jnp.asarray(tokens), jnp.asarray([3], jnp.int32), 3, 2, 1, "latest")
    assert np.asarray(found).tolist() == [False]
    assert np.asarray(proposal).tolist() == [[6, 6, 6]]
    # The PAD value itself is not special: a row whose suffix is 0 matches an earlier 0 only.
    assert _run([[0, 5, 0]], k=2, max_ngram=1) == ([[5, 0]], [True])


def test_rows_are_independent():
    rows = [[7, 1, 5, 7], [1, 2, 3], [4, 4]]
    proposals, found = _run(rows, k=2, max_ngram=2)
    assert found == [True, False, True]
    assert proposals == [[1, 5], [3, 3], [4, 4]]
