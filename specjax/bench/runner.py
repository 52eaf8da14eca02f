"""`run_bench`: a BenchConfig in, a results directory out.

Each chosen experiment comes from the registry the config was built from
(experiments/__init__.py): its `run`, `setting` and `plot`, in id order.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import jax
from tqdm.auto import tqdm

from specjax.bench.bench_config import BenchConfig
from specjax.bench.compiles import compile_seconds, compiled_programs
from specjax.bench.context import BenchContext
from specjax.bench.finished_parts import FILE as FINISHED_PARTS
from specjax.bench.finished_parts import FinishedParts, run_fingerprint
from specjax.bench.report import DEFINITIONS, SCHEMA_VERSION, write_results
from specjax.bench.timing import environment, load_average, machine_load
from specjax.configs import to_dict
from specjax.drafters import Drafter
from specjax.io.model import Model


def run_bench(
    config: BenchConfig,
    out_dir: str | Path,
    target: Model | None = None,
    draft: Model | Drafter | None = None,
    progress=True,
    command: list[str] | None = None,
) -> dict:
    """Run the config's experiments in order; write results.json, CSVs, plots and summary.md.

    `target` (a Model) and `draft` (a Model or any Drafter), objects from the Python API,
    replace the config's. `command`: the command line that reruns this bench (the CLI passes
    its own), recorded in results.json and summary.md; None from the Python API (no command
    reruns objects passed in). Returns the results dictionary that results.json holds.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    load = machine_load()  # before loading models: what else the machine was doing
    ctx = BenchContext(config, target=target, draft=draft, progress=progress)
    ctx.parts = FinishedParts(  # a killed run resumes from these
        out_dir / FINISHED_PARTS,
        lambda: run_fingerprint(to_dict(config), ctx.models(), [ctx.target.params, ctx.draft.weights()]),
    )
    results = {
        "schema_version": SCHEMA_VERSION,
        "command": shlex.join(command) if command else None,
        "config": to_dict(config),
        "environment": environment(),
        # The machine's load average at the start and (after each experiment) the end: a run
        # that shared its cores with other work can be recognised.
        "load_average": load,
        "models": ctx.models(),
        "definitions": DEFINITIONS,
        "experiments": {},
        "rows": [],
    }
    compiled_before = compiled_programs()
    for registered in tqdm(config.chosen, desc="experiments", disable=not progress):  # in id order
        name, experiment_id = registered.name, registered.id
        start, compiled_start, load_start = time.perf_counter(), compiled_programs(), load_average()
        compile_start = compile_seconds()
        experiment = registered.run(ctx)
        stem = f"{experiment_id.lower()}_{name}"
        experiment.update(id=experiment_id, plot=f"{stem}.png", csv=f"{stem}.csv", setting=registered.setting(ctx))
        registered.plot(experiment, out_dir / experiment["plot"], f"{experiment_id}: {name.replace('_', ' ')}")
        experiment["seconds"] = time.perf_counter() - start
        experiment["compiled_programs"] = compiled_programs() - compiled_start
        experiment["compile_seconds"] = compile_seconds() - compile_start
        experiment["load_average"] = {"start": load_start, "end": load_average()}
        results["load_average"]["end"] = experiment["load_average"]["end"]
        results["compiled_programs"] = compiled_programs() - compiled_before
        if config.clear_caches:
            jax.clear_caches()  # bound live executables (see bench/compiles.py)
        results["experiments"][name] = experiment
        # Timed generation rows carry tokens_per_second; they also go to the run-wide table.
        results["rows"] += [{"experiment": experiment_id, **r} for r in experiment["rows"] if "tokens_per_second" in r]
        results["machine"] = ctx.measured_machine
        results["acceptance_profiles"] = ctx.acceptance_profiles()
        write_results(results, out_dir)  # after every experiment: an interrupted run keeps what it finished
    ctx.parts.discard()
    return results
