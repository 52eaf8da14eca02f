"""docs/drafters.md "Writing your own drafter": the example drafter, run as written.

Sybil (the root conftest.py) only executes the block, which defines the class; this test
uses it as a drafter and checks what the page says about it."""

from __future__ import annotations

import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from conftest import RAGGED_PROMPTS

import specjax

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "drafters.md"


def _example_namespace() -> dict:
    section = GUIDE.read_text().split("## Writing your own drafter", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, str(GUIDE), "exec"), namespace)
    return namespace


def test_readme_drafter_is_exact_and_learns_from_its_table(target):
    bigram = _example_namespace()["BigramDrafter"]
    config = specjax.GenerationConfig(max_new_tokens=16)
    plain = specjax.generate(target, RAGGED_PROMPTS, config)
    # A table fitted to the target's own greedy outputs (the last seen successor of each
    # token) is often right; the same table shifted by one is almost never right.
    vocab = target.config.vocab_size
    fitted = np.arange(vocab)
    for prompt, generated in zip(RAGGED_PROMPTS, plain.tokens, strict=True):
        row = [*prompt, *generated]
        fitted[row[:-1]] = row[1:]
    good = bigram(table=jnp.asarray(fitted, jnp.int32))
    bad = bigram(table=jnp.asarray((fitted + 1) % vocab, jnp.int32))
    results = {}
    for name, drafter in (("good", good), ("bad", bad)):
        speculative = specjax.SpeculativeConfig(num_speculative_tokens=3)
        out = specjax.generate(target, RAGGED_PROMPTS, config, draft=drafter, speculative=speculative)
        assert out.tokens == plain.tokens
        assert out.stats.drafter == {"kind": "bigram"}
        results[name] = out.stats.acceptance_rate
    assert results["good"] > results["bad"]
    # Different tables are weights, not configuration: one compiled program serves both.
    assert good.without_weights() == bad.without_weights()
