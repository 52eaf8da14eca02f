"""specjax vs transformers on a real target, SmolLM2-135M-Instruct (GGUF), on this CPU, in one process.

Greedy, batch 1, chat prompts (rewrite, summarize, explain, code from configs/prompts/stdlib_chat/,
in the tokenizer's ChatML template; the same ids on both sides), exactly --max-new-tokens new
tokens (specjax ignore_eos=True; transformers eos_token_id=None plus min_new_tokens), K=4:
  1. plain: specjax.generate vs model.generate(do_sample=False), fp32 (with --bf16 also bfloat16);
  2. weight bytes/s of specjax plain decoding (batch 1: every token reads the whole params
     pytree, so param bytes x tokens/s) as a fraction of this machine's memcpy bandwidth
     (np.copyto of 1 GiB float32, best of 5, read + write counted: 2 GiB a copy); over whole
     calls, and decode only: (N-1) / (t(plain) - t(the same program stopped after 1 token));
  3. prompt lookup: specjax PromptLookup(max_ngram=3, min_ngram=1) vs transformers'
     prompt_lookup_num_tokens=4, max_matching_ngram_size=3 (fp32; HF takes the earliest match,
     specjax the latest), speedups over their own plain decoding;
  4. greedy agreement (leading equal tokens) reported; specjax lookup == specjax plain asserted.
Every (method, prompt) is warmed up once, then --repeats rounds run each once, the method order
rotated per round; medians. Times are whole generate calls (prefill included) on both sides.

    python scripts/real_target_speed.py --bf16
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only: nothing may download

import jax
import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from _timing import leading_agreement

import specjax
from specjax.drafters import PromptLookup
from specjax.engine.clock import cpu_model
from specjax.io.gguf_file import packaged_path

NAME, K = "smollm2-135m-instruct", 4
ROOT = Path(__file__).resolve().parent.parent
CATEGORIES = ("rewrite", "summarize", "explain", "code")
DTYPES = (("fp32", ""), ("bf16", "_bf16"))  # (dtype, method-name suffix)


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        return (out.stdout.strip() or None) if out.returncode == 0 else None
    except OSError:
        return None


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _memcpy_bandwidth(repeats: int = 5) -> dict:
    """Best of `repeats` np.copyto of 1 GiB float32 (after one untimed copy that faults the pages in),
    counted as 2 GiB moved: 1 GiB read + 1 GiB written (write-allocate traffic not counted)."""
    src = np.ones(2**28, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return {"bytes_per_copy_counted": 2 * src.nbytes, "best_seconds": best, "bytes_per_second": 2 * src.nbytes / best}


def _chat_prompts(tokenizer, count: int) -> list[tuple[str, str, list[int]]]:
    rows = {c: (ROOT / "configs/prompts/stdlib_chat" / f"{c}.jsonl").read_text().splitlines() for c in CATEGORIES}
    prompts = []
    for i in range(count):  # the first line of each category, then the second lines, ...
        category = CATEGORIES[i % len(CATEGORIES)]
        text = json.loads(rows[category][i // len(CATEGORIES)])["prompt"]
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        prompts.append((category, text, list(ids["input_ids"] if hasattr(ids, "keys") else ids)))
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=4, help="chat prompts, categories in turn (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="exact new tokens, at least 2 (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up (default 3)")
    parser.add_argument("--bf16", action="store_true", help="also plain decoding in bfloat16 on both sides")
    parser.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=Path("results/real_target_speed/results.json"), help="JSON file")
    args = parser.parse_args()
    if args.max_new_tokens < 2:
        parser.error("--max-new-tokens must be at least 2 (decode-only time is t(N) - t(1))")
    if args.torch_threads:  # on busy cores torch's OpenMP threads can spend most of their time waiting on each other
        torch.set_num_threads(args.torch_threads)
    n, load_start = args.max_new_tokens, os.getloadavg()
    transformers.utils.logging.disable_progress_bar()
    memcpy = _memcpy_bandwidth()  # first, before the models take memory

    path = packaged_path(NAME)
    models = {"fp32": specjax.load_model(NAME, dtype="float32")}
    hf_models = {"fp32": AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()}
    if args.bf16:
        models["bf16"] = specjax.load_model(NAME, dtype="bfloat16")
        hf_models["bf16"] = copy.deepcopy(hf_models["fp32"]).to(torch.bfloat16)
    param_bytes = {d: sum(x.nbytes for x in jax.tree_util.tree_leaves(m.params)) for d, m in models.items()}
    prompts = _chat_prompts(models["fp32"].tokenizer, args.prompts)
    P = range(len(prompts))

    config = specjax.GenerationConfig(max_new_tokens=n, ignore_eos=True)
    sj_lookup = dict(draft=PromptLookup(max_ngram=3, min_ngram=1))
    sj_lookup["speculative"] = specjax.SpeculativeConfig(num_speculative_tokens=K)
    hf_kwargs = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None)
    hf_lookup = dict(prompt_lookup_num_tokens=K, max_matching_ngram_size=3)
    # The plain call's compiled program, run for 1 token: prefill + first step, for decode-only time.
    prepared = {(d, p): specjax.prepare(models[d], [prompts[p][2]], config) for d in models for p in P}

    def sj(dtype: str, lookup: bool):
        def run(p):
            out = specjax.generate(models[dtype], [prompts[p][2]], config, **(sj_lookup if lookup else {}))
            return out.tokens[0], out.stats

        return run

    def hf(dtype: str, lookup: bool):
        def run(p):
            ids = torch.tensor([prompts[p][2]])
            with torch.inference_mode():
                seq = hf_models[dtype].generate(
                    ids, attention_mask=torch.ones_like(ids), **hf_kwargs, **(hf_lookup if lookup else {})
                )
            return seq[0, ids.shape[1] :].tolist(), None

        return run

    methods = {"specjax_plain": sj("fp32", False), "hf_plain": hf("fp32", False)}
    methods |= {"specjax_lookup": sj("fp32", True), "hf_lookup": hf("fp32", True)}
    if args.bf16:
        methods |= {"specjax_plain_bf16": sj("bf16", False), "hf_plain_bf16": hf("bf16", False)}
    generating = list(methods)
    for d, s in DTYPES[: len(models)]:
        methods[f"specjax_first_token{s}"] = lambda p, d=d: (jax.block_until_ready(prepared[d, p].launch(1)), None)

    # Warm-up: untimed; its outputs are the ones compared. A pre-hook counts HF target forwards.
    outputs, stats, hf_forwards, calls = {}, {}, {}, [0]
    for name, fn in methods.items():
        model = hf_models["bf16" if name.endswith("bf16") else "fp32"]
        hook = model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        for p in P:
            calls[0] = 0
            outputs[name, p], stats[name, p] = fn(p)
            hf_forwards[name, p] = calls[0]
            assert name not in generating or len(outputs[name, p]) == n, f"{name} prompt {p}: not {n} tokens"
        hook.remove()
    for p in P:
        assert outputs["specjax_lookup", p] == outputs["specjax_plain", p], f"prompt {p}: lookup != plain"

    jobs = [(name, p) for name in methods for p in P]
    times = {job: [] for job in jobs}
    for r in range(args.repeats):  # rotated by one method a round
        shift = r * len(prompts) % len(jobs)
        for name, p in jobs[shift:] + jobs[:shift]:
            times[name, p].append(_timed(lambda name=name, p=p: methods[name](p)))
    medians = {job: statistics.median(t) for job, t in times.items()}
    tps = {job: n / t for job, t in medians.items()}

    pairs = [("specjax_plain", "hf_plain"), ("specjax_lookup", "hf_lookup")]
    pairs += [("specjax_lookup", "specjax_plain"), ("hf_lookup", "hf_plain")]
    pairs += [("specjax_plain_bf16", "hf_plain_bf16"), ("specjax_plain_bf16", "specjax_plain")] * args.bf16
    pairs += [("hf_plain_bf16", "hf_plain")] * args.bf16
    ratios = {f"{a} / {b}": statistics.median(tps[a, p] / tps[b, p] for p in P) for a, b in pairs}
    bandwidth = {}
    for d, s in DTYPES[: len(models)]:
        decode = [(n - 1) / (medians["specjax_plain" + s, p] - medians["specjax_first_token" + s, p]) for p in P]
        b = bandwidth[d] = {"param_bytes": param_bytes[d]}
        for key, rates in (("whole_call", [tps["specjax_plain" + s, p] for p in P]), ("decode_only", decode)):
            rate = statistics.median(rates)  # over prompts
            b[key] = {"tokens_per_second": rate, "weight_bytes_per_second": param_bytes[d] * rate}
            b[key]["fraction_of_memcpy"] = param_bytes[d] * rate / memcpy["bytes_per_second"]
    comparisons = [("specjax_plain", "hf_plain"), ("specjax_plain", "hf_lookup"), ("hf_plain", "hf_lookup")]
    comparisons += [("specjax_plain_bf16", "hf_plain_bf16"), ("specjax_plain", "specjax_plain_bf16")] * args.bf16
    comparisons += [("hf_plain", "hf_plain_bf16")] * args.bf16
    agreement = {f"{a} vs {b}": [leading_agreement(outputs[a, p], outputs[b, p]) for p in P] for a, b in comparisons}
    env = dict(python=platform.python_version(), jax=jax.__version__, jax_backend=jax.default_backend())
    env |= dict(torch=torch.__version__, transformers=transformers.__version__, torch_threads=torch.get_num_threads())
    env |= dict(cpu_model=cpu_model(), cpu_count=os.cpu_count(), cpus_usable=len(os.sched_getaffinity(0)))
    env |= dict(load_average_start=load_start, load_average_end=os.getloadavg(), git_commit=_git_commit())

    cpus = f"{env['cpu_count']} CPUs ({env['cpus_usable']} usable)"
    print(f"{env['cpu_model']}, {cpus}, torch {env['torch_threads']} threads")
    print(f"jax {env['jax']}, torch {env['torch']}, transformers {env['transformers']}, commit {env['git_commit']}")
    print(f"load average (1 min) at start {load_start[0]:.2f}, at end {env['load_average_end'][0]:.2f}")
    print(f"{NAME}, greedy, batch 1, N={n} new tokens, K={K}, {args.repeats} repeats; tokens/s (prompt tokens):")
    print(f"{'method':<20}" + "".join(f"{f'{c[:9]} ({len(ids)})':>17}" for c, _, ids in prompts))
    for name in generating:
        cells = []
        for p in P:
            note = f" L={stats[name, p].mean_acceptance_length:.2f}" if name == "specjax_lookup" else ""
            note = f" f={hf_forwards[name, p]}" if name == "hf_lookup" else note
            cells.append(f"{tps[name, p]:.1f}{note}")
        print(f"{name:<20}" + "".join(f"{c:>17}" for c in cells))
    print("L: specjax mean acceptance length; f: HF target forwards (prefill included)")
    for label, value in ratios.items():
        print(f"{label:<40}{value:6.2f}x  (median over prompts of per-prompt tokens/s ratios)")
    print(f"memcpy {memcpy['bytes_per_second'] / 2**30:.2f} GiB/s (1 GiB np.copyto, best of 5, read + write = 2 GiB)")
    for d, b in bandwidth.items():
        for key in ("whole_call", "decode_only"):
            tok, rate, share = (
                b[key][k] for k in ("tokens_per_second", "weight_bytes_per_second", "fraction_of_memcpy")
            )
            head = f"specjax plain {d} {key:<11} {b['param_bytes'] / 2**20:.1f} MiB x {tok:6.1f} tokens/s"
            print(f"{head} = {rate / 2**30:5.2f} GiB/s, {share:.1%} of memcpy")
    for label, values in agreement.items():
        print(f"agreement {label:<40}" + " ".join(f"{v:3d}/{n}" for v in values))

    result = {
        "model": NAME,
        "gguf_file": path.name,
        "environment": env,
        "settings": dict(max_new_tokens=n, num_speculative_tokens=K, repeats=args.repeats, bf16=args.bf16),
        "torch_threads_flag": args.torch_threads,
        "specjax_prompt_lookup": {"max_ngram": 3, "min_ngram": 1, "prefer": "latest (PromptLookup's default)"},
        "hf_generate_kwargs": hf_kwargs,
        "hf_prompt_lookup_kwargs": hf_lookup,
        "prompts": [{"category": c, "prompt": t, "prompt_tokens": len(ids)} for c, t, ids in prompts],
        "raw_seconds": {name: [times[name, p] for p in P] for name in methods},
        "tokens_per_second": {name: [tps[name, p] for p in P] for name in generating},
        "ratios_tokens_per_second_median_over_prompts": ratios,
        "memcpy": memcpy,
        "weight_bandwidth": bandwidth,
        "weight_bandwidth_note": "param bytes x tokens/s, median over prompts; whole_call includes prefill, "
        "decode_only = (N-1)/(t(plain) - t(first token)); KV-cache reads not counted; memcpy counts read + write",
        "specjax_lookup_stats": [stats["specjax_lookup", p].to_dict() for p in P],
        "hf_lookup_target_forwards_including_prefill": [hf_forwards["hf_lookup", p] for p in P],
        "greedy_agreement_leading_tokens": {"of": n, **agreement},
        "outputs": {name: [outputs[name, p] for p in P] for name in generating},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
