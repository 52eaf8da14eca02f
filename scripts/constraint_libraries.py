"""Compare outlines-core, xgrammar and llguidance for constrained speculation in a jitted loop.

For SmolLM2-135M-Instruct's tokenizer (49,152 tokens, from its packaged GGUF), a JSON
schema and a regular expression, each library's compile time and per-token mask cost, the
size of outlines-core's dense table (what specjax puts on the device), and whether the three
agree on the allowed tokens along a valid output (the exactness check).

    python scripts/constraint_libraries.py [--out results/constraints/libraries.json]

xgrammar and llguidance are optional here (pip install xgrammar llguidance); specjax uses
outlines-core only.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "tags", "active"],
}
EXAMPLE = {"name": "Ada Lovelace", "age": 36, "role": "admin", "tags": ["math", "poetry"], "active": True}
REGEX = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])( [A-Z][a-z]{1,12}){1,3}\."
REGEX_EXAMPLE = "2024-03-15 Ada Lovelace Day."


def timed(fn):
    """(fn(), CPU seconds of this process): the machine is shared, so wall time says little."""
    began = time.process_time()
    out = fn()
    return out, time.process_time() - began


def outlines_side(tokenizer, vocab_size, eos, pattern_of, examples):
    import outlines_core

    from specjax.constraints import compile_constraint, token_bytes

    spelled, vocab_seconds = timed(lambda: token_bytes(tokenizer, vocab_size))
    rows = {}
    for name, constraint in pattern_of.items():
        pattern = constraint.pattern()
        by_bytes = {}
        for i, b in enumerate(spelled):
            if b is not None and i != eos:
                by_bytes.setdefault(b, []).append(i)
        vocabulary = outlines_core.Vocabulary(eos, by_bytes)
        _, index_seconds = timed(lambda p=pattern, v=vocabulary: outlines_core.Index(p, v))
        table, table_seconds = timed(lambda c=constraint: compile_constraint(c, spelled, (eos,)))
        # Masks along the example: one gather per token (numpy here; the loop does it on the device).
        state, masks, began = table.starts[0], [], time.process_time()
        for t in examples[name]:
            masks.append(table.next_state[state] >= 0)
            state = table.next_state[state, t]
            assert state >= 0, f"outlines-core forbids token {t} of the {name} example"
        mask_seconds = (time.process_time() - began) / len(examples[name])
        rows[name] = {
            "states": int((table.next_state >= 0).any(axis=1).sum()),  # live states, padding aside
            "table_states_padded": table.num_states,
            "table_mib": round(table.nbytes / 2**20, 1),
            "table_dtype": str(table.next_state.dtype),
            "index_seconds": round(index_seconds, 3),
            "table_seconds": round(table_seconds, 3),  # Index + dense table (the first cached call)
            "mask_microseconds_host_numpy": round(mask_seconds * 1e6, 1),
            "accepts_example": bool(table.final[state]),
            "masks": masks,
        }
    return {"vocabulary_seconds": round(vocab_seconds, 3), "constraints": rows}


def xgrammar_side(tokenizer, vocab_size, eos, examples):
    import xgrammar as xg

    info, info_seconds = timed(lambda: xg.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                                         stop_token_ids=[eos]))  # fmt: skip
    compiler = xg.GrammarCompiler(info, cache_enabled=False)
    compiled = {
        "json_schema": timed(
            lambda: compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":"))
        ),
        "regex": timed(lambda: compiler.compile_regex(REGEX)),
    }
    return {
        "tokenizer_info_seconds": round(info_seconds, 3),
        "constraints": _step_xgrammar(xg, compiled, examples, vocab_size),
    }


def _step_xgrammar(xg, compiled, examples, vocab_size):
    rows = {}
    for name, (grammar, seconds) in compiled.items():
        matcher = xg.GrammarMatcher(grammar)
        bitmask = xg.allocate_token_bitmask(1, vocab_size)
        masks, spent = [], 0.0
        for t in examples[name]:
            began = time.process_time()
            matcher.fill_next_token_bitmask(bitmask)
            spent += time.process_time() - began
            words = np.asarray(bitmask[0]).astype(np.uint32)
            masks.append(np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size].astype(bool))
            assert matcher.accept_token(t), f"xgrammar refuses token {t} of the {name} example"
        rows[name] = {
            "compile_seconds": round(seconds, 3),
            "mask_microseconds": round(spent / len(examples[name]) * 1e6, 1),
            "masks": masks,
        }
    return rows


def llguidance_side(tokenizer, vocab_size, eos, examples):
    import llguidance
    import llguidance.hf

    lltok, tok_seconds = timed(lambda: llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos))
    grammars = {
        "json_schema": llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(SCHEMA), defaults={"whitespace_flexible": False}
        ),
        "regex": llguidance.LLMatcher.grammar_from_regex(REGEX),
    }
    rows = {}
    for name, grammar in grammars.items():
        matcher, seconds = timed(lambda g=grammar: llguidance.LLMatcher(lltok, g))
        masks, spent = [], 0.0
        for t in examples[name]:
            began = time.process_time()
            words = np.frombuffer(matcher.compute_bitmask(), np.uint8)
            spent += time.process_time() - began
            masks.append(np.unpackbits(words.reshape(-1), bitorder="little")[:vocab_size].astype(bool))
            assert matcher.consume_token(t), (
                f"llguidance refuses token {t} of the {name} example: {matcher.get_error()}"
            )
        rows[name] = {
            "compile_seconds": round(seconds, 3),
            "mask_microseconds": round(spent / len(examples[name]) * 1e6, 1),
            "masks": masks,
        }
    return {"tokenizer_seconds": round(tok_seconds, 3), "constraints": rows}


def agreement(a, b, eos, spelled, examples):
    """Positions of the example where two libraries' allowed sets differ (EOS aside: the
    libraries place it differently), how many tokens differ in all, and a few of them
    (the text before, the token, and which side allows it)."""
    differing, tokens, shown = 0, 0, []
    for j, (x, y) in enumerate(zip(a, b, strict=True)):
        x, y = x.copy(), y.copy()
        x[eos] = y[eos] = False
        n = int(np.sum(x != y))
        differing += n > 0
        tokens += n
        for t in np.flatnonzero(x != y)[:2]:
            if len(shown) < 8:
                before = b"".join(spelled[i] for i in examples[:j]).decode(errors="replace")
                side = "outlines-core only" if x[t] else "other only"
                shown.append({"after": before[-12:], "token": repr(spelled[t]), "allowed_by": side})
    return {"positions_differing": differing, "tokens_differing": tokens, "positions": len(a), "examples": shown}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/constraints/libraries.json")
    args = parser.parse_args()

    from specjax.constraints import Constraint
    from specjax.io.gguf_file import packaged_path
    from specjax.io.gguf_tokenizer import gguf_tokenizer

    tokenizer = gguf_tokenizer(packaged_path("smollm2-135m-instruct"))
    vocab_size, eos = 49152, tokenizer.eos_token_id
    examples = {
        "json_schema": tokenizer.encode(json.dumps(EXAMPLE, separators=(",", ":")), add_special_tokens=False),
        "regex": tokenizer.encode(REGEX_EXAMPLE, add_special_tokens=False),
    }
    constraints = {"json_schema": Constraint(json_schema=SCHEMA, whitespace=""), "regex": Constraint(regex=REGEX)}
    report = {"tokenizer": "SmolLM2-135M-Instruct (GGUF)", "vocab_size": vocab_size, "schema": SCHEMA, "regex": REGEX}
    sides = {"outlines-core": outlines_side(tokenizer, vocab_size, eos, constraints, examples)}
    for name, fn in (("xgrammar", xgrammar_side), ("llguidance", llguidance_side)):
        try:
            sides[name] = fn(tokenizer, vocab_size, eos, examples)
        except Exception as error:  # an optional library missing or changed: say so, keep the rest
            sides[name] = {"error": f"{type(error).__name__}: {error}"}
    from specjax.constraints import token_bytes

    spelled = token_bytes(tokenizer, vocab_size)
    for name in ("json_schema", "regex"):
        ours = sides["outlines-core"]["constraints"][name]["masks"]
        for other in ("xgrammar", "llguidance"):
            if "constraints" in sides[other]:
                row = sides[other]["constraints"][name]
                row["agreement_with_outlines_core"] = agreement(ours, row["masks"], eos, spelled, examples[name])
    for side in sides.values():
        for row in side.get("constraints", {}).values():
            row.pop("masks", None)
    report["libraries"] = sides
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["libraries"], indent=2))


if __name__ == "__main__":
    main()
