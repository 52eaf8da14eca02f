"""Batch-size buckets: a batch runs padded to 1, 2, 4, 8, 16, 24, ... rows, and nothing shows it.

Padding rows copy row 0's prompt and start done; the collect step drops them. Every test
compares a bucketed run with the same call unbucketed (`_batch_bucket` monkeypatched to
the identity): tokens per row and every statistic must be identical, greedy and sampled.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import RAGGED_PROMPTS

import specjax
from specjax.bench.compiles import compiled_programs
from specjax.drafters import PromptLookup
from specjax.engine import prompts as prompts_module

PROMPTS = [*RAGGED_PROMPTS, [11, 12, 13, 14, 15, 11, 12]]  # 5 ragged rows
NEW = 12


@dataclasses.dataclass(frozen=True)
class _CountingLookup(PromptLookup):
    """Prompt lookup that counts its proposals in every row, finished or not (unlike
    no_match_rounds): only the collect step can keep padding rows out of this counter."""

    name = "counting_lookup"

    def init(self, weights, ctx, prompt, cache_length):
        return super().init(weights, ctx, prompt, cache_length), jnp.zeros(ctx.lengths.shape, jnp.int32)

    def propose(self, weights, state, ctx, key):
        proposal, inner = super().propose(weights, state[0], ctx, key)
        return proposal, (inner, state[1] + 1)

    def stats(self, state):
        return {**super().stats(state[0]), "proposals": state[1]}


def _unbucketed(monkeypatch):
    monkeypatch.setattr(prompts_module, "_batch_bucket", lambda n: n)


def _prepare(method, target, small_draft, prompts, temperature):
    config = specjax.GenerationConfig.at_temperature(temperature, max_new_tokens=NEW, seed=5)
    if method == "plain":
        return specjax.prepare(target, prompts, config)
    draft = small_draft if method == "draft_model" else _CountingLookup()
    return specjax.prepare(
        target, prompts, config, draft=draft, speculative=specjax.SpeculativeConfig(num_speculative_tokens=3)
    )


def _run(method, target, small_draft, prompts, temperature):
    return _prepare(method, target, small_draft, prompts, temperature).run()


def test_batch_bucket_rule():
    sizes = [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 24, 25, 64, 65]
    assert [prompts_module._batch_bucket(n) for n in sizes] == [1, 2, 4, 4, 8, 8, 8, 16, 16, 24, 24, 32, 64, 72]
    assert len({prompts_module._batch_bucket(n) for n in range(1, 65)}) == 11


def test_padding_rows_copy_row_0_and_start_done(target):
    batch = prompts_module.prepare_prompts(target, PROMPTS[:3], max_new_tokens=8, headroom=0)
    assert (batch.batch_size, batch.num_rows, batch.bucket_rows) == (3, 3, 4)
    np.testing.assert_array_equal(batch.tokens[3], batch.tokens[0])
    assert batch.lengths.tolist() == [3, 17, 1, 3]
    prompt, lengths, done, _, _ = batch.loop_inputs(None, 0)
    assert lengths.tolist() == [3, 17, 1, 3]
    assert prompt.shape == (4, 32) and done.tolist() == [False, False, False, True]
    assert [x.shape[0] for x in batch.loop_inputs(None, 0, padded=False)[:3]] == [3, 3, 3]
    assert specjax.prepare(target, PROMPTS[:3], specjax.GenerationConfig(max_new_tokens=8)).batch_size == 3


@pytest.mark.parametrize("method", ["plain", "draft_model", "prompt_lookup"])
def test_padding_rows_generate_nothing_and_count_nowhere(target, small_draft, method):
    """The raw loop state of 3 rows run as 4: the padding row is done from the start, so it
    appends nothing and counts in no round and no acceptance; only a counter a drafter
    keeps for every row (proposals) sees it, which is why collect drops padding rows."""
    prepared = _prepare(method, target, small_draft, PROMPTS[:3], 1.0)
    state = prepared.launch()
    assert prepared.batch_size == 3 and state.tokens.shape[0] == 4
    assert np.asarray(state.done).all()
    generated = np.asarray(state.lengths) - np.asarray(state.prompt_lengths)
    assert generated.tolist() == [NEW, NEW, NEW, 0]
    row_rounds = np.asarray(state.row_rounds)
    assert (row_rounds[:3] > 0).all() and row_rounds[3] == 0
    if method != "plain":
        assert np.asarray(state.accepted_at)[:3].any() and not np.asarray(state.accepted_at)[3].any()
    if method == "prompt_lookup":
        counters = jax.device_get(state.plan.drafter.stats(state.draft_state))
        assert counters["no_match_rounds"][3] == 0
        assert counters["proposals"][3] == int(state.forwards) > 0


@pytest.mark.parametrize("method", ["plain", "draft_model", "prompt_lookup"])
@pytest.mark.parametrize(("rows", "temperature"), [(3, 0.0), (5, 0.0), (3, 1.0)])  # 3 -> 4 rows, 5 -> 8
def test_bucketed_equals_unbucketed(monkeypatch, target, small_draft, method, rows, temperature):
    prompts = PROMPTS[:rows]
    bucketed = _run(method, target, small_draft, prompts, temperature)
    _unbucketed(monkeypatch)
    unbucketed = _run(method, target, small_draft, prompts, temperature)
    assert len(bucketed.tokens) == rows
    assert [len(t) for t in bucketed.tokens] == [NEW] * rows
    assert bucketed.tokens == unbucketed.tokens  # per row
    assert bucketed.stats.to_dict() == unbucketed.stats.to_dict()  # rounds, accepted, generated, drafter counters
    if method == "prompt_lookup":
        counters = bucketed.stats.drafter
        assert counters["kind"] == "counting_lookup"
        # Proposals are counted in every row of every round: padding rows would add theirs.
        assert counters["proposals"] == rows * bucketed.stats.target_forwards
        assert counters["no_match_rounds"] > 0


@pytest.mark.parametrize("method", ["draft_model", "prompt_lookup"])
def test_bucketed_greedy_speculative_equals_plain(target, small_draft, method):
    plain = _run("plain", target, small_draft, PROMPTS[:3], 0.0)
    speculative = _run(method, target, small_draft, PROMPTS[:3], 0.0)
    assert speculative.tokens == plain.tokens
    assert speculative.stats.generated_tokens == plain.stats.generated_tokens == 3 * NEW
    # Padding rows are done from the start: they run in no round and accept nothing.
    assert speculative.stats.rounds <= 3 * speculative.stats.target_forwards


@pytest.mark.parametrize("bucketed", [True, False])
def test_batches_of_3_and_4_share_one_program(monkeypatch, target, bucketed):
    """With buckets, 3 rows run the program 4 rows compiled; without them (the control,
    which proves the counter can see it) 3 rows compile their own."""
    if not bucketed:
        _unbucketed(monkeypatch)
    jax.clear_caches()  # so that programs compiled by earlier tests do not hide a compile
    config = specjax.GenerationConfig(max_new_tokens=9)
    lookup, k2 = PromptLookup(max_ngram=2), specjax.SpeculativeConfig(num_speculative_tokens=2)
    specjax.generate(target, PROMPTS[:4], config)
    specjax.generate(target, PROMPTS[:4], config, draft=lookup, speculative=k2)
    before = compiled_programs()
    specjax.generate(target, PROMPTS[1:4], config.replace(seed=1))
    specjax.generate(target, PROMPTS[:3], config, draft=lookup, speculative=k2)
    # Without buckets: the empty cache of 3 rows (shared by both calls), then a prefill and a
    # round program per call.
    assert compiled_programs() - before == (0 if bucketed else 5)
