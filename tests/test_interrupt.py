"""Ctrl-C stops a generation: the rounds run in chunks, with the host between them.

Chunking must not change a token: the chunks run the same rounds on the same state (the
RNG stream is in it), so `run()` equals `launch()`, the single compiled loop, bit for bit,
greedy or sampled, whatever the chunk size. And a real SIGINT to a real `specjax generate`
that would decode for minutes ends it within seconds, as `specjax: interrupted`, status 130.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

import specjax
from specjax.engine.generation import next_chunk

PROMPTS = [[1, 2, 3, 4, 5], [7, 3], [9, 9, 9, 2, 4, 6, 8]]


# Adaptive K carries the most state from round to round (its estimates, its own RNG stream,
# a record per round); fixed costs keep its choices off any clock.
ADAPTIVE = specjax.AdaptiveConfig(costs={0: 1.0, 1: 1.3, 2: 1.5, 4: 2.0})


@pytest.mark.parametrize(
    ("temperature", "adaptive"),
    [(0.0, False), (1.0, False), (1.0, True)],
    ids=["greedy", "sampled", "sampled-adaptive"],
)
def test_chunked_equals_one_program(target, noisy_draft, temperature, adaptive):
    config = specjax.GenerationConfig.at_temperature(temperature, max_new_tokens=24, seed=5, eos_token_id=None)
    k = 4 if adaptive else 3
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=k, adaptive=ADAPTIVE if adaptive else False)
    prepared = specjax.prepare(target, PROMPTS, config, draft=noisy_draft, speculative=speculative)
    whole = prepared.collect(prepared.launch())  # today's single call: prefill and every round in one program
    assert whole.stats.rounds > 3 * len(PROMPTS)  # so a chunk of 1 or 3 rounds really splits the loop
    for chunk_rounds in (1, 3, None):  # None: chunks sized by time, as run() does
        chunked = prepared.collect(prepared.decode(chunk_rounds=chunk_rounds))
        assert chunked.tokens == whole.tokens
        assert chunked.stats == whole.stats  # every counter: no round run twice or skipped, none past the end
    assert prepared.run().tokens == whole.tokens
    assert prepared.run(7).tokens == prepared.collect(prepared.launch(7)).tokens  # a shorter budget, same programs


def test_chunks_grow_toward_the_time_budget_and_shrink_past_it():
    assert next_chunk(1, 0.001, target=0.2) == 8  # fast rounds: grow, at most 8-fold a chunk
    assert next_chunk(1, 0.001, current=8, target=0.2) == 64  # 8-fold past the budget already queued
    assert next_chunk(100, 0.1, target=0.2) == 200
    assert next_chunk(100, 0.4, current=200, target=0.2) == 50  # slow: shrink to the time budget
    assert next_chunk(1, 5.0, target=0.2) == 1  # never below one round
    assert next_chunk(2**29, 0.0, target=0.2) == 2**30  # the budget stays an int32


# Both runs decode the same programs (the API run's settings are the command's), so the
# second finds them in the compilation cache the test session shares with its subprocesses.
# random-target with its random draft accepts almost nothing: 2000 rounds of 16 rows take
# minutes uninterrupted. Each run says on stderr when decoding starts, after compiling, so
# the SIGINT lands mid-decode.
_ROWS = 16
_CLI = textwrap.dedent(
    """
    import sys
    from specjax.cli import main
    from specjax.engine.output import PreparedGeneration

    decode = PreparedGeneration.decode

    def announced(self, *args, **kwargs):
        print("decoding", file=sys.stderr, flush=True)
        return decode(self, *args, **kwargs)

    PreparedGeneration.decode = announced
    sys.exit(main(sys.argv[1:]))
    """
)
# The Python API with KeyboardInterrupt caught (a notebook does so too): the wait for the
# device returns at once, but the computation in flight runs on, and the exit (or the next
# computation) waits for it. Before chunking that was the whole loop (minutes here; 171 s
# once for a user); now it is one chunk.
_API = textwrap.dedent(
    f"""
    import sys
    import specjax
    from specjax.core.loop import CacheConfig
    from specjax.io.presets import resolve_model

    target, draft = resolve_model("random-target"), resolve_model("random-draft", seed=1)
    cache = CacheConfig(block_size=256, prefill_chunk=512)
    config = specjax.GenerationConfig.at_temperature(0.0, max_new_tokens=2000, eos_token_id=None, cache=cache)
    prompts = [f"def f{{i}}(" for i in range({_ROWS})]
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=8)
    prepared = specjax.prepare(target, prompts, config, draft=draft, speculative=speculative).compile()
    try:  # the announcement inside: the signal may land while print() returns
        print("decoding", file=sys.stderr, flush=True)
        prepared.run()
    except KeyboardInterrupt:  # caught, as a notebook or a caller's handler would
        print("interrupted", file=sys.stderr, flush=True)
        sys.exit(130)
    """
)


@pytest.mark.parametrize("via", ["cli", "api"])
def test_sigint_stops_a_long_generation_promptly(via):
    if via == "cli":
        args = ["generate", "--target", "random-target", "-k", "8", "--max-new-tokens", "2000", "--ignore-eos"]
        command = [sys.executable, "-c", _CLI, *args, *[a for i in range(_ROWS) for a in ("--prompt", f"def f{i}(")]]
    else:
        command = [sys.executable, "-c", _API]
    # A user's Ctrl-C meets SIGINT's default disposition; the child gets that whatever the
    # test worker's own is (an ignored SIGINT is inherited across exec, and Python then
    # installs no KeyboardInterrupt handler).
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        for line in proc.stderr:  # compiling first: no deadline on that
            if line.strip() == "decoding":
                break
        else:
            pytest.fail(f"the run ended before decoding: {proc.wait()}")
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)  # only catches "did not stop": a chunk is ~0.2 s
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"still running 60 s after SIGINT; stderr:\n{err[-3000:]}\nstdout:\n{out[-1000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if via == "cli":
        assert proc.returncode == 130, err
        assert "specjax: interrupted" in err
        assert "tokens/s" not in out  # no summary: it stopped mid-decode, not after
    else:
        assert proc.returncode == 130, err
        assert "interrupted" in err
