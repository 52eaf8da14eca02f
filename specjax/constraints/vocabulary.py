"""The bytes each token id spells, the alphabet a constraint is compiled over.

A grammar constrains text, the model emits ids: the automaton (table.py) reads each token
as the bytes it adds to the output. Special tokens (BOS, chat markers, padding) spell
nothing and are never allowed; EOS is added by the table, in accepting states only.
How each tokenizer family spells its tokens is io/token_bytes.py's (shared with the
cross-vocabulary drafter's tables); here special tokens become None.

Done once per tokenizer (49,152 SmolLM2 tokens: tens of milliseconds), cached by identity.
"""

from __future__ import annotations

import contextlib
import weakref

_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def token_bytes(tokenizer, vocab_size: int) -> tuple[bytes | None, ...]:
    """[V] the bytes token id i adds to the text, or None where it spells nothing the
    grammar may use (special tokens, ids past the tokenizer's vocabulary: a model's padded
    embedding rows). `tokenizer` may also be a sequence of str | bytes | None (one per id)."""
    if tokenizer is None:
        raise ValueError(
            "a constraint needs the target's tokenizer (the model has none) to know what each token spells"
        )
    if isinstance(tokenizer, list | tuple):
        spelled = [t.encode("utf-8") if isinstance(t, str) else t for t in tokenizer]
        return _fit(spelled, vocab_size)
    try:
        cached = _cache.get(tokenizer)
    except TypeError:  # not weakly referenceable
        cached = None
    if cached is not None and len(cached) == vocab_size:
        return cached
    from specjax.io.token_bytes import spellings

    read = spellings(tokenizer, vocab_size)  # special tokens spell nothing a grammar may use
    out = _fit([None if special else b for b, special in zip(read.spelled, read.special, strict=True)], vocab_size)
    with contextlib.suppress(TypeError):  # not weakly referenceable: not cached
        _cache[tokenizer] = out
    return out


def _fit(spelled: list, vocab_size: int) -> tuple[bytes | None, ...]:
    """Pad with None (ids the tokenizer does not know) or cut to the model's vocabulary; an
    empty string spells nothing either."""
    spelled = list(spelled[:vocab_size]) + [None] * max(0, vocab_size - len(spelled))
    return tuple(s if s else None for s in spelled)
