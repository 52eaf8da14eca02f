"""`specjax generate`: prompts in (flags, a file or stdin), text and acceptance statistics out."""

from __future__ import annotations

import argparse
import json
import sys

import jax

from specjax.configs import parse_yaml
from specjax.models.cache import DEFAULT_BLOCK_SIZE


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show defaults, except the uninformative None/False ones."""

    def _get_help_string(self, action):
        if action.default in (None, False, argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


def add_generate(subparsers) -> argparse.ArgumentParser:
    from specjax.io.embedded import default_pair, embedded_heads, embedded_names
    from specjax.io.presets import RANDOM_PRESETS
    from specjax.trees.tree import PRESETS

    p = subparsers.add_parser(
        "generate",
        help="generate text with speculative (or plain) decoding and print acceptance statistics",
        description="Generate from one or more prompts (one batch) and print the text and statistics. "
        "Prompts come from --prompt (repeatable), --prompt-file (text or JSONL; '-' reads stdin), or both.",
        formatter_class=HelpFormatter,
    )
    from specjax.io.gguf_file import PACKAGED

    names = ", ".join([*embedded_names(), *sorted(RANDOM_PRESETS), *sorted(PACKAGED)])
    names += ", a .gguf file or a local HF directory"
    heads = ", ".join(embedded_heads()) or "none installed"
    default_target, default_draft = default_pair()
    p.add_argument("--prompt", action="append", help="prompt text; repeat for a batch ('def ' if no prompt is given)")
    p.add_argument(
        "--prompt-file",
        metavar="PATH",
        help="more prompts: a .jsonl file ('prompt' or 'turns' per line) or a text file (prompts separated by "
        "blank lines); '-' reads standard input",
    )
    p.add_argument(
        "--chat", action="store_true", help="wrap each prompt as a user turn with the tokenizer's chat template"
    )
    p.add_argument("--target", default=default_target, help=f"target model: {names}")
    p.add_argument(
        "--drafter",
        "--draft",  # the earlier flag for draft models: the same spec now
        dest="drafter",
        default=None,
        help=f"how to draft: a drafter's name, whose own files say what it is (a draft model: {names}; a trained "
        f"head: {heads}; a PARD draft such as stdlib-pard-draft; any directory written by save_drafter, "
        "save_model or distill; a published EAGLE/EAGLE-3/Medusa/speculators head directory), prompt-lookup, "
        "suffix (suffix decoding; '{method: suffix, suffix_pool: FILE}' copies from earlier outputs, e.g. a "
        "--json file), layer-skip (half the target's layers) or layer-skip:N; or a SpeculativeConfig as a YAML "
        "mapping, e.g. "
        "'{method: ngram, prompt_lookup_max: 2}', '{method: head, model: DIR, allow_transfer: true}' or "
        "'{method: fallback, first: prompt-lookup, then: stdlib-draft}' (docs/drafters.md). "
        f"Default: {default_draft} for the {default_target} target (random-draft for random-target); other targets "
        "need --drafter or --plain",
    )
    p.add_argument("--plain", action="store_true", help="plain decoding with the target only (the baseline)")
    p.add_argument(
        "-k",
        "--num-speculative-tokens",
        type=int,
        default=None,
        help="draft tokens per round (K); default: the --drafter mapping's num_speculative_tokens, else 4",
    )
    p.add_argument(
        "--tree",
        default=None,
        help="verify a token tree instead of a chain of K: a preset (" + ", ".join(sorted(PRESETS)) + "), "
        "chain:K, full:BRANCHING:DEPTH, or Medusa-style paths as YAML, e.g. '[[0], [1], [0, 0]]'. Works with "
        "draft models, layer skip, Medusa and EAGLE heads; not with prompt lookup or fallback",
    )
    p.add_argument(
        "--adaptive",
        action="store_true",
        help="choose K each round (0 = a plain step, up to -k) from past acceptance and measured round costs; "
        "output is unchanged. The costs are measured once per machine and shape and cached on disk "
        "(docs/adaptive.md)",
    )
    p.add_argument("--remeasure-costs", action="store_true", help="with --adaptive: measure round costs anew")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate per prompt")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; > 0 = exact speculative sampling")
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens (both models)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass (both models)")
    p.add_argument("--min-p", type=float, default=None, help="keep tokens with p >= MIN_P x the top token's (both)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (and random-init seed)")
    p.add_argument("--eos-token-id", type=int, default=None, help="stop a row at this token (default: the tokenizer's)")
    p.add_argument("--ignore-eos", action="store_true", help="never stop early: always generate --max-new-tokens")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument(
        "--json-schema",
        metavar="FILE",
        default=None,
        help="constrain every output to JSON valid against the schema in FILE (docs/constraints.md); "
        "speculation stays exact",
    )
    shape.add_argument(
        "--regex", metavar="PATTERN", default=None, help="constrain every output to match PATTERN (Rust regex syntax)"
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="KV-cache storage dtype (default: the params' dtype)",
    )
    p.add_argument("--prefill-chunk", type=int, default=512, help="prefill long prompts in chunks of this many tokens")
    p.add_argument(
        "--attention-block",
        type=int,
        default=DEFAULT_BLOCK_SIZE,
        help="attention reads the KV cache in blocks of this many slots",
    )
    p.add_argument(
        "--warmup",
        action="store_true",
        help="decode once, untimed, before the timed run (compilation is timed apart either way)",
    )
    p.add_argument(
        "--speedup",
        action="store_true",
        help="also decode the same prompts plainly (the target alone, same settings) and report the speedup: "
        "plain decode time / speculative decode time, compilation excluded on both sides, with both tokens/s "
        "(each side decodes once untimed, then 3 times round-robin: medians). At temperature 0 the two outputs "
        "are also checked to be equal token for token (sampled outputs are not compared: they follow the same "
        "distribution but draw other tokens)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object instead of text: text, tokens, stats, timing and the settings of the run",
    )
    p.add_argument(
        "--weights",
        choices=("float32", "bfloat16", "int8"),
        default="float32",
        help="weight format of the target and of a draft model, applied at load time: float32 (the params as "
        "loaded; exact against transformers), bfloat16 (matrices in bfloat16, float32 accumulation), int8 "
        "(matrices int8 with a float32 scale per output channel, activations quantised to int8 per token, int32 "
        "accumulation). In bfloat16 and int8, greedy speculative output equals plain greedy output of the same "
        "format by construction (fixed-order sums, docs/cli.md); in float32 in every test, barring a near-tie. "
        "The formats' outputs differ from each other: bfloat16 stays close to float32, int8 less so",
    )
    p.add_argument(
        "--mesh",
        default=None,
        metavar="data=D,model=M",
        help="shard over a device mesh: rows over 'data', tensor parallel over 'model' (see docs/scaling.md)",
    )
    p.set_defaults(func=generate_command)
    return p


def read_prompts(args) -> list:
    """--prompt values, then --prompt-file's prompts (strings, or bench.prompt_sets.Chat for a
    `messages` record); 'def ' when there are none."""
    prompts = list(args.prompt or [])
    if args.prompt_file is not None:
        from specjax.bench.prompt_sets import read_prompt_file

        prompts += [text for _, text in read_prompt_file(args.prompt_file, what="--prompt-file")]
    return prompts or ["def "]


def encode_prompts(tokenizer, texts: list, chat: bool):
    """Strings for the engine (it encodes them), or token ids when a chat template wraps them
    (--chat, or a prompt file's `messages` chats, which are always rendered by the template)."""
    if not chat and all(isinstance(text, str) for text in texts):
        return texts
    from specjax.bench.prompt_sets import encode

    return [encode(tokenizer, text, chat_template=chat) for text in texts]


def drafter_spec(args):
    """--drafter (a name or a YAML mapping) as the SpeculativeConfig it names, -k applied."""
    from specjax.config import SpeculativeConfig

    value = args.drafter or default_draft_for(args.target)
    if value.lstrip().startswith("{"):
        value = parse_yaml(value, "--drafter")
    spec = SpeculativeConfig.parse(value, "--drafter")
    if args.num_speculative_tokens is not None:
        spec = spec.replace(num_speculative_tokens=args.num_speculative_tokens)
    return spec


def default_draft_for(target: str) -> str:
    """The draft model paired with `target` when neither --draft nor --drafter is given."""
    from specjax.io.embedded import DEFAULT_DRAFT, DEFAULT_TARGET

    pairs = {DEFAULT_TARGET: DEFAULT_DRAFT, "random-target": "random-draft"}
    if target not in pairs:
        raise ValueError(
            f"no default draft for target {target!r}: give --drafter (prompt-lookup, layer-skip[:N], a head, "
            "or a draft model with the same tokenizer), or --plain"
        )
    return pairs[target]


def settings(args, draft, speculative) -> dict:
    """How the run was made, for --json: enough to trace a saved result back to its command."""
    from specjax.bench.timing import environment

    return {
        "command": ["specjax", *sys.argv[1:]] if sys.argv and sys.argv[0].endswith("specjax") else None,
        "target": args.target,
        "drafter": None if args.plain else (args.drafter or default_draft_for(args.target)),
        "drafter_kind": None if draft is None else getattr(draft, "name", "draft_model"),
        "num_speculative_tokens": None if args.plain or speculative.tree is not None else args.num_speculative_tokens,
        "tree": None if speculative.tree is None else repr(speculative.tree),
        "adaptive": bool(speculative.adaptive) and not args.plain,
        "verify_schedule": None if args.plain or not speculative.verify_schedule else repr(speculative.verify_schedule),
        "rule": None if speculative.rule is None else getattr(speculative.rule, "__name__", str(speculative.rule)),
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "seed": args.seed,
        "eos_token_id": args.eos_token_id,
        "ignore_eos": args.ignore_eos,
        "json_schema": args.json_schema,
        "regex": args.regex,
        "chat": args.chat,
        "kv_cache_dtype": args.kv_cache_dtype,
        "prefill_chunk": args.prefill_chunk,
        "attention_block": args.attention_block,
        "mesh": args.mesh,
        "weights": args.weights,
        "environment": environment(),
    }


def generate_command(args) -> int:
    from specjax.api import load_drafter, prepare
    from specjax.cli.summary import print_summary
    from specjax.cli.timed_run import SPEEDUP_REPEATS, speedup_record, timed_runs
    from specjax.config import GenerationConfig, SpeculativeConfig
    from specjax.core.loop import CacheConfig
    from specjax.io.presets import resolve_model
    from specjax.io.weight_formats import with_weights
    from specjax.trees.tree import Tree

    named = None if args.plain else drafter_spec(args)  # the --drafter spec, -k applied
    if args.num_speculative_tokens is None:  # -k not given: the --drafter mapping's K, else 4
        args.num_speculative_tokens = 4 if named is None else named.num_speculative_tokens
    if args.weights != "float32" and args.mesh is not None:
        raise ValueError(f"--weights {args.weights} with --mesh is not supported yet: use --weights float32")
    constraint = _constraint(args)  # checked before any model loads
    texts = read_prompts(args)
    target = with_weights(resolve_model(args.target, seed=args.seed), args.weights)
    tokenizer = target.tokenizer
    if tokenizer is None:
        raise ValueError(f"model {args.target!r} has no tokenizer, so it cannot take text prompts")
    prompts = encode_prompts(tokenizer, texts, args.chat)
    cache = CacheConfig(dtype=args.kv_cache_dtype, block_size=args.attention_block, prefill_chunk=args.prefill_chunk)
    config = GenerationConfig.at_temperature(
        args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        eos_token_id=args.eos_token_id,
        ignore_eos=args.ignore_eos,
        cache=cache,
        constraint=constraint,
    )  # fmt: skip  (eos_token_id None: the target's, as GenerationConfig resolves it)
    # A head checks the target's weights; a draft model is loaded in the target's format.
    draft = None if named is None else load_drafter(named, target, seed=args.seed, load=_loader(args))
    # The round's settings: the flags, else what the --drafter mapping says (tree, adaptive, rule,
    # verify_schedule).
    tree = None if args.tree is None or args.plain else Tree.from_spec(args.tree)
    if tree is None and named is not None:
        tree = named.tree
    adaptive = _adaptive(args) or (named.adaptive if named is not None else False)
    speculative = SpeculativeConfig(num_speculative_tokens=args.num_speculative_tokens, tree=tree,
                                    adaptive=adaptive, rule=None if named is None else named.rule,
                                    verify_schedule=None if named is None else named.verify_schedule)  # fmt: skip
    if args.mesh is not None:
        from specjax.drafters.pair_placement import shard_pair
        from specjax.parallel.mesh import mesh_from

        target, draft = shard_pair(target, draft, mesh_from(args.mesh))

    if args.speedup and draft is None:
        raise ValueError("--speedup compares speculative decoding with plain decoding: drop --plain")

    # Compilation is timed apart from decoding (cli/timed_run.py), and so is --speedup's plain run.
    spec = None if draft is None else speculative
    calls = {"speculative": lambda: prepare(target, prompts, config, draft=draft, speculative=spec)}
    if args.speedup:
        calls["plain"] = lambda: prepare(target, prompts, config)
    runs = timed_runs(calls, warmup=args.warmup or args.speedup, repeats=SPEEDUP_REPEATS if args.speedup else 1)
    timed = runs["speculative"]
    out = timed.output
    comparison = speedup_record(timed, runs["plain"], args.temperature) if args.speedup else None
    outputs = out.text if out.text is not None else [tokenizer.decode(t, skip_special_tokens=True) for t in out.tokens]
    measuring = _measuring_seconds(out.stats)
    timing = {
        **timed.timing(),
        "cost_measurement_seconds": measuring,
        "seconds": timed.prepare_seconds + timed.compile_seconds + timed.decode_seconds,
        "generate_seconds": timed.decode_seconds,  # the name before compile_seconds was apart
        "includes_compile": False,
        "warmup": timed.warmup,
        "backend": jax.default_backend(),
        "mesh": args.mesh,
    }
    if args.json:
        record = {
            "text": outputs,
            "tokens": out.tokens,
            "stats": out.stats.to_dict(),
            "timing": timing,
            "settings": settings(args, draft, speculative),
        }
        if comparison is not None:
            record["speedup"] = comparison
        print(json.dumps(record))
        return 0
    for prompt, text in zip(texts, outputs, strict=True):
        # A chat answer is a new turn, not a continuation of the prompt's text.
        turn = args.chat or not isinstance(prompt, str)
        print(f"--- {str(prompt)!r}\n{prompt}{chr(10) if turn else ''}{text}")
    print_summary(args, out.stats, tree, timing, comparison)
    return 0


def _loader(args):
    """How --drafter's model names load (as load_drafter's default: random presets and shapes
    drawn with seed + 1), converted to --weights."""
    from specjax.io.model import init_model
    from specjax.io.presets import load_model
    from specjax.io.weight_formats import with_weights
    from specjax.models import ModelConfig

    def load(name):
        if isinstance(name, ModelConfig):
            return with_weights(init_model(name, seed=args.seed + 1), args.weights)
        return load_model(name, seed=args.seed + 1, weights=args.weights)

    return load


def _constraint(args):
    """The Constraint --json-schema or --regex asks for (None: neither), its syntax checked."""
    from specjax.constraints import Constraint

    if args.regex is not None:
        constraint = Constraint(regex=args.regex)
    elif args.json_schema is not None:
        try:
            with open(args.json_schema, encoding="utf-8") as f:
                text = f.read()
        except OSError as error:
            raise ValueError(f"--json-schema: cannot read {args.json_schema}: {error.strerror}") from None
        constraint = Constraint(json_schema=text)
    else:
        return None
    constraint.check_syntax()
    return constraint


def _adaptive(args):
    """False, or the AdaptiveConfig the flags ask for (the cost measurement shows a progress bar)."""
    if not args.adaptive or args.plain:
        return False
    from specjax.engine.adaptive_policy import AdaptiveConfig

    return AdaptiveConfig(remeasure=args.remeasure_costs, progress=True)


def _measuring_seconds(stats) -> float:
    """Seconds the adaptive policy spent measuring round costs inside the timed call (0 if none)."""
    costs = (stats.adaptive or {}).get("costs")
    if isinstance(costs, dict) and costs.get("source") == "measured":
        return float(costs.get("seconds") or 0.0)
    return 0.0
