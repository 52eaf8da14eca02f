"""E9 on an accelerator: chain vs preset and tuned token trees at equal verify width, up to 64.

The comparison of configs/e9_trees.yaml (`specjax bench`), standalone: it imports no
specjax.bench (so neither matplotlib nor tqdm), needs no internet (the embedded pair ships
in models/pretrained) and no install (it imports specjax from the repository it sits in),
and writes one JSON file, rewritten after every part so a run cut short keeps what it
finished. It needs jax, flax, optax, safetensors, numpy and pyyaml.

Part 1, measured: the embedded trained pair (stdlib-target, 5M parameters; stdlib-draft,
0.5M) end to end. At each verify width w: the chain of K = w - 1 (the ordinary chain
round), the tree tuned to the pair with w - 1 nodes (depth up to w - 1) and the tuned tree
capped at depth 8; each preset at its own width. Trees are tuned on the train split of the
stdlib corpus, measured on its test split. Every generation of every shape, and plain
decoding, is timed round-robin, so speedups are ratios of times measured side by side
(median over repetitions of the paired ratio). Greedy rows check the output against plain
decoding token for token.

Part 2, predicted (--big): the tiny pair is bound by kernel launches on a GPU, so its
wall time says little about a real model. This part times forwards of a bigger
random-weight bf16 pair (~0.9B target, ~60M draft by default): the target at every verify
width, the draft at every level width a round feeds. A round of a shape costs its draft
forwards (a catch-up of width 2, then one forward per depth below the deepest, as wide as
that level's internal nodes) plus one target forward of width N + 1; its predicted speedup
is part 1's measured tokens per round x a plain step / that round. Labelled "predicted":
acceptance is the embedded pair's, costs are the big pair's; sampling, acceptance and
commit are left out of the round.

    python scripts/gpu_trees.py --out runs/gpu_trees.json             # ~8 min on one H200 (est.)
    python scripts/gpu_trees.py --quick --out /tmp/gpu_trees.json      # CPU smoke test
    python scripts/gpu_trees.py --widths 8,16,32,64 --presets binary-3,medusa-like-64 --no-big
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

from _repo_import import import_specjax_from_this_repository

import_specjax_from_this_repository()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from specjax.models import ModelConfig, forward, init_cache  # noqa: E402

import specjax  # noqa: E402
from specjax.drafters import DraftModel  # noqa: E402
from specjax.engine.tune import measure_acceptance  # noqa: E402
from specjax.io.presets import resolve_model  # noqa: E402
from specjax.training.data import held_out_prompts  # noqa: E402
from specjax.trees import Tree  # noqa: E402

BIG_TARGET = ModelConfig(
    vocab_size=32000,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=16,
    num_attention_heads=16,
    num_key_value_heads=8,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
    dtype="bfloat16",
)
BIG_DRAFT = ModelConfig(
    vocab_size=32000,
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=4,
    num_attention_heads=12,
    num_key_value_heads=4,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
    dtype="bfloat16",
)
# --quick: small enough for a 2-core CPU.
QUICK_TARGET = BIG_TARGET.replace(
    vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, dtype="float32",
)  # fmt: skip
QUICK_DRAFT = QUICK_TARGET.replace(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- Part 1: the embedded pair, end to end ------------------------------------------------


def shapes(widths, tuned_depths, presets, table):
    """(label, kind, name, tree or None for the chain, its tree form) per verify shape."""
    out, seen_labels = [], set()
    for width in widths:
        k = width - 1
        out.append((f"chain K={k}", "chain", "chain", None, Tree.chain(k)))
        seen = set()
        for cap in tuned_depths if table is not None else []:
            tree = Tree.from_acceptance(table if cap is None else table[:cap], k)
            name = "tuned" if cap is None else f"tuned depth<={cap}"
            label = f"{name} N={tree.num_nodes}"
            if tree.paths in seen or label in seen_labels:
                continue  # the cap does not bind here: the same tree is measured once
            seen.add(tree.paths)
            seen_labels.add(label)
            out.append((label, "tuned", name, tree, tree))
    out += [(name, "preset", name, Tree.preset(name), Tree.preset(name)) for name in presets]
    return out


def pooled_stats(outputs) -> dict:
    stats = [o.stats for o in outputs]
    rounds = sum(s.rounds for s in stats)
    accepted = sum(s.accepted_tokens for s in stats)
    generated = sum(s.generated_tokens for s in stats)
    counts = np.sum([s.accepted_counts for s in stats], axis=0) if stats[0].accepted_counts else np.zeros(0)
    reached = np.concatenate([[rounds], counts])
    return {
        "rounds": rounds,
        "generated_tokens": generated,
        "target_forwards": sum(s.target_forwards for s in stats),
        "mean_acceptance_length": 1.0 + accepted / rounds if rounds else 1.0,
        # Forwards are batched: each serves every row of its request.
        "target_forwards_per_token": sum(s.target_forwards * len(o.tokens) for s, o in zip(stats, outputs, strict=True))
        / max(generated, 1),
        "accepted_per_position": [
            float(reached[i + 1] / reached[i]) if reached[i] else 0.0 for i in range(len(counts))
        ],
    }


def measure_pair(args, target, draft, prompts, tune_prompts, results, out_path) -> list[dict]:
    rows = []
    requests = [prompts[i : i + args.batch_size] for i in range(0, len(prompts), args.batch_size)]
    common = dict(max_new_tokens=args.max_new_tokens, seed=0)  # GenerationConfig fields
    tables = {}
    for t in args.temperatures:
        start = time.perf_counter()
        if args.tuned_depths:
            depth = max(args.widths) - 1
            if None not in args.tuned_depths:
                depth = min(depth, max(args.tuned_depths))
            tables[t] = measure_acceptance(
                target, draft, tune_prompts, temperature=t, max_new_tokens=args.tune_tokens, max_depth=depth
            )
            log(f"T={t}: acceptance table {tables[t].shape} in {time.perf_counter() - start:.0f} s")
    results["acceptance_tables"] = {f"temperature={t}": table.tolist() for t, table in tables.items()}
    specs = []  # (temperature, label, kind, name, tree, shape)
    for t in args.temperatures:
        specs.append((t, "plain", "plain", "plain", None, None))
        specs += [(t, *s) for s in shapes(args.widths, args.tuned_depths, args.presets, tables.get(t))]
    calls = {}
    for t, label, kind, _name, tree, shape in specs:
        start = time.perf_counter()
        if kind == "plain":
            config = specjax.GenerationConfig.at_temperature(t, **common)
            prepared = [specjax.prepare(target, r, config) for r in requests]
        else:
            config = specjax.GenerationConfig.at_temperature(t, **common)
            nodes = {"num_speculative_tokens": shape.num_nodes} if tree is None else {"tree": tree}
            speculative = specjax.SpeculativeConfig(**nodes)
            prepared = [specjax.prepare(target, r, config, draft=draft, speculative=speculative) for r in requests]
        outputs = [p.run() for p in prepared]  # compiles (one program per prompt length)
        calls[t, label] = (prepared, outputs)
        log(f"T={t} {label}: compiled and ran in {time.perf_counter() - start:.1f} s")
    seconds = {key: [] for key in calls}
    for repeat in range(args.repeats):
        for key, (prepared, _) in calls.items():
            start = time.perf_counter()
            for p in prepared:
                jax.block_until_ready(p.launch())
            seconds[key].append(time.perf_counter() - start)
        log(f"repetition {repeat + 1}/{args.repeats} done")
    for t, label, kind, name, _tree, shape in specs:
        prepared, outputs = calls[t, label]
        plain_seconds = np.asarray(seconds[t, "plain"])
        mine = np.asarray(seconds[t, label])
        stats = pooled_stats(outputs)
        tokens = sum(len(x) for o in outputs for x in o.tokens)
        row = {
            "temperature": t,
            "tree": name,
            "label": label,
            "kind": kind,
            "verify_width": 1 if shape is None else shape.num_nodes + 1,
            "tree_depth": 0 if shape is None else shape.depth,
            "tokens_per_second": float(np.median(tokens / mine)),
            "speedup_vs_plain": float(np.median(plain_seconds / mine)),
            "seconds": mine.tolist(),
            **stats,
        }
        if kind == "plain":
            row.update(mean_acceptance_length=1.0, target_forwards_per_token=1.0)
        if shape is not None:
            row["tree_is_chain"] = shape.is_chain
            row["level_widths"] = [len(shape.level(d)) for d in range(1, shape.depth + 1)]
            if t in tables:
                row["predicted_tokens_per_round"] = 1.0 + shape.expected_accepted(tables[t])
            if kind != "chain":
                row["tree_paths"] = [list(p) for p in shape.paths]
        if t == 0.0:
            plain_tokens = [x for o in calls[t, "plain"][1] for x in o.tokens]
            row["output_matches_plain"] = [x for o in outputs for x in o.tokens] == plain_tokens
        rows.append(row)
        results["measured"] = rows
        out_path.write_text(json.dumps(results, indent=1))
    return rows


# --- Part 2: a bigger random pair's forward costs, and predicted speedups -------------------------


@functools.partial(jax.jit, static_argnames=("config", "inner"), donate_argnums=3)
def _forwards(config, params, tokens, cache, positions, inner: int):
    def body(_, carry):
        cache, checksum = carry
        logits, cache = forward(config, params, tokens, positions, cache)
        return cache, checksum + logits[:, -1, 0].astype(jnp.float32)

    return jax.lax.fori_loop(0, inner, body, (cache, jnp.zeros(tokens.shape[0], jnp.float32)))


def forward_seconds(model, widths, context: int, batch: int, inner: int, repeats: int) -> dict[int, float]:
    """Seconds per forward of [batch, w] tokens at the end of a `context`-slot cache, per width,
    timed round-robin (median over repeats of `inner` dependent forwards)."""
    config, params = model.config, model.params
    calls = {}
    for w in sorted(set(widths)):
        tokens = jnp.ones((batch, w), jnp.int32)
        positions = jnp.broadcast_to(context - w + jnp.arange(w), (batch, w))
        calls[w] = (tokens, positions)
    caches = {w: init_cache(config, batch, context) for w in calls}
    for w, (tokens, positions) in calls.items():  # compile
        caches[w], checksum = _forwards(config, params, tokens, caches[w], positions, inner)
        jax.block_until_ready(checksum)
    samples = {w: [] for w in calls}
    for _ in range(repeats):
        for w, (tokens, positions) in calls.items():
            start = time.perf_counter()
            caches[w], checksum = _forwards(config, params, tokens, caches[w], positions, inner)
            jax.block_until_ready(checksum)
            samples[w].append((time.perf_counter() - start) / inner)
    return {w: statistics.median(s) for w, s in samples.items()}


def draft_widths(shape: Tree) -> list[int]:
    """Widths of the draft forwards of one round: the catch-up (2), then one per depth below
    the deepest, as wide as the level's nodes with children (a chain: K - 1 of width 1)."""
    return [2] + [len(shape.internal(d)) for d in range(1, shape.depth) if len(shape.internal(d))]


def predict_big(args, measured: list[dict], results: dict, out_path: Path) -> None:
    target_config, draft_config = (QUICK_TARGET, QUICK_DRAFT) if args.quick else (BIG_TARGET, BIG_DRAFT)
    target = specjax.init_model(target_config, seed=0)
    draft = specjax.init_model(draft_config, seed=1)
    spec_rows = [r for r in measured if r["kind"] != "plain"]
    shapes_ = {}
    for r in spec_rows:
        shape = (
            Tree.chain(r["verify_width"] - 1) if r["kind"] == "chain" else Tree.from_paths(map(tuple, r["tree_paths"]))
        )
        shapes_[r["temperature"], r["label"]] = shape
    target_widths = {1} | {s.num_nodes + 1 for s in shapes_.values()}
    draft_set = {w for s in shapes_.values() for w in draft_widths(s)}
    start = time.perf_counter()
    t_target = forward_seconds(target, target_widths, args.big_context, 1, args.inner, args.repeats)
    t_draft = forward_seconds(draft, draft_set, args.big_context, 1, args.inner, args.repeats)
    seconds = time.perf_counter() - start
    log(f"big pair: {len(target_widths)} target and {len(draft_set)} draft widths in {seconds:.0f} s")
    plain = t_target[1]
    rows = []
    for r in spec_rows:
        shape = shapes_[r["temperature"], r["label"]]
        drafting = sum(t_draft[w] for w in draft_widths(shape))
        verify = t_target[shape.num_nodes + 1]
        rows.append(
            {
                "temperature": r["temperature"],
                "tree": r["tree"],
                "label": r["label"],
                "verify_width": r["verify_width"],
                "tree_depth": r["tree_depth"],
                "draft_forwards": len(draft_widths(shape)),
                "draft_ms": 1e3 * drafting,
                "verify_ms": 1e3 * verify,
                "verify_relative_to_width_1": verify / plain,
                "measured_tokens_per_round": r["mean_acceptance_length"],
                "predicted_speedup": r["mean_acceptance_length"] * plain / (drafting + verify),
            }
        )
    results["big_pair"] = {
        "target": {"parameters": target.num_parameters, "config": vars(target_config)},
        "draft": {"parameters": draft.num_parameters, "config": vars(draft_config)},
        "context": args.big_context,
        "plain_step_ms": 1e3 * plain,
        "target_forward_ms_by_width": {str(w): 1e3 * s for w, s in sorted(t_target.items())},
        "draft_forward_ms_by_width": {str(w): 1e3 * s for w, s in sorted(t_draft.items())},
        "predicted": rows,
        "note": "PREDICTED: the embedded pair's measured tokens per round x the big random pair's forward costs; "
        "a round = its draft forwards + one verify forward (sampling, acceptance and commit left out)",
    }
    out_path.write_text(json.dumps(results, indent=1))


# --- Reporting ------------------------------------------------------------------------------------


def summarize(measured: list[dict], temperatures) -> dict:
    summary = {}
    for t in temperatures:
        mine = [r for r in measured if r["temperature"] == t and r["kind"] != "plain"]
        for what, group in (
            ("chain", [r for r in mine if r["kind"] == "chain"]),
            ("tree", [r for r in mine if r["kind"] != "chain"]),
        ):
            if group:
                best = max(group, key=lambda r: r["tokens_per_second"])
                summary[f"best_{what} (T={t})"] = (
                    f"{best['label']} (width {best['verify_width']}): {best['speedup_vs_plain']:.2f}x plain, "
                    f"{best['mean_acceptance_length']:.2f} tokens/round"
                )
        chains = {r["verify_width"]: r for r in mine if r["kind"] == "chain"}
        tuned = [r for r in mine if r["tree"] == "tuned" and r["verify_width"] in chains]
        if tuned:
            summary[f"tuned_at_or_above_chain (T={t})"] = all(
                r["mean_acceptance_length"] >= chains[r["verify_width"]]["mean_acceptance_length"] for r in tuned
            )
    greedy = [r for r in measured if r["temperature"] == 0.0 and "output_matches_plain" in r]
    if greedy:
        summary["greedy_outputs_match_plain"] = all(r["output_matches_plain"] for r in greedy)
    return summary


def table(rows: list[dict], columns: list[str]) -> str:
    def cell(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/gpu_trees.json"))
    parser.add_argument("--quick", action="store_true", help="a CPU smoke test: few shapes, prompts and tokens")
    parser.add_argument("--widths", default="8,16,32,64")
    parser.add_argument("--presets", default="binary-3,prior-16,prior-32,medusa-like-64")
    parser.add_argument("--tuned-depths", default="none,8", help="'none': depth up to the node count; '' for none")
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per domain (code, prose)")
    parser.add_argument("--prompt-bytes", type=int, default=96)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tune-prompts", type=int, default=8, help="train-split prompts per domain for tuning")
    parser.add_argument("--tune-tokens", type=int, default=128)
    parser.add_argument("--big", action=argparse.BooleanOptionalAction, default=None, help="part 2 (default: on GPU)")
    parser.add_argument("--big-context", type=int, default=1024)
    parser.add_argument("--inner", type=int, default=8, help="dependent forwards per timed sample (part 2)")
    args = parser.parse_args()
    if args.quick:
        args.widths, args.presets, args.tuned_depths = "4,8", "binary-3", "none,2"
        args.prompts, args.prompt_bytes, args.max_new_tokens, args.repeats = 1, 48, 24, 1
        args.tune_prompts, args.tune_tokens, args.big_context, args.inner = 2, 32, 128, 2
    args.widths = [int(w) for w in args.widths.split(",")]
    args.presets = [p for p in args.presets.split(",") if p]
    args.tuned_depths = [None if d.lower() == "none" else int(d) for d in args.tuned_depths.split(",") if d]
    args.temperatures = [float(t) for t in args.temperatures.split(",")]
    backend = jax.default_backend()
    if args.big is None:
        args.big = backend == "gpu" or args.quick
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log(f"backend {backend}: {jax.devices()[0].device_kind}; jax {jax.__version__}; writing {args.out}")

    begin = time.perf_counter()
    target, draft_model = resolve_model("stdlib-target"), resolve_model("stdlib-draft")
    draft = DraftModel(draft_model)
    encode = target.tokenizer.encode
    prompts, tune_prompts = [], []
    for domain in ("code", "prose"):
        prompts += [encode(p) for p in held_out_prompts(domain, args.prompts, args.prompt_bytes, "test")]
        tune_prompts += [encode(p) for p in held_out_prompts(domain, args.tune_prompts, args.prompt_bytes, "train")]
    shortest = min(len(p) for p in prompts)  # one length: one compiled program per shape
    prompts = [p[:shortest] for p in prompts]
    results = {
        "script": "scripts/gpu_trees.py",
        "arguments": {k: v for k, v in vars(args).items() if k != "out"},
        "environment": {
            "backend": backend,
            "device": jax.devices()[0].device_kind,
            "jax": jax.__version__,
            "python": sys.version.split()[0],
        },
        "pair": {
            "target": "stdlib-target",
            "draft": "stdlib-draft",
            "parameters": [target.num_parameters, draft_model.num_parameters],
        },
        "prompts": f"{args.prompts} code + {args.prompts} prose, test split, {shortest} tokens each",
        "tuned_on": f"{args.tune_prompts} code + {args.tune_prompts} prose, train split (disjoint from the measured)",
    }
    measured = measure_pair(args, target, draft, prompts, tune_prompts, results, args.out)
    results["summary"] = summarize(measured, args.temperatures)
    args.out.write_text(json.dumps(results, indent=1))
    if args.big:
        predict_big(args, measured, results, args.out)
    results["seconds"] = time.perf_counter() - begin
    args.out.write_text(json.dumps(results, indent=1))

    columns = ["temperature", "label", "verify_width", "tree_depth", "mean_acceptance_length"]
    columns += ["predicted_tokens_per_round", "target_forwards_per_token", "tokens_per_second", "speedup_vs_plain"]
    print(table(measured, [*columns, "output_matches_plain"]))
    if args.big:
        big = results["big_pair"]
        print(f"\nbig pair (PREDICTED), plain step {big['plain_step_ms']:.3f} ms:")
        columns = ["temperature", "label", "verify_width", "draft_forwards", "draft_ms", "verify_ms"]
        print(table(big["predicted"], [*columns, "measured_tokens_per_round", "predicted_speedup"]))
    print("\n" + json.dumps(results["summary"], indent=1))
    log(f"total {results['seconds']:.0f} s")


if __name__ == "__main__":
    main()
