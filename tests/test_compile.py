"""One compiled program per call signature: no recompiles across rounds or repeated calls."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import pytest
from conftest import RAGGED_PROMPTS

import specjax
from specjax.drafters import LayerSkip, PromptLookup


class _CompileLog(logging.Handler):
    def __init__(self):
        super().__init__()
        self.names = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Compiling "):
            self.names.append(message.split()[1])


@pytest.fixture
def compiles():
    # Start from empty jit caches, so "the first call compiles once" holds whichever test
    # file compiled the same program earlier in the session.
    jax.clear_caches()
    handler = _CompileLog()
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    with jax.log_compiles(True):
        yield handler.names
    logger.removeHandler(handler)


def _generation_compiles(names):
    return [n for n in names if "_generate" in n or "_round" in n]


def test_no_recompile_on_second_speculative_call(target, noisy_draft, compiles):
    config, k3 = specjax.GenerationConfig(max_new_tokens=20), specjax.SpeculativeConfig(num_speculative_tokens=3)
    specjax.generate(target, RAGGED_PROMPTS, config, draft=noisy_draft, speculative=k3)
    first = len(_generation_compiles(compiles))
    assert first == 1
    # Same batch size, K and prompt bucket; different prompts, lengths, seed, EOS and a
    # max_new_tokens inside the same cache bucket.
    other = [list(reversed(p)) for p in RAGGED_PROMPTS[1:]] + [[5, 6, 7, 8, 9]]
    specjax.generate(target, other, config.replace(seed=3, eos_token_id=4), draft=noisy_draft, speculative=k3)
    specjax.generate(target, other, config.replace(max_new_tokens=22), draft=noisy_draft, speculative=k3)
    assert len(_generation_compiles(compiles)) == first


def test_no_recompile_on_second_plain_call(target, compiles):
    specjax.generate(target, RAGGED_PROMPTS, specjax.GenerationConfig(max_new_tokens=20))
    first = len(_generation_compiles(compiles))
    assert first == 1
    # The longest prompt (17 tokens) and this one (20) share the 32-token bucket.
    specjax.generate(target, [[9] * 20] * len(RAGGED_PROMPTS), specjax.GenerationConfig(max_new_tokens=21, seed=4))
    assert len(_generation_compiles(compiles)) == first


def test_speculative_step_compiles_once_across_rounds(target, noisy_draft, compiles):
    state = specjax.init_state(
        target,
        RAGGED_PROMPTS,
        specjax.GenerationConfig(max_new_tokens=16),
        draft=noisy_draft,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=2),
    )
    for _ in range(5):
        state = specjax.step(target, state, draft=noisy_draft)
    assert len([n for n in compiles if "_round" in n]) == 1


def test_new_k_is_a_new_program(target, noisy_draft, compiles):
    """The counter above is real: changing a static value does compile."""
    specjax.generate(
        target,
        RAGGED_PROMPTS,
        specjax.GenerationConfig(max_new_tokens=8),
        draft=noisy_draft,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=2),
    )
    before = len(_generation_compiles(compiles))
    specjax.generate(
        target,
        RAGGED_PROMPTS,
        specjax.GenerationConfig(max_new_tokens=8),
        draft=noisy_draft,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=4),
    )
    assert len(_generation_compiles(compiles)) == before + 1


def test_prepared_calls_time_one_program_for_every_token_budget(target, noisy_draft, compiles):
    # The bench times latency with launch() and time-to-first-token with launch(1): both
    # must run the program compiled once, or TTFT would include a compile.
    for prepared in (
        specjax.prepare(target, RAGGED_PROMPTS, specjax.GenerationConfig(max_new_tokens=24)),
        specjax.prepare(
            target,
            RAGGED_PROMPTS,
            specjax.GenerationConfig(max_new_tokens=24),
            draft=noisy_draft,
            speculative=specjax.SpeculativeConfig(num_speculative_tokens=3),
        ),
    ):
        full = prepared.run()
        before = len(_generation_compiles(compiles))
        assert [len(t) for t in prepared.run(1).tokens] == [1] * len(RAGGED_PROMPTS)
        assert [t[:5] for t in prepared.run(5).tokens] == [t[:5] for t in full.tokens]
        assert len(_generation_compiles(compiles)) == before
    with pytest.raises(ValueError, match=r"max_new_tokens must lie in \[1, 24\]"):
        prepared.launch(25)


def test_drafters_with_other_weights_share_one_program(target, noisy_draft, small_draft, compiles):
    """A drafter is keyed by its configuration, never by its weights: two draft models of
    one config, or a layer skip over two targets of one config, reuse the program; another
    drafter configuration compiles anew."""
    config, k3 = specjax.GenerationConfig(max_new_tokens=12), specjax.SpeculativeConfig(num_speculative_tokens=3)
    other_draft = specjax.Model(noisy_draft.config, jax.tree.map(lambda x: x * 0.5, noisy_draft.params))
    other_target = specjax.Model(target.config, jax.tree.map(lambda x: x * 0.9, target.params))
    specjax.generate(target, RAGGED_PROMPTS, config, draft=noisy_draft, speculative=k3)
    specjax.generate(target, RAGGED_PROMPTS, config, draft=other_draft, speculative=k3)
    assert len(_generation_compiles(compiles)) == 1
    specjax.generate(target, RAGGED_PROMPTS, config, draft=LayerSkip(1), speculative=k3)
    specjax.generate(other_target, RAGGED_PROMPTS, config, draft=LayerSkip(1), speculative=k3)
    assert len(_generation_compiles(compiles)) == 2
    specjax.generate(target, RAGGED_PROMPTS, config, draft=PromptLookup(max_ngram=2), speculative=k3)
    specjax.generate(target, [p[::-1] for p in RAGGED_PROMPTS], config, draft=PromptLookup(max_ngram=2), speculative=k3)
    assert len(_generation_compiles(compiles)) == 3
    specjax.generate(target, RAGGED_PROMPTS, config, draft=PromptLookup(max_ngram=3), speculative=k3)
    assert len(_generation_compiles(compiles)) == 4


def test_fill_changes_do_not_recompile_blockwise_attention(target, compiles):
    """A cache of several attention blocks: the number of blocks read follows the fill,
    a traced value, so prompts of other lengths in the same bucket reuse the program."""
    cache = specjax.CacheConfig(block_size=16, prefill_chunk=16)
    specjax.generate(target, [[1] * 3, [2] * 20], specjax.GenerationConfig(max_new_tokens=60, cache=cache))
    first = len(_generation_compiles(compiles))
    assert first == 1
    specjax.generate(target, [[3] * 31, [4] * 17], specjax.GenerationConfig(max_new_tokens=60, cache=cache))
    specjax.generate(target, [[5] * 18, [6] * 2], specjax.GenerationConfig(max_new_tokens=50, seed=2, cache=cache))
    assert len(_generation_compiles(compiles)) == first


def test_the_cost_probes_headroom_clears_even_when_the_launch_check_just_passed():
    """bound_live_programs at the default headroom skips while nothing compiled since its last
    check; the cost probe's wider headroom reads the mappings anyway and frees live programs
    (the SmolLM2 E8 probe died in LLVM's section allocator when it did not)."""
    from specjax import runtime

    f = jax.jit(lambda x: x + 1)
    f(jnp.ones(3))
    runtime.bound_live_programs()  # the launch-time check: records the compile count
    assert not runtime.bound_live_programs()  # nothing compiled since: skipped without reading
    before = runtime.cache_clears()
    assert f._cache_size() == 1
    assert runtime.bound_live_programs(headroom=1.0)  # "less than all of the limit left": clear
    assert runtime.cache_clears() == before + 1 and f._cache_size() == 0
