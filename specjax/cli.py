"""The `specjax` command line."""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import yaml

from specjax.drafters import make_drafter
from specjax.engine.decode import generate
from specjax.engine.loop import CacheConfig
from specjax.engine.speculative import speculative_generate
from specjax.io.embedded import default_pair, embedded_names
from specjax.io.presets import RANDOM_PRESETS, resolve_model
from specjax.trees.tree import PRESETS, Tree

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
  specjax generate --prompt "def parse_args(" --tree medusa-like-64
  specjax generate --prompt "def parse_args(" -k 8 --adaptive
  specjax generate --prompt "def parse_args(" --tree '[[0], [1], [0, 0], [1, 0], [0, 0, 0]]'
  specjax generate --prompt "x" --prompt "class Foo:" --temperature 1.0 --seed 3 --json
  specjax train --config configs/train_target.yaml --out runs/target
  specjax distill --config configs/distill_quick.yaml --out runs/distill_quick
  specjax train-head --config configs/medusa_head.yaml --out runs/medusa
  specjax bench --config configs/quick.yaml --out runs/bench_quick
  specjax bench --config configs/e3_k_sweep.yaml --out runs/e3 --set timing.repeats=9
  specjax bench --config configs/e8_methods.yaml --out runs/e8
"""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show defaults, except the uninformative None/False ones."""

    def _get_help_string(self, action):
        if action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def _add_generate(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text with speculative (or plain) decoding and print acceptance statistics",
        description="Generate from one or more prompts (one batch) and print the text and statistics.",
        formatter_class=_HelpFormatter,
    )
    names = ", ".join([*embedded_names(), *sorted(RANDOM_PRESETS)]) + ", or a local HF directory"
    default_target, default_draft = default_pair()
    p.add_argument("--prompt", action="append", help="prompt text; repeat for a batch ('def ' if none is given)")
    p.add_argument("--target", default=default_target, help=f"target model: {names}")
    p.add_argument("--draft", default=default_draft, help=f"draft model: {names}")
    p.add_argument(
        "--drafter",
        default=None,
        help="how to draft, overriding --draft: prompt-lookup, layer-skip (half the target's layers), "
        "layer-skip:N, a model name like --draft, or a YAML mapping such as "
        "'{kind: prompt_lookup, max_ngram: 2}' or '{kind: fallback, first: prompt-lookup, then: stdlib-draft}'",
    )
    p.add_argument("--plain", action="store_true", help="plain decoding with the target only (the baseline)")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=4, help="draft tokens per round (K)")
    p.add_argument(
        "--tree",
        default=None,
        help="verify a token tree instead of a chain of K: a preset (" + ", ".join(sorted(PRESETS)) + "), "
        "chain:K, full:BRANCHING:DEPTH, or Medusa-style paths as YAML, e.g. '[[0], [1], [0, 0]]' "
        "(works with draft models and layer skip)",
    )
    p.add_argument(
        "--adaptive",
        action="store_true",
        help="choose K each round (0 = a plain step, up to -k) from past acceptance and measured round costs; "
        "output is unchanged (README 'Adaptive speculation')",
    )
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate per prompt")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; > 0 = exact speculative sampling")
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens (both models)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass (both models)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (and random-init seed)")
    p.add_argument("--eos-token-id", type=int, default=None, help="stop a row at this token (default: the tokenizer's)")
    p.add_argument("--ignore-eos", action="store_true", help="never stop early: always generate --max-new-tokens")
    p.add_argument(
        "--kv-cache-dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="KV-cache storage dtype (default: the params' dtype)",
    )
    p.add_argument("--prefill-chunk", type=int, default=512, help="prefill long prompts in chunks of this many tokens")
    p.add_argument(
        "--attention-block", type=int, default=256, help="attention reads the KV cache in blocks of this size"
    )
    p.add_argument("--warmup", action="store_true", help="run once first so the timing excludes compilation")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument(
        "--mesh",
        default=None,
        metavar="data=D,model=M",
        help="shard over a device mesh: rows over 'data', tensor parallel over 'model' (see README 'Scaling out')",
    )
    p.set_defaults(func=_generate)


def _generate(args) -> int:
    target = resolve_model(args.target, seed=args.seed)
    tokenizer = target.tokenizer
    if tokenizer is None:
        raise ValueError(f"model {args.target!r} has no tokenizer, so it cannot take text prompts")
    prompts_text = args.prompt or ["def "]
    eos = None if args.ignore_eos else args.eos_token_id or getattr(tokenizer, "eos_token_id", None)
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    cache = CacheConfig(dtype=args.kv_cache_dtype, block_size=args.attention_block, prefill_chunk=args.prefill_chunk)
    common = dict(max_new_tokens=args.max_new_tokens, seed=args.seed, eos_token_id=eos, cache_config=cache, **sampling)
    draft = None if args.plain else _drafter(args, target)
    tree = None if args.tree is None or args.plain else Tree.from_spec(args.tree)
    if args.mesh is not None:
        from specjax.parallel.mesh import mesh_from
        from specjax.parallel.shard import shard_pair

        target, draft = shard_pair(target, draft, mesh_from(args.mesh))

    def run():
        if draft is None:
            return generate(target, prompts_text, **common)
        k = args.num_speculative_tokens
        return speculative_generate(
            target, draft, prompts_text, num_speculative_tokens=k, tree=tree, adaptive=args.adaptive, **common
        )

    if args.warmup:
        run()
    start = time.perf_counter()
    out = run()
    seconds = time.perf_counter() - start
    texts = out.text
    timing = {
        "seconds": seconds,
        "tokens_per_second": out.stats.generated_tokens / seconds,
        "includes_compile": not args.warmup,
        "backend": jax.default_backend(),
        "mesh": args.mesh,
    }
    if args.json:
        print(json.dumps({"text": texts, "tokens": out.tokens, "stats": out.stats.to_dict(), "timing": timing}))
        return 0
    for prompt, text in zip(prompts_text, texts, strict=True):
        print(f"--- {prompt!r}\n{prompt}{text}")
    s = out.stats
    print("---")
    mode = "plain" if args.plain else f"speculative K={args.num_speculative_tokens}"
    if args.adaptive and not args.plain:
        mode = f"adaptive speculative K <= {args.num_speculative_tokens}"
    if tree is not None:
        mode = f"speculative tree of {tree.num_nodes} nodes, depth {tree.depth} (verify width {s.verify_width})"
    print(f"{mode}: {s.generated_tokens} tokens, {s.target_forwards} target forwards, {s.rounds} row-rounds")
    if not args.plain:
        per_pos = " ".join(f"{a:.2f}" for a in s.accepted_per_position)
        print(f"acceptance rate {s.acceptance_rate:.3f}, mean acceptance length {s.mean_acceptance_length:.2f}")
        print(f"per-{'depth' if tree is not None else 'position'} acceptance [{per_pos}]")
        extra = ", ".join(f"{k} {v}" for k, v in s.drafter.items() if k != "kind")
        print(f"drafter {s.drafter.get('kind')}" + (f": {extra}" if extra else ""))
        if s.adaptive is not None:
            chosen = ", ".join(f"K={k}: {n}" for k, n in s.adaptive["rounds_per_k"].items())
            print(f"adaptive rounds per K: {chosen} (plain steps {s.adaptive['plain_steps']})")
    compile_note = "including compilation" if not args.warmup else "after warm-up"
    rate = timing["tokens_per_second"]
    print(f"{seconds:.3f} s ({compile_note}), {rate:.1f} tokens/s on {jax.default_backend()}")
    return 0


def _drafter(args, target):
    def load(name: str):
        return resolve_model(name, seed=args.seed + 1)

    if args.drafter is None:
        return make_drafter(args.draft, load, target.config)
    spec = args.drafter
    if spec.lstrip().startswith("{"):
        spec = yaml.safe_load(spec)
    return make_drafter(spec, load, target.config)


def _add_run_arguments(p, config_help: str) -> None:
    """What every resumable, config-driven command takes."""
    p.add_argument("--config", required=True, help=config_help)
    p.add_argument("--out", required=True, help="run directory (rerun with the same one to resume)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_train(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="pretrain a model on the stdlib corpus (resumes automatically)",
        description="Train a byte-level model on the Python standard-library corpus. Rerunning the same "
        "command with the same --out resumes from the newest checkpoint, even after kill -9.",
        formatter_class=_HelpFormatter,
    )
    _add_run_arguments(p, "YAML file of a TrainConfig (see configs/train_*.yaml)")
    p.add_argument("--export", help="also write the final model in Hugging Face format to this directory")
    p.set_defaults(func=_train)


def _train(args) -> int:
    from specjax.configs import load_config
    from specjax.training.train import TrainConfig, evaluate, train

    config = load_config(TrainConfig, args.config, args.set)
    print(f"training {config.model.num_parameters:,} parameters for {config.steps} steps into {args.out}")
    model = train(config, args.out, progress=not args.no_progress)
    print("validation bits/byte:", json.dumps(evaluate(model)))
    if args.export:
        from specjax.io.hf import save_model

        save_model(model, args.export)
        print(f"exported to {args.export}")
    return 0


def _add_distill(subparsers) -> None:
    p = subparsers.add_parser(
        "distill",
        help="distil a draft toward a target so that it is accepted more often (resumes automatically)",
        description="Train a draft on a divergence to a frozen target (DistillSpec-style). Writes "
        "metrics.jsonl (with held-out acceptance), results.json and the distilled draft in HF format "
        "under OUT/draft. Rerunning the same command with the same --out resumes.",
        formatter_class=_HelpFormatter,
    )
    _add_run_arguments(p, "YAML of a DistillConfig, or of a comparison (base: + variants:), see configs/distill_*.yaml")
    p.set_defaults(func=_distill)


def _distill(args) -> int:
    from specjax.configs import load_config
    from specjax.training.distill import DistillConfig, distill
    from specjax.training.distill_compare import CompareConfig, compare, is_comparison

    if is_comparison(args.config):
        config = load_config(CompareConfig, args.config, args.set)
        rows = compare(config, args.out, progress=not args.no_progress)
        for row in rows:
            print(
                f"{row['variant']:<24} acceptance length {row['mean_acceptance_length_before']:.2f} -> "
                f"{row['mean_acceptance_length_after']:.2f} greedy, {row['mean_acceptance_length_sampled_before']:.2f}"
                f" -> {row['mean_acceptance_length_sampled_after']:.2f} sampled"
            )
        print(f"wrote {args.out}/results.json, results.csv, acceptance.png")
        return 0
    config = load_config(DistillConfig, args.config, args.set)
    results = distill(config, args.out, progress=not args.no_progress)
    print(json.dumps(results, indent=2))
    return 0


def _add_train_head(subparsers) -> None:
    p = subparsers.add_parser(
        "train-head",
        help="train Medusa draft heads on a frozen target's hidden states (resumes automatically)",
        description="Train draft heads that read the target's own hidden states (Medusa: K residual "
        "heads through the target's LM head, distilled toward the target's distribution). Writes "
        "metrics.jsonl (with held-out acceptance), results.json and the head under OUT/head, which "
        "`specjax generate --drafter OUT/head` and `specjax.load_drafter` accept. Rerunning resumes.",
        formatter_class=_HelpFormatter,
    )
    _add_run_arguments(p, "YAML of a HeadTrainConfig (see configs/medusa_head.yaml)")
    p.set_defaults(func=_train_head)


def _train_head(args) -> int:
    from specjax.configs import load_config
    from specjax.training.heads import HeadTrainConfig, train_head

    config = load_config(HeadTrainConfig, args.config, args.set)
    results = train_head(config, args.out, progress=not args.no_progress)
    print(json.dumps(results, indent=2))
    return 0


def _add_bench(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="run experiments E1-E9 (timing, acceptance, cost model, drafting methods, trees) with results and plots",
        description="Run the experiments a BenchConfig lists (E1 tokens per round, E2 verify cost, E3 K sweep, "
        "E4 batch sweep, E5 context sweep, E6 waste, E7 sampling, E8 drafting methods, E9 token trees) and "
        "write OUT/results.json, OUT/results.csv, one CSV and one PNG per experiment, and OUT/summary.md. "
        "Timings exclude compilation, are repeated, interleaved and reported as medians. See README 'Bench'.",
        formatter_class=_HelpFormatter,
    )
    p.add_argument("--config", required=True, help="YAML of a BenchConfig (see configs/quick.yaml, configs/e*.yaml)")
    p.add_argument("--out", required=True, help="results directory (created; files in it are overwritten)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_bench)


def _bench(args) -> int:
    from specjax.bench import BenchConfig, run_bench
    from specjax.configs import load_config

    config = load_config(BenchConfig, args.config, args.set)
    results = run_bench(config, args.out, progress=not args.no_progress)
    for name, experiment in results["experiments"].items():
        summary = ", ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in experiment["summary"].items()
            if not isinstance(v, dict)
        )
        compiled = experiment["compiled_programs"]
        print(f"{experiment['id']} {name} ({experiment['seconds']:.0f} s, {compiled} programs compiled): {summary}")
    print(f"wrote {args.out}/results.json, results.csv, summary.md and one PNG + CSV per experiment")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specjax",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    _add_generate(subparsers)
    _add_train(subparsers)
    _add_distill(subparsers)
    _add_train_head(subparsers)
    _add_bench(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except ValueError as error:
        print(f"specjax: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
