"""E10 on a multi-device machine (8 GPUs, a TPU v5e-8): tokens/s and TP efficiency against mesh shape.

Standalone like scripts/gpu_trees.py: imports specjax from this repository, no
specjax.bench, one JSON file rewritten after every mesh. For every (data, model) mesh
that divides the devices (or --meshes), on a random-weight bf16 pair (acceptance does not
matter here; cost does):
  - checks that greedy plain decoding on the mesh gives the 1 x 1 mesh's tokens;
  - times a plain decode step, a verify forward of K + 1 and a draft step (draft
    replicated and, when its heads split, tensor-parallel) by whole generations of a
    fixed budget, round-robin over the meshes' programs;
  - measures the all-reduce bus bandwidth of each "model" axis size;
  - reports measured TP efficiency t_1 / (M t_M) beside the cost model's prediction from
    the measured link (specjax/parallel/cost.py), and the predicted speculative speedup
    at --tokens-per-round (default 3.0, about what a trained 1:10 pair accepts at K = 4).

    python scripts/gpu_scaling.py --out runs/gpu_scaling.json
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python scripts/gpu_scaling.py --quick --out /tmp/s.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

from _repo_import import import_specjax_from_this_repository

import_specjax_from_this_repository()

import jax  # noqa: E402

import specjax  # noqa: E402
from specjax.io.sharding import replicate_model, shard_model  # noqa: E402
from specjax.parallel.cost import per_device_bytes, tp_allreduce_bytes, tp_efficiency, tp_forward_seconds  # noqa: E402
from specjax.parallel.mesh import make_mesh  # noqa: E402


def _configs(quick: bool):
    if quick:
        target = specjax.ModelConfig(
            vocab_size=512,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=4,
            max_position_embeddings=1024,
            tie_word_embeddings=False,
        )
        return target, target.replace(hidden_size=64, intermediate_size=128, num_hidden_layers=1)
    # ~1.1B bf16 target (Llama shape, GQA 32/8), ~90M draft.
    target = specjax.ModelConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    draft = target.replace(
        hidden_size=768, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4
    )
    return target, draft


def _meshes(arg: str | None) -> list[tuple[int, int]]:
    if arg:
        return [tuple(int(x) for x in m.split("x")) for m in arg.split(",")]
    n = jax.device_count()
    splits = [(n // m, m) for m in range(1, n + 1) if n % m == 0]
    return list(dict.fromkeys([(1, 1), *splits]))  # 1 x 1 first: the reference


def _timed(fn, repeats: int) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _allreduce(mesh, megabytes: float) -> float:
    from specjax.bench.experiments.e10_scaling import measure_allreduce  # only the function: no matplotlib needed

    return measure_allreduce(mesh, megabytes)["bus_bytes_per_second"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--meshes", help="e.g. 1x1,1x8,2x4 (data x model); default: every split of the devices")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--new", type=int, default=64, help="tokens per generation")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens-per-round", type=float, default=3.0)
    parser.add_argument("--quick", action="store_true", help="tiny models: a CPU smoke test")
    args = parser.parse_args()

    target_cfg, draft_cfg = _configs(args.quick)
    target, draft = specjax.init_model(target_cfg, 0), specjax.init_model(draft_cfg, 1)
    prompts = [[(7 * i + j) % 500 + 1 for j in range(32)] for i in range(args.batch)]
    out = {"devices": [str(d) for d in jax.devices()], "target": vars(target_cfg), "draft": vars(draft_cfg), "rows": []}
    reference, base = None, None
    for d, m in _meshes(args.meshes):
        if d * m > jax.device_count():
            continue
        mesh = make_mesh(d, m)
        try:
            st = shard_model(target, mesh)
        except ValueError as e:
            out["rows"].append({"mesh": f"{d}x{m}", "skipped": str(e)})
            continue
        drafts = {"replicated": replicate_model(draft, mesh)}
        with contextlib.suppress(ValueError):  # a draft whose heads do not split: replicated only
            drafts["sharded"] = shard_model(draft, mesh)
        plain = specjax.prepare(st, prompts, specjax.GenerationConfig(max_new_tokens=args.new, ignore_eos=True))
        tokens = plain.run().tokens
        reference = reference or tokens
        row = {"mesh": f"{d}x{m}", "data": d, "model": m, "greedy_matches_1x1": tokens == reference}
        row["plain_seconds"] = _timed(lambda p=plain: p.launch(args.new).tokens, args.repeats)
        row["plain_step_seconds"] = row["plain_seconds"] / args.new
        row["tokens_per_second"] = args.batch * args.new / row["plain_seconds"]
        for layout, dm in drafts.items():
            spec = specjax.prepare(
                st,
                prompts,
                specjax.GenerationConfig(max_new_tokens=args.new, ignore_eos=True),
                draft=dm,
                speculative=specjax.SpeculativeConfig(num_speculative_tokens=args.k),
            )
            state = spec.launch(args.new)
            rounds = int(jax.device_get(state.forwards))  # verify passes of the generation
            seconds = _timed(lambda s=spec: s.launch(args.new).tokens, args.repeats)
            row[f"speculative_{layout}_seconds"] = seconds
            if rounds:
                row[f"round_{layout}_seconds"] = seconds / rounds
        mem = per_device_bytes(target_cfg, d, m, args.batch, plain.cache_length)
        row["per_device_bytes"] = mem
        row["allreduce_bytes_per_step"] = tp_allreduce_bytes(target_cfg, args.batch // d, 1, m)["payload_bytes"]
        if m > 1:
            row["link_bus_bytes_per_second"] = _allreduce(mesh, 64 if not args.quick else 4)
        if (d, m) == (1, 1):
            base = row["plain_step_seconds"]
        out["rows"].append(row)
        Path(args.out).write_text(json.dumps(out, indent=2, default=str))
        jax.clear_caches()
    for row in out["rows"]:
        if base and row.get("model", 1) > 1 and "link_bus_bytes_per_second" in row:
            m, d = row["model"], row["data"]
            predicted = tp_forward_seconds(base, target_cfg, args.batch // d, 1, m, row["link_bus_bytes_per_second"])
            row["predicted_tp_efficiency"] = tp_efficiency(base, predicted, m)
            row["measured_tp_efficiency"] = tp_efficiency(base, row["plain_step_seconds"], m)
            for layout in ("replicated", "sharded"):
                if f"round_{layout}_seconds" in row:
                    row[f"predicted_speedup_{layout}"] = (
                        args.tokens_per_round * row["plain_step_seconds"] / row[f"round_{layout}_seconds"]
                    )
    Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    for row in out["rows"]:
        print({k: v for k, v in row.items() if not isinstance(v, dict)})


if __name__ == "__main__":
    main()
