"""`specjax generate`'s timing: compilation apart from decoding, and --speedup against plain."""

from __future__ import annotations

import json

import pytest

from specjax.cli import main

ARGS = ["generate", "--prompt", "def parse_args(", "--prompt", "import os", "--max-new-tokens", "12", "-k", "3"]


@pytest.fixture(scope="module")
def greedy_speedup():
    """One --speedup --json run, greedy: the record the JSON tests read."""
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main([*ARGS, "--speedup", "--json"]) == 0
    return json.loads(buffer.getvalue())


def test_json_times_compilation_apart(greedy_speedup):
    timing = greedy_speedup["timing"]
    for key in ("prepare_seconds", "compile_seconds", "decode_seconds", "tokens_per_second"):
        assert timing[key] > 0, key
    assert timing["includes_compile"] is False
    assert timing["warmup"] is True and len(timing["decode_repeats"]) == 3  # --speedup: a warm-up, then 3 timed
    assert timing["decode_seconds"] == pytest.approx(sorted(timing["decode_repeats"])[1])  # their median
    generated = greedy_speedup["stats"]["generated_tokens"]
    assert timing["tokens_per_second"] == pytest.approx(generated / timing["decode_seconds"])  # over decode only
    total = timing["prepare_seconds"] + timing["compile_seconds"] + timing["decode_seconds"]
    assert timing["seconds"] == pytest.approx(total)


def test_json_speedup_is_the_ratio_of_decode_times(greedy_speedup):
    comparison = greedy_speedup["speedup"]
    spec, plain = comparison["speculative"], comparison["plain"]
    assert spec["decode_seconds"] == greedy_speedup["timing"]["decode_seconds"]
    assert comparison["speedup"] == pytest.approx(plain["decode_seconds"] / spec["decode_seconds"])
    assert plain["compile_seconds"] > 0 and plain["tokens_per_second"] > 0
    assert comparison["greedy_checked"] is True and comparison["greedy_equal"] is True
    assert comparison["first_difference"] is None


def test_text_summary_shows_compile_decode_and_speedup(capsys):
    assert main([*ARGS, "--speedup"]) == 0
    out = capsys.readouterr().out
    timing = next(line for line in out.splitlines() if line.startswith("decode "))
    assert "tokens/s" in timing and "compile" in timing and "apart" in timing
    speedup = next(line for line in out.splitlines() if line.startswith("speedup "))
    assert "x over plain decoding" in speedup and "greedy output equal to plain decoding token for token" in speedup


def test_sampled_speedup_says_outputs_are_not_compared(capsys):
    assert main([*ARGS, "--speedup", "--temperature", "0.8", "--warmup"]) == 0
    out = capsys.readouterr().out
    assert "(median of 3, after a warm-up decode)" in out
    assert "sampled, so outputs not compared" in out


def test_one_timed_decode_without_speedup(capsys):
    assert main([*ARGS, "--json"]) == 0
    timing = json.loads(capsys.readouterr().out)["timing"]
    assert timing["warmup"] is False and len(timing["decode_repeats"]) == 1
    assert timing["decode_seconds"] == timing["decode_repeats"][0] and timing["compile_seconds"] > 0


def test_speedup_needs_a_drafter(capsys):
    assert main([*ARGS, "--plain", "--speedup"]) == 2
    assert "specjax: error: --speedup compares speculative decoding with plain decoding" in capsys.readouterr().err


def test_a_greedy_mismatch_is_reported():
    from specjax.cli.summary import speedup_line
    from specjax.cli.timed_run import first_difference

    assert first_difference([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]]) == (1, 1)
    assert first_difference([[1, 2]], [[1, 2, 3]]) == (0, 2)  # one stopped earlier
    assert first_difference([[1, 2]], [[1, 2]]) is None
    side = {"decode_seconds": 1.0, "tokens_per_second": 10.0}
    record = dict(speedup=1.0, speculative=side, plain=side, greedy_checked=True, greedy_equal=False,
                  first_difference={"row": 1, "token": 1})  # fmt: skip
    assert "DIFFERS from plain decoding (first at row 1, token 1)" in speedup_line(record)


def test_decoding_after_compile_compiles_nothing(target, noisy_draft):
    """What keeps decode_seconds free of compilation: compile() leaves nothing for decode to compile."""
    import specjax
    from specjax.runtime import _guard

    config = specjax.GenerationConfig(max_new_tokens=9)
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=2)
    prepared = specjax.prepare(target, [[3, 1, 4, 1, 5], [9, 2]], config, draft=noisy_draft, speculative=speculative)
    prepared.compile()
    compiled = _guard["compiles"]  # XLA compiles so far (runtime.py counts them)
    prepared.collect(prepared.decode(chunk_rounds=1))  # several chunks: every state they present
    assert _guard["compiles"] == compiled


def test_a_drafter_mappings_round_settings_are_honoured(capsys):
    """--drafter's mapping may say how rounds run (rule, adaptive, tree), not only which
    drafter: they were parsed and then dropped. The JSON settings say what ran."""
    mapping = "{method: prompt_lookup, rule: block_verification, adaptive: {costs: {0: 1.0, 1: 1.3, 2: 1.5, 3: 1.8}}}"
    assert main([*ARGS, "--drafter", mapping, "--temperature", "1.0", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["settings"]["rule"] == "block_verification_rule", record["settings"]
    assert record["settings"]["adaptive"] is True
    assert record["stats"]["adaptive"], record["stats"]  # the adaptive policy ran: it records its choices
