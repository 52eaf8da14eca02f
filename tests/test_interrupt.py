"""Ctrl-C stops a generation: the rounds run in chunks, with the host between them.

Chunking must not change a token: the chunks run the same rounds on the same state (the
RNG stream is in it), so `run()` equals `launch()`, the single compiled loop, bit for bit,
greedy or sampled, whatever the chunk size. And a real SIGINT to a real `specjax generate`
that would decode for minutes ends it within seconds, as `specjax: interrupted`, status 130.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import specjax
from specjax.engine.generation import next_chunk

PROMPTS = [[1, 2, 3, 4, 5], [7, 3], [9, 9, 9, 2, 4, 6, 8]]


@pytest.mark.parametrize(
    ("temperature", "drafted"),
    [(0.0, True), (1.0, True)],
    ids=["greedy", "sampled"],
)
def test_chunked_equals_one_program(target, noisy_draft, temperature, drafted):
    config = specjax.GenerationConfig.at_temperature(temperature, max_new_tokens=24, seed=5, eos_token_id=None)
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=3) if drafted else None
    prepared = specjax.prepare(target, PROMPTS, config, draft=noisy_draft if drafted else None, speculative=speculative)
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
    assert next_chunk(100, 0.1, target=0.2) == 200
    assert next_chunk(100, 0.4, target=0.2) == 50  # slow: shrink to the budget
    assert next_chunk(1, 5.0, target=0.2) == 1  # never below one round
    assert next_chunk(2**29, 0.0, target=0.2) == 2**30  # the budget stays an int32


# The real command, its prepared call's decode wrapped to say on stderr when decoding starts
# (after compiling), so the SIGINT lands mid-decode. random-target with its random draft
# accepts almost nothing: 2000 rounds of 16 rows, minutes on the test machines uninterrupted.
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


def test_sigint_stops_a_long_generate_promptly():
    args = ["generate", "--target", "random-target", "-k", "8", "--max-new-tokens", "2000", "--ignore-eos"]
    args += [arg for i in range(16) for arg in ("--prompt", f"def f{i}(")]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        for line in proc.stderr:  # compiling first: no deadline on that
            if line.strip() == "decoding":
                break
        else:
            pytest.fail(f"the command ended before decoding: {proc.wait()}")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)  # only catches "did not stop": a chunk is ~0.2 s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "specjax: interrupted" in err
    assert "tokens/s" not in out  # no summary: it stopped mid-decode, not after
