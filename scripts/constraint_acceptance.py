"""Acceptance and speed of speculation under a constraint, with and without masking the draft.

For a target/draft pair and a JSON schema, three speculative runs beside plain decoding:
free (no constraint), constrained with the draft proposing under the same mask (the
default: drafters/proposing.py draft_chain), and constrained with the draft proposing
unmasked (forbidden drafts are rejected by the masked target). Greedy outputs must agree
with plain constrained decoding; the script checks it.

    python scripts/constraint_acceptance.py [--target stdlib-target --draft stdlib-draft]
        [--out results/constraints/acceptance_stdlib.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import specjax
from specjax.constraints import Constraint
from specjax.drafters import Drafter, as_drafter

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "language": {"enum": ["python", "c", "rust", "go"]},
        "lines": {"type": "integer"},
        "tested": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "language", "lines", "tested", "tags"],
}
PROMPTS = [
    "Describe the file parse_args.py as JSON: ",
    "# A JSON record of the module:\nrecord = ",
    "Metadata of utils/strings.py in JSON:\n",
    "The build script, as a JSON object: ",
]


@dataclasses.dataclass(frozen=True)
class Unmasked(Drafter):
    """The inner drafter proposing as if there were no constraint (the control)."""

    inner: Drafter
    name = "unmasked"

    def weights(self):
        return self.inner.weights()

    def without_weights(self):
        return Unmasked(self.inner.without_weights())

    def check(self, target_config, k):
        self.inner.check(target_config, k)

    def init(self, weights, ctx, prompt, cache_length):
        return self.inner.init(weights, ctx, prompt, cache_length)

    def propose(self, weights, state, ctx, key):
        return self.inner.propose(weights, state, ctx.replace(grammar=None), key)

    def update(self, weights, state, ctx, num_accepted):
        return self.inner.update(weights, state, ctx, num_accepted)


def timed_run(target, prompts, config, **kwargs):
    prepared = specjax.prepare(target, prompts, config, **kwargs)
    prepared.run()  # compiles
    began = time.perf_counter()
    out = prepared.run()
    return out, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="stdlib-target")
    parser.add_argument("--draft", default="stdlib-draft")
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", default="results/constraints/acceptance_stdlib.json")
    args = parser.parse_args()

    target = specjax.load_model(args.target)
    draft = as_drafter(specjax.load_model(args.draft))
    spec = specjax.SpeculativeConfig(num_speculative_tokens=args.k)
    constrained = specjax.GenerationConfig(
        max_new_tokens=args.max_new_tokens, constraint=Constraint(json_schema=SCHEMA)
    )
    free = constrained.replace(constraint=None)
    runs = {
        "plain_free": (free, {}),
        "speculative_free": (free, dict(draft=draft, speculative=spec)),
        "plain_constrained": (constrained, {}),
        "speculative_constrained_masked_draft": (constrained, dict(draft=draft, speculative=spec)),
        "speculative_constrained_unmasked_draft": (constrained, dict(draft=Unmasked(draft), speculative=spec)),
    }
    rows = {}
    outputs = {}
    for name, (config, kwargs) in runs.items():
        out, seconds = timed_run(target, PROMPTS, config, **kwargs)
        outputs[name] = out.tokens
        s = out.stats
        rows[name] = {
            "seconds": round(seconds, 3),  # wall, one run: noisy on a shared CPU
            "generated_tokens": s.generated_tokens,
            "target_forwards": s.target_forwards,
            "mean_acceptance_length": None if name.startswith("plain") else round(s.mean_acceptance_length, 3),
            "acceptance_rate": None if name.startswith("plain") else round(s.acceptance_rate, 3),
            "accepted_tokens": s.accepted_tokens,
            "drafted_tokens": s.drafted_tokens,
        }
        print(name, rows[name], flush=True)
    exact = {
        name: outputs[name] == outputs["plain_constrained"]
        for name in runs
        if "constrained" in name and "speculative" in name
    }
    texts = [target.tokenizer.decode(t, skip_special_tokens=True) for t in outputs["plain_constrained"]]
    parsed = []
    for text in texts:
        try:
            json.loads(text)
            parsed.append(True)
        except json.JSONDecodeError:
            parsed.append(False)
    report = {
        "command": f"python scripts/constraint_acceptance.py --target {args.target} --draft {args.draft} -k {args.k} "
        f"--max-new-tokens {args.max_new_tokens}",
        "schema": SCHEMA,
        "prompts": PROMPTS,
        "rows": rows,
        "greedy_equals_plain_constrained": exact,
        "constrained_texts": texts,
        "texts_parse_as_json": parsed,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"exact": exact, "parsed": parsed, "texts": texts}, indent=2))


if __name__ == "__main__":
    main()
