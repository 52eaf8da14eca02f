"""The command line: help, a real generation, JSON output and clean errors."""

from __future__ import annotations

import json
import subprocess
import sys

from specjax.cli import main


def test_help_lists_commands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "generate" in out and "bench" in out and "distill" in out


def test_generate_json(capsys):
    code = main(["generate", "--prompt", "def f(", "--prompt", "x", "-k", "2", "--max-new-tokens", "6", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert [len(t) for t in result["tokens"]] == [6, 6]
    assert len(result["text"]) == 2
    assert result["stats"]["drafted_tokens"] == 2 * result["stats"]["rounds"]
    assert len(result["stats"]["accepted_per_position"]) == 2


def test_plain_generate_matches_speculative_greedy(capsys):
    args = ["generate", "--prompt", "import os", "--max-new-tokens", "8", "--json"]
    main([*args, "--plain"])
    plain = json.loads(capsys.readouterr().out)
    main([*args, "-k", "3"])
    speculative = json.loads(capsys.readouterr().out)
    assert plain["tokens"] == speculative["tokens"]


def test_drafters_and_cache_options_from_the_command_line(capsys):
    args = ["generate", "--prompt", "import os\nimport sys\nimport", "--max-new-tokens", "8", "--json"]
    main([*args, "--plain"])
    plain = json.loads(capsys.readouterr().out)
    for drafter, kind in (("prompt-lookup", "prompt_lookup"), ("layer-skip:2", "layer_skip")):
        main([*args, "--drafter", drafter, "--attention-block", "8", "--prefill-chunk", "8"])
        result = json.loads(capsys.readouterr().out)
        assert result["tokens"] == plain["tokens"] and result["stats"]["drafter"]["kind"] == kind
    assert main([*args, "--drafter", "{kind: prompt_lookup, max_ngram: 0}"]) == 2
    assert "min_ngram <= max_ngram" in capsys.readouterr().err


def test_tree_from_the_command_line(capsys):
    args = ["generate", "--prompt", "import os", "--max-new-tokens", "8", "--json"]
    main([*args, "--plain"])
    plain = json.loads(capsys.readouterr().out)
    main([*args, "--tree", "[[0], [1], [0, 0], [1, 0]]"])
    result = json.loads(capsys.readouterr().out)
    assert result["tokens"] == plain["tokens"] and result["stats"]["verify_width"] == 5
    assert main([*args, "--tree", "[[0, 0]]"]) == 2
    assert "needs its prefix" in capsys.readouterr().err
    assert main([*args, "--tree", "chain:2", "--drafter", "prompt-lookup"]) == 2
    assert "cannot expand a token tree" in capsys.readouterr().err


def test_bad_k_is_a_clean_error(capsys):
    assert main(["generate", "-k", "0"]) == 2
    assert "num_speculative_tokens must be an integer >= 1" in capsys.readouterr().err


def test_console_script_entry_point():
    result = subprocess.run(
        [sys.executable, "-m", "specjax.cli", "generate", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--num-speculative-tokens" in result.stdout


def test_text_in_text_out():
    import specjax
    from specjax.io.presets import resolve_model

    target, draft = resolve_model("random-target"), resolve_model("random-draft", seed=1)
    config = specjax.GenerationConfig(max_new_tokens=5)
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=2)
    out = specjax.generate(target, ["def f(", "import"], config, draft=draft, speculative=speculative)
    assert out.text == [target.tokenizer.decode(t) for t in out.tokens]
    single = specjax.generate(target, "def f(", config)
    assert single.tokens == out.tokens[:1]
