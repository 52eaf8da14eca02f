"""Quality of a target/draft pair: held-out bits/byte and speculative acceptance per domain.

    python scripts/quality_report.py --target stdlib-target --draft stdlib-draft --out results/quality/quality.json

Bits/byte are measured on the validation split (windows of 256 bytes); acceptance on
prompts cut from the test split (64-byte prompts, 64 new tokens, K=4, greedy and T=1),
so nothing here was seen in training.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax

import specjax
from specjax.io.presets import resolve_model
from specjax.training.data import held_out_prompts
from specjax.training.train import evaluate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="stdlib-target")
    parser.add_argument("--draft", default="stdlib-draft")
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=32, help="held-out prompts per domain")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("results/quality/quality.json"))
    args = parser.parse_args()

    target, draft = resolve_model(args.target), resolve_model(args.draft)
    result = {
        "target": args.target,
        "draft": args.draft,
        "parameters": {"target": target.num_parameters, "draft": draft.num_parameters},
        "validation_bits_per_byte": {"target": evaluate(target), "draft": evaluate(draft)},
        "acceptance": {},
        "settings": {"k": args.num_speculative_tokens, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens},
        "jax": jax.__version__,
    }
    for domain in ("code", "prose"):
        prompts = held_out_prompts(domain, args.prompts)
        for temperature in (0.0, 1.0):
            out = specjax.generate(
                target,
                prompts,
                specjax.GenerationConfig.at_temperature(temperature, max_new_tokens=args.max_new_tokens, seed=0),
                draft=draft,
                speculative=specjax.SpeculativeConfig(num_speculative_tokens=args.num_speculative_tokens),
            )
            s = out.stats
            result["acceptance"][f"{domain}_T{temperature:g}"] = {
                "mean_acceptance_length": s.mean_acceptance_length,
                "acceptance_rate": s.acceptance_rate,
                "accepted_per_position": s.accepted_per_position,
                "sample": prompts[0] + out.text[0],
            }

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    bpb = result["validation_bits_per_byte"]
    print("| model | parameters | val bits/byte code | val bits/byte prose |")
    print("|---|---|---|---|")
    for name in ("target", "draft"):
        print(f"| {name} | {result['parameters'][name]:,} | {bpb[name]['code']:.3f} | {bpb[name]['prose']:.3f} |")
    print()
    print(f"| domain | temperature | mean acceptance length (K={args.num_speculative_tokens}) | acceptance rate |")
    print("|---|---|---|---|")
    for key, row in result["acceptance"].items():
        domain, temperature = key.split("_T")
        print(f"| {domain} | {temperature} | {row['mean_acceptance_length']:.2f} | {row['acceptance_rate']:.3f} |")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
