"""The config-driven commands: train, distill, train-head, store-features and bench.

Each reads a YAML config (a typed frozen dataclass, `--set key=value` overrides) and
writes into --out; the training commands resume from the newest checkpoint when rerun.
"""

from __future__ import annotations

import json
import os

from specjax.cli.generate import HelpFormatter


def _add_run_arguments(p, config_help: str, out_help: str, config_required: bool = True) -> None:
    """What every config-driven command takes."""
    p.add_argument("--config", required=config_required, help=config_help)
    p.add_argument("--out", required=True, help=out_help)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _quiet(args) -> bool:
    """--no-progress: also silences bars drawn below the command (round-cost measurement), via
    tqdm's own environment switch."""
    if args.no_progress:
        os.environ["TQDM_DISABLE"] = "1"
    return not args.no_progress


_RESUMABLE_OUT = "run directory (rerun with the same one to resume)"
_NO_CONFIG = " (default: the config's defaults)"


def _add_target_and_data(p) -> None:
    """--target and --data of the trainers that work for any target on any data."""
    p.add_argument(
        "--target", help="the frozen target: an embedded name, an HF directory or a GGUF file (as --set target=)"
    )
    p.add_argument(
        "--data",
        metavar="FILE",
        help="train on this JSONL or text file instead of the stdlib corpus, tokenized with the target's tokenizer "
        "(as --set dataset.path=; docs/training.md)",
    )


def _target_and_data(args) -> list[str]:
    """--target and --data as overrides, before --set's (so an explicit --set wins). JSON-quoted:
    a path is a string whatever YAML would read it as (123, a: b, [x])."""
    overrides = [f"target={json.dumps(args.target)}"] if args.target else []
    return overrides + ([f"dataset.path={json.dumps(args.data)}"] if args.data else [])


def _add_mesh(p) -> None:
    """--mesh of the trainers whose target forward runs inside the training step."""
    p.add_argument(
        "--mesh",
        metavar="data=D,model=M",
        help="train over a device mesh: the target tensor parallel over 'model', each batch's rows split over "
        "'data', which must divide the batch size (as --set mesh=; docs/training.md)",
    )


def _mesh(args, key: str = "mesh") -> list[str]:
    """--mesh as an override of `key`, before --set's."""
    return [f"{key}={json.dumps(args.mesh)}"] if args.mesh else []


def _draft_for_target(args) -> list[str]:
    """A target other than the embedded pair's has no pretrained draft with its vocabulary: with
    --target, unless the config or --set names one (draft, draft_init), distill starts a fresh
    draft of the target's architecture and tokenizer (draft_init=config, sized by draft_config)."""
    from specjax.configs import read_yaml
    from specjax.io.embedded import DEFAULT_TARGET

    if not args.target or args.target == DEFAULT_TARGET:
        return []
    named = set(read_yaml(args.config)) if args.config else set()
    named |= {entry.split("=", 1)[0].strip() for entry in args.set}
    return [] if named & {"draft", "draft_init"} else ["draft_init=config"]


def add_train(subparsers):
    p = subparsers.add_parser(
        "train",
        help="pretrain a model on the stdlib corpus (resumes automatically)",
        description="Train a byte-level model on the Python standard-library corpus. Rerunning the same "
        "command with the same --out resumes from the newest checkpoint, even after kill -9.",
        formatter_class=HelpFormatter,
    )
    _add_run_arguments(p, "YAML file of a TrainConfig (see configs/train_*.yaml)", _RESUMABLE_OUT)
    p.add_argument("--export", help="also write the final model in Hugging Face format to this directory")
    p.set_defaults(func=_train)
    return p


def _train(args) -> int:
    from specjax.configs import load_config
    from specjax.training.train import TrainConfig, evaluate, train

    config = load_config(TrainConfig, args.config, args.set)
    print(f"training {config.model.num_parameters:,} parameters for {config.steps} steps into {args.out}")
    model = train(config, args.out, progress=_quiet(args))
    print("validation bits/byte:", json.dumps(evaluate(model)))
    if args.export:
        from specjax.io.hf import save_model

        save_model(model, args.export)
        print(f"exported to {args.export}")
    return 0


def add_distill(subparsers):
    p = subparsers.add_parser(
        "distill",
        help="distil a draft toward a target so that it is accepted more often (resumes automatically)",
        description="Train a draft on a divergence to a frozen target (DistillSpec-style). Writes "
        "metrics.jsonl (with held-out acceptance), results.json and the distilled draft in HF format "
        "under OUT/draft. Rerunning the same command with the same --out resumes.",
        formatter_class=HelpFormatter,
    )
    _add_run_arguments(
        p,
        "YAML of a DistillConfig, or of a comparison (base: + variants:), see configs/distill_*.yaml" + _NO_CONFIG,
        _RESUMABLE_OUT,
        config_required=False,
    )
    _add_target_and_data(p)
    _add_mesh(p)
    p.set_defaults(func=_distill)
    return p


def _distill(args) -> int:
    from specjax.configs import load_config
    from specjax.training.distill import DistillConfig, distill
    from specjax.training.distill_compare import CompareConfig, compare, is_comparison

    overrides = [*_target_and_data(args), *_mesh(args), *_draft_for_target(args), *args.set]
    if args.config and is_comparison(args.config):
        if args.target or args.data:
            raise ValueError("--target and --data apply to one run, not a comparison: set them in its base:")
        config = load_config(CompareConfig, args.config, [*_mesh(args, "base.mesh"), *args.set])
        rows = compare(config, args.out, progress=_quiet(args))
        for row in rows:
            print(
                f"{row['variant']:<24} acceptance length {row['mean_acceptance_length_before']:.2f} -> "
                f"{row['mean_acceptance_length_after']:.2f} greedy, {row['mean_acceptance_length_sampled_before']:.2f}"
                f" -> {row['mean_acceptance_length_sampled_after']:.2f} sampled"
            )
        print(f"wrote {args.out}/results.json, results.csv, acceptance.png")
        return 0
    config = load_config(DistillConfig, args.config, overrides)
    results = distill(config, args.out, progress=_quiet(args))
    print(json.dumps(results, indent=2))
    return 0


def add_train_head(subparsers):
    p = subparsers.add_parser(
        "train-head",
        help="train a Medusa, EAGLE, EAGLE-3, DFlash-style block, DSpark or DFlash 2 draft head on a frozen "
        "target's hidden states (resumes automatically)",
        description="Train a draft head that reads the target's own hidden states: Medusa (K residual heads "
        "through the target's LM head), EAGLE (one decoder layer extrapolating the target's final feature) or "
        "EAGLE-3-style (the same over several of the target's layers), distilled toward the target's "
        "distribution; or EAGLE-3 as published (eagle.eagle3.enabled: its own LM head over a draft vocabulary "
        "picked by token frequency, trained by the multi-step training-time test); or a DFlash-style block head "
        "(kind: block: K proposals from one bidirectional pass over [last token, MASK x K] reading the target's "
        "multi-layer states); or DSpark (kind: dspark: the block head plus a low-rank Markov head, each output "
        "also reading the draft before it, and a confidence head trained to say whether each draft survives); or "
        "DFlash 2 (kind: dflash2: the block head plus a two-tap dynamic convolution across the block and a "
        "selector choosing the proposal among the block's top paths). "
        "Writes metrics.jsonl (with "
        "held-out acceptance), results.json and the head under OUT/head, which `specjax generate --drafter "
        "OUT/head` and `specjax.load_drafter` accept for the target it was trained for. Rerunning the same "
        "command resumes.",
        formatter_class=HelpFormatter,
    )
    _add_run_arguments(
        p,
        "YAML of a HeadTrainConfig (configs/medusa_head.yaml, configs/eagle_head.yaml, configs/eagle3_head.yaml, "
        "configs/eagle3_published_head.yaml, configs/block_head.yaml, configs/dspark_head.yaml, "
        "configs/dflash2_head.yaml)" + _NO_CONFIG,
        _RESUMABLE_OUT,
        config_required=False,
    )
    _add_target_and_data(p)
    _add_mesh(p)
    p.set_defaults(func=_train_head)
    return p


def _train_head(args) -> int:
    from specjax.configs import load_config
    from specjax.training.train_heads import HeadTrainConfig, train_head

    config = load_config(HeadTrainConfig, args.config, [*_target_and_data(args), *_mesh(args), *args.set])
    results = train_head(config, args.out, progress=_quiet(args))
    print(json.dumps(results, indent=2))
    return 0


def add_store_features(subparsers):
    p = subparsers.add_parser(
        "store-features",
        help="run the frozen target once over a train-head run's windows and store what an EAGLE-3 or block head's "
        "loss reads of it (resumes automatically)",
        description="Write the feature store of an EAGLE-3 train-head config (eagle.eagle3.enabled) or a block head's "
        "(kind block, dspark, dflash2): for every training window, the target's feature-layer states and its logits "
        "over the run's draft vocabulary (EAGLE-3) or its features.top_k log-probabilities (block heads), in "
        "safetensors shards with a manifest recording what they were computed from. Then train with "
        "`specjax train-head --config CFG --set features.store=OUT`: the same batches and loss, without the target "
        "forward per step. Rerunning the same command finishes an interrupted store. See docs/training.md, "
        '"Training from stored features".',
        formatter_class=HelpFormatter,
    )
    _add_run_arguments(
        p,
        "YAML of an EAGLE-3 or block-head HeadTrainConfig (configs/eagle3_published_head.yaml, "
        "configs/smollm2_block_v2.yaml): the run the store is for (target, data, seed, steps, layers, "
        "draft vocabulary or features.top_k, features.dtype)",
        "the store's directory (rerun with the same one to resume)",
    )
    _add_target_and_data(p)
    p.set_defaults(func=_store_features)
    return p


def _store_features(args) -> int:
    from specjax.configs import load_config
    from specjax.training.train_heads import HeadTrainConfig, store_features

    config = load_config(HeadTrainConfig, args.config, [*_target_and_data(args), *args.set])
    print(json.dumps(store_features(config, args.out, progress=_quiet(args)), indent=2))
    return 0


def add_bench(subparsers):
    from specjax.bench.experiments import REGISTRY  # read now: the listing is every registered experiment

    listing = ", ".join(f"{e.id} {e.name}" for e in REGISTRY)
    first, last = min(REGISTRY, key=lambda e: e.number), max(REGISTRY, key=lambda e: e.number)
    p = subparsers.add_parser(
        "bench",
        help=f"run experiments {first.id}-{last.id} "
        "(timing, acceptance, cost model, drafting methods, trees, scaling, adaptive K) with results and plots",
        description=f"Run the experiments a BenchConfig lists ({listing}) and write OUT/results.json, "
        "OUT/results.csv, one CSV and one PNG per experiment, and OUT/summary.md. Timings exclude compilation, "
        "are repeated, interleaved and reported as medians. See docs/bench.md.",
        formatter_class=HelpFormatter,
    )
    _add_run_arguments(
        p,
        "YAML of a BenchConfig (see configs/quick.yaml, configs/e*.yaml)",
        "results directory (created; files in it are overwritten)",
    )
    p.set_defaults(func=_bench)
    return p


def _bench(args) -> int:
    from specjax.bench import run_bench
    from specjax.bench.bench_config import bench_config_class
    from specjax.bench.report import summary_line
    from specjax.configs import load_config

    config = load_config(bench_config_class(), args.config, args.set)  # the sections of every registered experiment
    sets = [part for value in args.set for part in ("--set", value)]
    config_args = ["--config", args.config] if args.config else []
    command = ["specjax", "bench", *config_args, "--out", args.out, *sets]  # recorded: what reruns it
    results = run_bench(config, args.out, progress=_quiet(args), command=command)
    for name, experiment in results["experiments"].items():
        summary = summary_line(experiment)
        compiled, compiling = experiment["compiled_programs"], experiment.get("compile_seconds", 0.0)
        where = f"{experiment['seconds']:.0f} s, {compiled} programs compiled in {compiling:.0f} s"
        print(f"{experiment['id']} {name} ({where}): {summary}")
    print(f"wrote {args.out}/results.json, results.csv, summary.md and one PNG + CSV per experiment")
    return 0
