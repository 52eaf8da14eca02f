"""What a user sees when something goes wrong: one line, `specjax: error: ...`, exit status 2.

Bad input (a missing file, a YAML typo, an unknown name, a head for another target) is a
ValueError or OSError raised where the problem is known, with a message that names it. Here
it becomes one line on stderr; the traceback only with --debug or SPECJAX_DEBUG=1. An output
folder this command created is removed again when it fails before writing a checkpoint, so
nothing half-written is left behind (a run with checkpoints is kept: rerunning resumes it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import warnings
from pathlib import Path

import yaml

from specjax.configs import yaml_error

DEBUG_ENV = "SPECJAX_DEBUG"
EXIT_USAGE = 2  # argparse's status for bad arguments; bad input files get the same
EXIT_INTERNAL = 1


def add_debug_argument(parser: argparse.ArgumentParser, top_level: bool = False) -> None:
    """--debug before or after the command name (`specjax --debug generate` or `... generate --debug`)."""
    parser.add_argument(
        "--debug",
        action="store_true",
        # SUPPRESS on the subcommand: its default would overwrite a top-level --debug.
        default=False if top_level else argparse.SUPPRESS,
        help=f"show the full traceback of an error (also: {DEBUG_ENV}=1)",
    )


def debug_enabled(args) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def one_line(error: BaseException) -> str:
    """The error's message on one line (some messages, e.g. from JAX, span several)."""
    if isinstance(error, yaml.YAMLError):  # one that no reader named a source for
        return str(yaml_error(error, "YAML"))
    text = " ".join(str(error).split())
    if isinstance(error, FileNotFoundError) and error.filename and "No such file" in text:
        return f"file not found: {error.filename}"
    return text or type(error).__name__


def _format_warning(message, category, filename, lineno, line=None) -> str:
    if "specjax" in Path(filename).parts:  # ours: one line like the errors; others as Python prints them
        return f"specjax: warning: {message}\n"
    return warnings._formatwarning_orig(message, category, filename, lineno, line)  # type: ignore[attr-defined]


def _install_warning_format() -> None:
    if not hasattr(warnings, "_formatwarning_orig"):
        warnings._formatwarning_orig = warnings.formatwarning  # type: ignore[attr-defined]
    warnings.formatwarning = _format_warning


def _remove_if_unfinished(out: Path | None, existed: bool) -> None:
    """Remove the output folder this command created, unless it holds a checkpoint to resume."""
    if out is None or existed or not out.is_dir():
        return
    checkpoints = out / "checkpoints"
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        return
    shutil.rmtree(out, ignore_errors=True)


def run_command(args) -> int:
    """Run `args.func(args)`, turning errors into one line and exit status 2 (1 for a bug)."""
    _install_warning_format()
    out = Path(args.out) if getattr(args, "out", None) else None
    existed = out is not None and out.exists()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        _remove_if_unfinished(out, existed)
        print("specjax: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, yaml.YAMLError) as error:
        _remove_if_unfinished(out, existed)
        if debug_enabled(args):
            raise
        print(f"specjax: error: {one_line(error)}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as error:
        _remove_if_unfinished(out, existed)
        if debug_enabled(args):
            raise
        print(
            f"specjax: error: internal error ({type(error).__name__}: {one_line(error)}); "
            "rerun with --debug for the traceback and report it",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
