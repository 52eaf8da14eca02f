"""The `specjax` command line: one module per group of commands.

    generate.py  `specjax generate`: prompts in, text and acceptance statistics out
    config_commands.py  the config-driven commands: train, distill, train-head, store-features, bench
    regenerate_command.py  `specjax regenerate`: a dataset's answers written anew by the target
    models.py    `specjax save-model`: any loadable model written as an HF directory;
                 `specjax save-head`: a draft head in a published layout (vLLM, SGLang)
    errors.py    what a user sees when something is wrong: one line, exit status 2

`main` is the console script (pyproject.toml) and `python -m specjax.cli`.
"""

from __future__ import annotations

import argparse

from specjax.cli.config_commands import add_bench, add_distill, add_store_features, add_train, add_train_head
from specjax.cli.errors import add_debug_argument, run_command
from specjax.cli.generate import add_generate
from specjax.cli.models import add_save_head, add_save_model
from specjax.cli.regenerate_command import add_regenerate

_DESCRIPTION = """\
specjax: speculative decoding you can measure.

A cheap draft model proposes K tokens, the target verifies all K+1 positions in one
forward pass, and the longest acceptable prefix plus one correction/bonus token is
kept. Greedy output equals the target's own greedy output; sampled output follows the
target's distribution exactly.
"""

_EPILOG = """\
examples:
  specjax generate --prompt "def parse_args(" -k 4
  specjax generate --prompt "import os" --plain --max-new-tokens 32
  specjax generate --prompt "def parse_args(" --drafter prompt-lookup -k 6
  specjax generate --prompt "def parse_args(" --drafter layer-skip:2
  specjax generate --prompt "def parse_args(" --drafter stdlib-eagle
  specjax generate --prompt "def parse_args(" --tree medusa-like-64
  specjax generate --prompt "def parse_args(" -k 8 --adaptive
  specjax generate --prompt-file prompts.jsonl --json
  specjax generate --prompt "x" --prompt "class Foo:" --temperature 1.0 --seed 3 --json
  specjax train --config configs/train_target.yaml --out runs/target
  specjax distill --config configs/distill_quick.yaml --out runs/distill_quick
  specjax train-head --config configs/medusa_head.yaml --out runs/medusa
  specjax distill --target path/to/hf-model --data chats.jsonl --out runs/my_draft
  specjax train-head --target path/to/hf-model --data chats.jsonl --out runs/my_head
  specjax bench --config configs/quick.yaml --out runs/bench_quick
  specjax bench --config configs/e3_k_sweep.yaml --out runs/e3 --set timing.repeats=9
  specjax generate --target smollm2-135m-instruct --chat --prompt "What is the capital of France?"
  specjax regenerate --target smollm2-135m-instruct --data prompts.jsonl --out answers.jsonl
  specjax save-model smollm2-135m-instruct --out smollm2-hf
  specjax save-head stdlib-medusa --format medusa --out medusa-head

Errors print one line (`specjax: error: ...`, exit status 2); --debug, or SPECJAX_DEBUG=1,
shows the traceback instead.
"""


def _version() -> str:
    import specjax

    return f"specjax {specjax.__version__}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specjax",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version())
    add_debug_argument(parser, top_level=True)
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for add in (
        add_generate,
        add_train,
        add_distill,
        add_train_head,
        add_store_features,
        add_bench,
        add_regenerate,
        add_save_model,
        add_save_head,
    ):
        add_debug_argument(add(subparsers))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 0
    return run_command(args)


__all__ = ["build_parser", "main"]
