"""What a constrained output must match: a JSON schema or a regular expression.

A `Constraint` is a small frozen (hashable) value; `GenerationConfig.constraint` takes one
for every row, or one per prompt (None: that row is free). It is compiled against the
target's vocabulary only when a generation is planned (table.py), so building one costs
nothing and needs no tokenizer.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence

# A table above this many bytes on the device is refused (a schema that compiles to
# thousands of states over a 49k-token vocabulary); `max_table_bytes` raises it.
DEFAULT_MAX_TABLE_BYTES = 1 << 30


@dataclasses.dataclass(frozen=True)
class Constraint:
    """The output of a row must match `regex`, or be JSON valid against `json_schema`
    (exactly one of them). The generated text is the continuation only, not the prompt.

    json_schema: the schema as JSON text (a mapping is accepted and stored as JSON text, so
      the constraint stays hashable). Properties are generated in the schema's order.
    regex: a regular expression in the syntax of Rust's `regex` crate (what outlines-core
      compiles: no look-around, no back-references); it must match the whole continuation.
    whitespace: with json_schema, the regex of the whitespace allowed between JSON tokens;
      None: outlines-core's default `[ ]?` (at most one space), which keeps a model from
      filling its budget with blanks.
    max_table_bytes: refuse a compiled table larger than this (states x vocabulary x 2 or 4 bytes).
    """

    json_schema: str | None = None
    regex: str | None = None
    whitespace: str | None = None
    max_table_bytes: int = DEFAULT_MAX_TABLE_BYTES

    def __post_init__(self):
        if isinstance(self.json_schema, Mapping):
            # Key order kept: outlines-core emits an object's properties in the schema's order.
            object.__setattr__(self, "json_schema", json.dumps(self.json_schema))
        if (self.json_schema is None) == (self.regex is None):
            raise ValueError("a Constraint takes exactly one of json_schema and regex")
        if self.regex is not None and (not isinstance(self.regex, str) or not self.regex):
            raise ValueError(f"Constraint.regex must be a non-empty string, got {self.regex!r}")
        if self.json_schema is not None:
            if not isinstance(self.json_schema, str):
                raise ValueError(f"Constraint.json_schema must be JSON text or a mapping, got {self.json_schema!r}")
            try:
                json.loads(self.json_schema)
            except json.JSONDecodeError as error:
                raise ValueError(f"Constraint.json_schema is not valid JSON: {error}") from None
        elif self.whitespace is not None:
            raise ValueError("Constraint.whitespace applies to json_schema only")
        if not isinstance(self.max_table_bytes, int) or self.max_table_bytes < 1:
            raise ValueError(f"Constraint.max_table_bytes must be an integer >= 1, got {self.max_table_bytes!r}")

    def pattern(self) -> str:
        """The regular expression the output must match (a schema's, built by outlines-core)."""
        if self.regex is not None:
            return self.regex
        from outlines_core.json_schema import build_regex_from_schema

        try:
            return build_regex_from_schema(self.json_schema, self.whitespace)
        except (ValueError, TypeError, RuntimeError) as error:
            raise ValueError(f"JSON schema not supported: {error}") from None

    def check_syntax(self) -> None:
        """Raise the ValueError a bad regex or schema would raise at compile time, now and
        without a tokenizer (the automaton over a one-token vocabulary: no token walk)."""
        import outlines_core

        pattern = self.pattern()
        try:
            outlines_core.Index(pattern, outlines_core.Vocabulary(1, {b"a": [0]}))
        except (ValueError, TypeError, RuntimeError) as error:
            if "incompatible" not in str(error):  # a valid pattern the one token cannot spell is fine here
                raise ValueError(f"cannot compile the constraint's regex {pattern[:80]!r}: {error}") from None

    def describe(self) -> str:
        """A short name for reports."""
        text = self.regex if self.regex is not None else self.json_schema
        kind = "regex" if self.regex is not None else "json_schema"
        return f"{kind}: {text if len(text) <= 60 else text[:57] + '...'}"

    @classmethod
    def parse(cls, value) -> Constraint:
        """A Constraint, or a mapping of its fields ({regex: ...} or {json_schema: ...}: YAML/JSON)."""
        if isinstance(value, Constraint):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {f.name for f in dataclasses.fields(cls)}
            if unknown:
                raise ValueError(f"constraint: unknown key {sorted(unknown)[0]!r}; valid keys: json_schema, regex, "
                                 "whitespace, max_table_bytes")  # fmt: skip
            return cls(**value)
        raise ValueError(f"a constraint is a specjax.Constraint or a mapping {{regex: ...}}, got {value!r}")


def normalise(value) -> Constraint | tuple[Constraint | None, ...] | None:
    """GenerationConfig.constraint as given (None, one, a mapping, or a list per prompt) in
    its stored form: None, one Constraint, or a tuple of Constraint | None."""
    if value is None:
        return None
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        if not value:
            raise ValueError("constraint: an empty list; pass None for no constraint")
        return tuple(None if c is None else Constraint.parse(c) for c in value)
    return Constraint.parse(value)


def as_constraints(value, rows: int) -> tuple[Constraint | None, ...] | None:
    """One Constraint | None per row (None when no row is constrained); a list must have
    one entry per prompt."""
    value = normalise(value)
    if value is None:
        return None
    if isinstance(value, Constraint):
        return (value,) * rows
    if len(value) != rows:
        raise ValueError(f"constraint: {len(value)} constraints for {rows} prompts; pass one, or one per prompt")
    return None if all(c is None for c in value) else value
