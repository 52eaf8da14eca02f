"""Every code block of README.md and docs/*.md runs in the test suite (Sybil).

- ```python blocks run in order, one namespace per document, so a block may use the names
  an earlier one defined (as a reader would). They run in a temporary directory, so what
  they write (a saved model, a head) never lands in the repository.
- ```bash blocks: every `specjax ...` line is parsed by the real argument parser (and its
  --config file must exist); `specjax generate` lines run, in-process, and must exit 0;
  `python scripts/X.py ...` lines must name an existing script. Install lines (pip, venv,
  pytest) are what .ci/run itself executes, so they are not repeated here.
A block that would be too slow to run belongs in a script, not in the README.
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import tempfile
from pathlib import Path

from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser

# One XLA compilation cache for the whole run: the pytest process, its xdist workers (they
# inherit the environment) and every subprocess a test starts (CLI runs, kill -9 resumes,
# 8-device workers). Most of the suite's time is XLA:CPU compiling the same tiny programs
# again in another test, process or after a `jax.clear_caches()`; a cache hit loads the
# executable instead (the bench fixture: 115 s cold, 31 s warm). The directory is new for
# every run and removed by the process that made it, so a run never reads an older run's
# programs and what it measures is what a clean checkout does.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="specjax-tests-xla-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # tiny programs compile in < 1 s
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# The programs are tiny, so XLA:CPU spends far longer optimising their machine code than
# running it: at LLVM's optimisation level 0 the bench fixture takes 73 s instead of 115 s.
# The flag sets only LLVM's level; XLA's HLO passes (fusion, layouts) run as for a user.
# Performance is measured by `specjax bench` and scripts/, never here.
_NO_LLVM_OPT = "--xla_backend_optimization_level=0"
if _NO_LLVM_OPT not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_NO_LLVM_OPT}".strip()

ROOT = Path(__file__).resolve().parent
_NOT_REPEATED = ("pip", "python3", "python -m pytest", ".", "cd", "source", "git")


def shell_commands(text: str) -> list[list[str]]:
    """The commands of a bash block: comments dropped, backslash continuations joined."""
    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            if words:
                commands.append(words)
    return commands


def _check_specjax(words: list[str]) -> None:
    from specjax.cli import build_parser, main

    args = build_parser().parse_args(words[1:])  # exits (SystemExit 2) on a bad option
    config = getattr(args, "config", None)
    assert config is None or (ROOT / config).is_file(), f"{' '.join(words)}: no config file {config}"
    if words[1] == "generate":
        cwd = os.getcwd()
        os.chdir(ROOT)  # prompt files and paths in examples are relative to the repository
        try:
            assert main(words[1:]) == 0, f"{' '.join(words)} failed"
        finally:
            os.chdir(cwd)


def evaluate_bash(example) -> None:
    for words in shell_commands(example.parsed):
        line = " ".join(words)
        if words[0] == "specjax":
            _check_specjax(words)
        elif words[0] == "python" and len(words) > 1 and words[1].startswith("scripts/"):
            assert (ROOT / words[1]).is_file(), f"{line}: no such script"
        elif not line.startswith(_NOT_REPEATED):
            raise AssertionError(f"a bash block runs {line!r}, which the README check does not know how to run")


_TOKENIZERS = tempfile.TemporaryDirectory()  # removed when the process exits


def pytest_configure(config):
    config.specjax_tokenizers = _TOKENIZERS.name  # tests/conftest.py shares it with the tests


def _setup(namespace: dict) -> None:
    namespace["_cwd"] = os.getcwd()
    namespace["_tmp"] = tempfile.TemporaryDirectory()
    os.chdir(namespace["_tmp"].name)
    # Measured round costs (adaptive) go to a fresh cache, never the user's ~/.cache/specjax;
    # tokenizers built from GGUF files are shared by every document (building one takes seconds).
    namespace["_cache_dir"] = os.environ.get("SPECJAX_CACHE_DIR")
    os.environ["SPECJAX_CACHE_DIR"] = namespace["_tmp"].name
    os.symlink(_TOKENIZERS.name, os.path.join(namespace["_tmp"].name, "tokenizers"), target_is_directory=True)


def _teardown(namespace: dict) -> None:
    os.chdir(namespace["_cwd"])
    if namespace["_cache_dir"] is None:
        os.environ.pop("SPECJAX_CACHE_DIR", None)
    else:
        os.environ["SPECJAX_CACHE_DIR"] = namespace["_cache_dir"]
    namespace["_tmp"].cleanup()


pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser(), CodeBlockParser(language="bash", evaluator=evaluate_bash)],
    patterns=["README.md", "docs/*.md"],
    setup=_setup,
    teardown=_teardown,
).pytest()
