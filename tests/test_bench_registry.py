"""The bench's experiments are registered in one place (specjax/bench/experiments/__init__.py):
the config sections, `specjax bench --help` and summary.md all come from that list."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest

import specjax
from specjax.bench import BenchConfig, bench_config, experiments, report
from specjax.bench.experiments import REGISTRY, Experiment
from specjax.cli import build_parser
from specjax.configs import from_dict, load_config

SHARED_SETTINGS = {f.name for f in dataclasses.fields(bench_config._Settings)}


def test_every_config_section_is_a_registered_experiment():
    sections = {f.name: f.type for f in dataclasses.fields(BenchConfig) if f.name not in SHARED_SETTINGS}
    assert sections == {e.name: e.section for e in REGISTRY}
    assert BenchConfig().experiments == [e.name for e in REGISTRY]  # the default runs every one
    assert {e.name: e.id for e in REGISTRY} == bench_config.EXPERIMENTS


def test_registered_experiments_are_e1_to_e12_each_with_run_plot_and_columns():
    assert [e.id for e in REGISTRY] == [f"E{i}" for i in range(1, 13)]
    assert len({e.name for e in REGISTRY}) == len(REGISTRY)
    for i, (module, experiment) in enumerate(zip(experiments.MODULES, REGISTRY, strict=True), start=1):
        assert module.startswith(f"e{i:02d}_")
        assert importlib.import_module(f"specjax.bench.experiments.{module}").EXPERIMENT is experiment
        assert callable(experiment.run) and callable(experiment.plot) and callable(experiment.setting)
        assert experiment.columns and all(isinstance(c, str) for c in experiment.columns)
        assert dataclasses.is_dataclass(experiment.section) and experiment.section.__dataclass_params__.frozen
        experiment.section()  # its defaults are a valid section


@dataclasses.dataclass(frozen=True)
class Toy:
    size: int = 2


TOY = Experiment(
    id="E13",
    name="toy",
    section=Toy,
    run=lambda ctx: {"claim": "a toy", "rows": [], "summary": {}},
    plot=lambda result, path, title: path,
    setting=lambda ctx: {"text": "toy"},
    columns=["size"],
    ks=lambda cfg: [cfg.size],
)


def test_an_experiment_registered_later_gets_a_section_a_help_line_and_summary_columns(monkeypatch, capsys):
    monkeypatch.setattr(experiments, "REGISTRY", [*REGISTRY, TOY])
    cls = bench_config.bench_config_class()
    config = from_dict(cls, {"experiments": ["toy", "k_sweep"], "toy": {"size": 5}, "k_sweep": {"ks": [1]}})
    assert config.toy == Toy(5) and config.k_sweep.ks == [1]
    assert [e.name for e in config.chosen] == ["k_sweep", "toy"]  # in id order
    assert config.max_k == 5  # the toy's `ks` counts
    assert load_config(cls, None, ["toy.size=7"]).toy.size == 7
    assert cls().experiments[-1] == "toy"
    with pytest.raises(ValueError, match=r"unknown config key toy\.sizes"):
        from_dict(cls, {"toy": {"sizes": 1}})
    with pytest.raises(ValueError, match="unknown config key toy"):
        from_dict(BenchConfig, {"toy": {}})  # the class built before it was registered knows nothing of it
    assert report._columns("toy", [{"size": 1}]) == ["size"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--help"])  # built after the registration
    text = " ".join(capsys.readouterr().out.split())
    assert "E12 protocol, E13 toy)" in text
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    assert "run experiments E1-E13" in " ".join(capsys.readouterr().out.split())


def test_no_module_name_occurs_twice_in_the_package():
    # specjax/config.py and models/config.py (specjax.models.config) are both public.
    roots = [Path(specjax.__file__).parent, Path(specjax.models.__file__).parent]
    names = [p.name for root in roots for p in root.rglob("*.py") if p.name != "__init__.py"]
    twice = sorted({n for n in names if names.count(n) > 1} - {"config.py"})
    assert not twice, f"module names used more than once: {twice}"
