"""specjax vs Hugging Face transformers (PyTorch) on the same weights, in one process.

Two comparisons, greedy, batch 1, fp32, the same prompt ids and exactly N new tokens:
  (a) plain decoding: specjax.generate vs model.generate;
  (b) speculative decoding: specjax.speculative_generate (K draft tokens a round) vs HF
      assisted generation (model.generate(assistant_model=draft)) with three assistant
      settings: a constant K with no confidence stop (the like-for-like row), the
      heuristic schedule starting at K (+2 after a fully accepted round, -1 otherwise),
      and the assistant's untouched defaults (in transformers 5.x: 20 tokens, constant,
      drafting stops early below confidence 0.4).
Every method is warmed up first (JAX compiles, torch pays its first-call costs), then each
of --repeats rounds runs every method once, in an order rotated per round, so drift on a
shared machine hits all methods alike; medians are compared. Greedy outputs are checked
against specjax plain decoding (fp32 numerics can differ across frameworks: reported, not
asserted). The default pair is the embedded one; --target/--draft take any local HF pair.

    python scripts/compare_transformers.py --out results/transformers_comparison/transformers_comparison.json

For SmolLM2 from its GGUF file, transformers beside specjax (three weight formats) and
llama.cpp in one round-robin, see scripts/peers/compare.py (results/peers/README.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local directories only: nothing may download

import jax
import torch
import transformers
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from _timing import leading_agreement

import specjax
from specjax.engine.clock import cpu_model
from specjax.io.embedded import embedded_path
from specjax.io.presets import resolve_model
from specjax.training.data import held_out_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="stdlib-target", help="embedded name or local HF directory")
    parser.add_argument("--draft", default="stdlib-draft", help="embedded name or local HF directory")
    parser.add_argument("--prompt", default=None, help="text prompt; default: held-out code prompt --prompt-index")
    # Prompt 0 of the test split is a generated sysconfig table ('HAVE_X': 0, ...), unusually
    # repetitive; prompt 1 (asyncio source) is ordinary code.
    parser.add_argument("--prompt-index", type=int, default=1, help="which held_out_prompts('code', ...) prompt")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per round (num_speculative_tokens)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--out", type=Path, default=Path("results/transformers_comparison/transformers_comparison.json")
    )
    args = parser.parse_args()
    n, k = args.max_new_tokens, args.k
    transformers.utils.logging.disable_progress_bar()

    target, draft = resolve_model(args.target), resolve_model(args.draft)
    hf_dirs = [embedded_path(name) or Path(name) for name in (args.target, args.draft)]
    # `dtype` is the transformers 5.x name; `torch_dtype` still works but logs a deprecation.
    hf_target, hf_draft = (AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval() for d in hf_dirs)

    # Tokenise once, with specjax's tokenizer (it prepends <bos>), and feed the same ids to both.
    prompt = args.prompt if args.prompt is not None else held_out_prompts("code", args.prompt_index + 1)[-1]
    ids = target.tokenizer.encode(prompt)
    input_ids = torch.tensor([ids])
    attention_mask = torch.ones_like(input_ids)

    # Exactly N tokens everywhere: specjax with no EOS, HF with eos_token_id=None (so EOS is
    # neither a stop nor suppressed, as in specjax) and min_new_tokens=N as a second guard.
    hf_kwargs = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None)

    # HF reads assisted-generation settings from the assistant's generation_config, so each
    # assisted row gets its own copy, swapped in before the call. A confidence threshold of
    # 0 disables the stop that would otherwise end a draft early (transformers >= 4.45).
    base_config = copy.deepcopy(hf_draft.generation_config)
    fixed_k = {"num_assistant_tokens": k, "assistant_confidence_threshold": 0.0}
    assistant_configs = {
        "hf_assisted_constant": fixed_k | {"num_assistant_tokens_schedule": "constant"},
        # "heuristic" writes its adapted K back into the config after every call, so
        # repeats would not start alike; "heuristic_transient" is the same rule, reset per call.
        "hf_assisted_heuristic": fixed_k | {"num_assistant_tokens_schedule": "heuristic_transient"},
        "hf_assisted_default": {},  # the draft's config untouched: HF's own defaults apply
    }
    # Unset fields are filled from these defaults inside generate; record what actually ran.
    defaults = base_config._get_default_generation_params()
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    resolved_assistant = {}
    for name, overrides in assistant_configs.items():
        config = assistant_configs[name] = copy.deepcopy(base_config)
        config.update(**overrides)
        explicit = {key: getattr(config, key) for key in keys}
        resolved_assistant[name] = {key: defaults[key] if v is None else v for key, v in explicit.items()}

    # Every method returns (new token ids, stats). specjax device_gets its results, and torch
    # on CPU is synchronous, so a call's wall time is completed work in both frameworks.
    def specjax_plain():
        out = specjax.generate(target, [ids], specjax.GenerationConfig(max_new_tokens=n, ignore_eos=True))
        return out.tokens[0], out.stats

    def specjax_speculative():
        out = specjax.generate(
            target,
            [ids],
            specjax.GenerationConfig(max_new_tokens=n, ignore_eos=True),
            draft=draft,
            speculative=specjax.SpeculativeConfig(num_speculative_tokens=k),
        )
        return out.tokens[0], out.stats

    def hf(assistant: str | None = None):
        def run():
            extra = {}
            if assistant is not None:
                hf_draft.generation_config = assistant_configs[assistant]
                extra["assistant_model"] = hf_draft
            with torch.inference_mode():
                seq = hf_target.generate(input_ids, attention_mask=attention_mask, **hf_kwargs, **extra)
            return seq[0, len(ids) :].tolist(), None

        return run

    methods = {
        "specjax_plain": specjax_plain,
        "hf_generate": hf(),
        "specjax_speculative": specjax_speculative,
        **{name: hf(name) for name in assistant_configs},
    }

    # Warm-up, untimed; its outputs are the ones checked. A pre-hook counts target forward
    # passes (prefill included) to see how many tokens each HF verify pass committed.
    outputs, stats, forwards, calls = {}, {}, {}, [0]

    def count_call(*_):
        calls[0] += 1

    for name, fn in methods.items():
        calls[0] = 0
        hook = hf_target.register_forward_pre_hook(count_call)
        outputs[name], stats[name] = fn()
        hook.remove()
        forwards[name] = calls[0] if name.startswith("hf") else 1 + stats[name].target_forwards
        assert len(outputs[name]) == n, f"{name} produced {len(outputs[name])} tokens, not {n}"

    times = {name: [] for name in methods}
    names = list(methods)
    for r in range(args.repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            methods[name]()
            times[name].append(time.perf_counter() - start)

    medians = {name: statistics.median(t) for name, t in times.items()}
    tps = {name: n / s for name, s in medians.items()}
    agreement = {name: leading_agreement(outputs["specjax_plain"], out) for name, out in outputs.items()}
    # The headline ratios first: each specjax method over its HF counterpart(s).
    pairs = [("specjax_plain", "hf_generate")]
    pairs += [("specjax_speculative", other) for other in [*assistant_configs, "hf_generate", "specjax_plain"]]
    pairs += [("hf_assisted_constant", "hf_generate")]
    ratios = {f"{a} / {b}": tps[a] / tps[b] for a, b in pairs}
    env = {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "specjax": getattr(specjax, "__version__", None),
        "jax_backend": jax.default_backend(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }

    print(f"{env['cpu_model']}, {env['cpu_count']} CPUs, torch threads {env['torch_threads']}")
    print(f"jax {env['jax']} ({env['jax_backend']}), torch {env['torch']}, transformers {env['transformers']}")
    print(f"prompt {len(ids)} tokens {prompt[:40]!r}..., N={n} new tokens, K={k}, {args.repeats} repeats")
    print(f"{'method':<23}{'median s':>9}{'tokens/s':>10}{'fwd':>5}{'agree':>7}  notes")
    for name in methods:
        note = ""
        if name == "specjax_speculative":
            note = f"mean acceptance length {stats[name].mean_acceptance_length:.2f}"
        elif name in resolved_assistant:
            setting = resolved_assistant[name]
            note = ", ".join(f"{key.replace('num_assistant_tokens', 'K')}={v}" for key, v in setting.items())
        print(f"{name:<23}{medians[name]:9.3f}{tps[name]:10.1f}{forwards[name]:5d}{agreement[name]:4d}/{n}  {note}")
    print("fwd: target forward passes, prefill included; agree: leading tokens equal to specjax_plain's")
    for label, value in ratios.items():
        print(f"{label:<45}{value:6.2f}x")
    if agreement["hf_generate"] < min(16, n):
        print(f"WARNING: HF and specjax greedy outputs diverge at token {agreement['hf_generate']} (< 16)")

    result = {
        "target": args.target,
        "draft": args.draft,
        "environment": env,
        "prompt": prompt,
        "prompt_tokens": len(ids),
        "max_new_tokens": n,
        "num_speculative_tokens": k,
        "repeats": args.repeats,
        "raw_seconds": times,
        "median_seconds": medians,
        "tokens_per_second": tps,
        "ratios_tokens_per_second": ratios,
        "target_forwards_including_prefill": forwards,
        "greedy_agreement_with_specjax_plain": {"leading_tokens": agreement, "of": n},
        "specjax_speculative_stats": stats["specjax_speculative"].to_dict(),
        "hf_assistant_settings": resolved_assistant,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
