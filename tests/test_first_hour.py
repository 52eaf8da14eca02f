"""A new user's first hour: the errors they make get one line and exit status 2, the names
the README uses work in Python and on the CLI, and the summary adds up."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import warnings
from pathlib import Path

import pytest

import specjax
from specjax.cli import main

ROOT = Path(__file__).resolve().parent.parent


def _one_line_error(capsys, code: int) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured.err
    assert len(lines) == 1 and lines[0].startswith("specjax: error: "), captured.err
    assert "Traceback" not in captured.err
    return lines[0]


@pytest.mark.parametrize("command", ["bench", "train", "distill", "train-head"])
def test_a_missing_config_is_one_line(capsys, tmp_path, command):
    out = tmp_path / "out"
    line = _one_line_error(capsys, main([command, "--config", str(tmp_path / "nope.yaml"), "--out", str(out)]))
    assert "config file not found" in line and "nope.yaml" in line
    assert not out.exists()


def test_a_yaml_syntax_error_names_the_file_and_line(capsys, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("experiments: [waste]\ntarget: stdlib-target\nprompts: {file: a.jsonl\n")
    line = _one_line_error(capsys, main(["bench", "--config", str(config), "--out", str(tmp_path / "out")]))
    assert "bad.yaml, line 4" in line and "YAML syntax error" in line
    line = _one_line_error(capsys, main(["generate", "--drafter", "{kind: prompt_lookup, max_ngram: [}"]))
    assert "--drafter" in line and "YAML syntax error" in line
    config.write_text("experiments: [waste]\n")
    line = _one_line_error(capsys, main(["bench", "--config", str(config), "--out", "o", "--set", "waste={ks: [1"]))
    assert "--set waste=" in line


def test_a_missing_prompts_file_leaves_no_output_folder(capsys, tmp_path):
    config = tmp_path / "bench.yaml"
    config.write_text("experiments: [waste]\nprompts: {file: missing-prompts.jsonl}\nwaste: {ks: [1]}\n")
    out = tmp_path / "out"
    line = _one_line_error(capsys, main(["bench", "--config", str(config), "--out", str(out), "--no-progress"]))
    assert "missing-prompts.jsonl does not exist" in line
    assert not out.exists()
    line = _one_line_error(capsys, main(["generate", "--prompt-file", str(tmp_path / "none.txt")]))
    assert "--prompt-file" in line and "none.txt does not exist" in line


def test_debug_shows_the_traceback(capsys, tmp_path, monkeypatch):
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(FileNotFoundError):
        main(["train", "--config", missing, "--out", str(tmp_path / "o"), "--debug"])
    with pytest.raises(FileNotFoundError):
        main(["--debug", "train", "--config", missing, "--out", str(tmp_path / "o")])
    monkeypatch.setenv("SPECJAX_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        main(["train", "--config", missing, "--out", str(tmp_path / "o")])


def test_version_and_help_texts(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"specjax {specjax.__version__}"
    from specjax.bench.bench_config import EXPERIMENTS
    from specjax.cli import build_parser

    subcommands = build_parser()._subparsers._group_actions[0].choices
    bench = subcommands["bench"].format_help()
    assert all(eid in bench for eid in EXPERIMENTS.values())
    head = " ".join(subcommands["train-head"].format_help().split())
    assert "Medusa" in head and "EAGLE" in head and "EAGLE-3" in head
    generate = " ".join(subcommands["generate"].format_help().split())
    assert "not with prompt lookup" in generate and "Medusa and EAGLE heads" in generate


def test_python_and_the_cli_accept_the_same_model_names():
    model = specjax.load_model("random-target", seed=3)
    assert model.tokenizer is not None and not model.config.tie_word_embeddings
    assert specjax.ModelConfig().tie_word_embeddings is False  # LlamaConfig's default
    with pytest.raises(ValueError, match=r"'no-such-model' is neither.*random presets: random-draft, random-target"):
        specjax.load_model("no-such-model")


def test_prompts_from_a_file_and_stdin_and_json_settings(capsys, tmp_path, monkeypatch):
    text = tmp_path / "prompts.txt"
    text.write_text("def f(\n    x,\n\nimport os\n")
    args = ["generate", "--max-new-tokens", "4", "-k", "2", "--json", "--target", "random-target"]
    assert main([*args, "--draft", "random-draft", "--prompt-file", str(text)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["tokens"]) == 2
    settings = result["settings"]
    assert settings["target"] == "random-target" and settings["num_speculative_tokens"] == 2
    assert settings["drafter"] == "random-draft" and settings["seed"] == 0 and settings["temperature"] == 0.0
    assert settings["environment"]["jax"] and settings["environment"]["specjax"] == specjax.__version__
    monkeypatch.setattr("sys.stdin", io.StringIO('{"prompt": "class A:"}\n{"prompt": "x = 1"}\n'))
    assert main([*args, "--plain", "--prompt", "first", "--prompt-file", "-"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["tokens"]) == 3 and result["settings"]["drafter"] is None
    line = _one_line_error(capsys, main([*args, "--plain", "--chat"]))
    assert "chat template" in line and "ByteTokenizer" in line


def test_the_summary_adds_up(capsys):
    assert main(["generate", "--prompt", "def parse_args(", "-k", "4", "--max-new-tokens", "31"]) == 0
    out = capsys.readouterr().out
    emitted = next(line for line in out.splitlines() if line.startswith("emitted"))
    # "emitted E = R row-rounds + A accepted; C cut (...); kept G" (or "none cut")
    match = re.match(r"emitted (\d+) = (\d+) row-rounds \+ (\d+) accepted; (none|\d+) cut.*kept (\d+)$", emitted)
    e, r, a, cut, g = (0 if x == "none" else int(x) for x in match.groups())
    assert e == r + a and g == e - cut == 31
    per_position = next(line for line in out.splitlines() if line.startswith("per-position"))
    assert "/" in per_position and "(" in per_position


def test_stats_reconcile_with_eos(target, noisy_draft):
    draft = noisy_draft
    prompts = [[1, 2, 3], [4, 5]]
    config = specjax.GenerationConfig(max_new_tokens=12)
    free = specjax.generate(target, prompts, config)
    eos = free.tokens[0][3]  # a token row 0 emits: it stops there
    config = config.replace(eos_token_id=eos)
    for out in (
        specjax.generate(target, prompts, config),
        specjax.generate(
            target, prompts, config, draft=draft, speculative=specjax.SpeculativeConfig(num_speculative_tokens=3)
        ),
    ):
        s = out.stats
        assert s.emitted_tokens == s.rounds + s.accepted_tokens
        assert s.generated_tokens == s.emitted_tokens - s.truncated_tokens >= 0
        assert s.stopped_at_eos[0] and out.tokens[0][-1] == eos
        assert s.stopped_at_eos[1] == (out.tokens[1][-1] == eos)
        assert [c <= n for c, n in zip(s.accepted_counts, s.position_rounds, strict=True)] == [True] * len(
            s.accepted_counts
        )


def test_warns_once_past_the_trained_context():
    model = specjax.load_model("random-target")
    from dataclasses import replace

    short = replace(model, trained_context=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        specjax.generate(short, [[1, 2, 3]], specjax.GenerationConfig(max_new_tokens=4))  # 7 tokens: inside
        specjax.generate(short, [[1, 2, 3]], specjax.GenerationConfig(max_new_tokens=6))  # 9: past it
        specjax.generate(short, [[1, 2, 3]], specjax.GenerationConfig(max_new_tokens=6))  # again: already said
    messages = [str(w.message) for w in caught if "trained on" in str(w.message)]
    assert len(messages) == 1 and "8-token windows" in messages[0]
    assert specjax.load_model("stdlib-target").trained_context == 256


def _readme_runner():
    spec = importlib.util.spec_from_file_location("readme_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_runner_checks_cli_blocks():
    runner = _readme_runner()

    class Block:
        def __init__(self, text):
            self.parsed = text

    commands = runner.shell_commands("# comment\nspecjax bench --config configs/quick.yaml \\\n  --out x  # note\n")
    assert commands == [["specjax", "bench", "--config", "configs/quick.yaml", "--out", "x"]]
    runner.evaluate_bash(Block("specjax bench --config configs/quick.yaml --out runs/q\npip install -e .\n"))
    with pytest.raises(SystemExit):
        runner.evaluate_bash(Block("specjax bench --no-such-option\n"))
    with pytest.raises(AssertionError, match="no config file"):
        runner.evaluate_bash(Block("specjax bench --config configs/missing.yaml --out x\n"))
    with pytest.raises(AssertionError, match="no such script"):
        runner.evaluate_bash(Block("python scripts/missing.py\n"))
    with pytest.raises(AssertionError, match="does not know how to run"):
        runner.evaluate_bash(Block("rm -rf results\n"))


def test_generation_stops_at_the_target_s_eos_by_default_as_in_hf(target, noisy_draft):
    """GenerationConfig() takes the target's EOS (its tokenizer's), as HF's generate takes the
    model's; ignore_eos=True generates max_new_tokens (vLLM's name); an explicit id wins."""
    import dataclasses
    import types

    prompts = [[1, 2, 3], [4, 5]]
    free = specjax.generate(target, prompts, specjax.GenerationConfig(max_new_tokens=8)).tokens
    stop = free[0][2]  # a token the first row emits third
    with_eos = dataclasses.replace(target, tokenizer=types.SimpleNamespace(eos_token_id=stop))
    for draft in (None, noisy_draft):
        speculative = None if draft is None else specjax.SpeculativeConfig(num_speculative_tokens=3)

        def run(config, draft=draft, speculative=speculative):
            return specjax.generate(with_eos, prompts, config, draft=draft, speculative=speculative)

        stopped = run(specjax.GenerationConfig(max_new_tokens=8)).tokens
        assert stopped[0] == free[0][: free[0].index(stop) + 1]
        assert run(specjax.GenerationConfig(max_new_tokens=8, ignore_eos=True)).tokens == free
        other = next(t for t in range(40) if t not in free[0] and t not in free[1])  # never emitted
        assert run(specjax.GenerationConfig(max_new_tokens=8, eos_token_id=other)).tokens == free
