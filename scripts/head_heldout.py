"""Held-out acceptance of saved or shipped heads (or drafts) on the eval prompts of a
train-head (or distill) config: the numbers a run's learning curve logs, for drafters that did
not come from that run (e.g. the shipped `smollm2-eagle3`, trained on other data, on the v2
run's held-out prompts), so two runs' curves can be read against one baseline (issue 41).

    python scripts/head_heldout.py --config configs/smollm2_eagle3_v2.yaml smollm2-eagle3 \
        --out results/smollm2_training_v2/baseline_heldout.json
    python scripts/head_heldout.py --config configs/smollm2_pard_v2.yaml smollm2-pard-draft \
        --out results/smollm2_training_v2/pard_heldout.json

A distill config (no `kind:` key) evaluates draft models as `specjax distill` does: greedy and
sampled, a PARD draft (parallel.enabled) at K = num_masks + 1.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import specjax
from specjax.configs import load_config, read_yaml
from specjax.engine.clock import cpu_model
from specjax.training.distill import DistillConfig, acceptance
from specjax.training.run_data import eval_prompts
from specjax.training.train_heads import HeadTrainConfig, head_acceptance


def evaluator(path: str, overrides: list[str]):
    """(config, name -> held-out metrics) for a train-head or a distill config."""
    if "kind" in read_yaml(path):
        config = load_config(HeadTrainConfig, path, overrides)
        return config, lambda target, name, prompts: head_acceptance(
            config, target, specjax.load_drafter(name, target), prompts
        )
    config = load_config(DistillConfig, path, overrides)
    return config, lambda target, name, prompts: acceptance(config, target, specjax.load_model(name), prompts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("heads", nargs="+", help="shipped head names or saved head directories")
    parser.add_argument("--config", required=True, help="the train-head config whose eval prompts and K to use")
    parser.add_argument("--set", action="append", default=[], help="config overrides, as train-head's --set")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config, evaluate = evaluator(args.config, args.set)
    target = specjax.load_model(config.target)
    prompts = eval_prompts(config.dataset, target.tokenizer, config.eval.prompts, config.eval.prompt_bytes)
    rows = {}
    for name in args.heads:
        rows[name] = evaluate(target, name, prompts)
        print(name, rows[name])
    result = {
        "config": args.config,
        "overrides": args.set,
        "eval": {
            "prompts": len(prompts),
            "max_new_tokens": config.eval.max_new_tokens,
            "num_speculative_tokens": config.eval.num_speculative_tokens,
        },
        "heads": rows,
        "cpu": cpu_model(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
