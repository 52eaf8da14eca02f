"""Store the embedded target and its heads in bfloat16 (they load as float32, cast on load).

The main wheel ships the embedded pair and its heads; in float32 the target alone deflates to
19 MB and the wheel to 34.7 MB. Stored in bfloat16 they take half; `load_model` and
`load_head` cast to the dtype the run computes in (float32 by default), so what runs is the
float32 model with bfloat16-rounded weights. The target's weights therefore change (by the
rounding); the heads still recognise it, since they fingerprint their target over values
rounded to bfloat16 (checked after converting). Run once, from the repository root:

    python scripts/embedded_bf16.py                 # convert, then re-stamp the heads
    python scripts/embedded_bf16.py --check         # only report what is stored how
    python scripts/embedded_bf16.py --measure F     # greedy outputs and acceptance, as JSON (before/after)

    python scripts/embedded_bf16.py --drafts        # the three draft models too (2026-12-06)

The draft models (stdlib-draft, -pretrained, -pard-draft) stayed float32 at first (what the
distillation results were measured with); they followed when a sixth head (DFlash 2) took the
wheel past 25 MB (`results/embedded_bf16/README.md`, "The draft models").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file, save_file

ROOT = Path(__file__).resolve().parent.parent / "models" / "pretrained"
TARGET = "stdlib-target"
HEADS = ("stdlib-medusa", "stdlib-eagle", "stdlib-eagle3", "stdlib-eagle3-published", "stdlib-block-head")
DRAFTS = ("stdlib-draft", "stdlib-draft-pretrained", "stdlib-pard-draft")


def to_bfloat16(path: Path) -> tuple[int, int]:
    """Rewrite a safetensors file with its float32 tensors in bfloat16; (bytes before, after)."""
    before = path.stat().st_size
    tensors = load_file(str(path))
    metadata = _metadata(path)
    out = {k: v.astype(ml_dtypes.bfloat16) if v.dtype == np.float32 else v for k, v in tensors.items()}
    save_file(out, str(path), metadata=metadata)
    return before, path.stat().st_size


def _metadata(path: Path) -> dict | None:
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    return header.get("__metadata__")


def check_fingerprints(heads: tuple[str, ...]) -> None:
    """Each head still recognises the target: heads fingerprint their target over its values
    rounded to bfloat16 (drafters/formats/native.py), so storing it in bfloat16 keeps them."""
    import specjax
    from specjax.drafters import target_fingerprint

    fingerprint = target_fingerprint(specjax.load_model(TARGET))
    for name in heads:
        recorded = json.loads((ROOT / name / "drafter.json").read_text())["target"]
        same = all(recorded[key] == fingerprint[key] for key in ("config_sha256", "weights_sha256"))
        print(f"{name}: {'recognises' if same else 'DOES NOT recognise'} {TARGET} as stored now")


def measure(out: Path) -> None:
    """Greedy continuations of held-out code prompts and each shipped drafter's mean acceptance
    length on them (K = 4, greedy), so a conversion's effect is measured, not assumed."""
    import specjax
    from specjax.training.data import held_out_prompts

    target = specjax.load_model(TARGET)
    prompts = held_out_prompts("code", 16, 48, split="validation")
    config = specjax.GenerationConfig(max_new_tokens=64, ignore_eos=True)
    result = {"plain_tokens": specjax.generate(target, prompts, config).tokens, "mean_acceptance_length": {}}
    for name in ("stdlib-draft", "stdlib-draft-pretrained", "stdlib-pard-draft", *HEADS):
        out_spec = specjax.generate(target, prompts, config, draft=specjax.load_drafter(name, target),
                                    speculative=specjax.SpeculativeConfig(num_speculative_tokens=4))  # fmt: skip
        assert out_spec.tokens == result["plain_tokens"], name  # greedy speculation stays exact
        result["mean_acceptance_length"][name] = round(out_spec.stats.mean_acceptance_length, 4)
        print(name, result["mean_acceptance_length"][name])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result) + "\n")


def report() -> None:
    for name in (TARGET, *HEADS, *DRAFTS):
        tensors = load_file(str(ROOT / name / "model.safetensors"))
        dtypes = sorted({str(v.dtype) for v in tensors.values()})
        print(f"{name}: {', '.join(dtypes)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report the stored dtypes")
    parser.add_argument("--measure", type=Path, default=None, help="only measure, into this JSON file")
    parser.add_argument("--drafts", action="store_true", help="convert the three draft models (nothing else)")
    args = parser.parse_args()
    if args.measure is not None:
        return measure(args.measure)
    if args.drafts:
        for name in DRAFTS:
            before, after = to_bfloat16(ROOT / name / "model.safetensors")
            print(f"{name}: {before / 1e6:.2f} MB -> {after / 1e6:.2f} MB")
        return report()
    if not args.check:
        for name in (TARGET, *HEADS):
            before, after = to_bfloat16(ROOT / name / "model.safetensors")
            print(f"{name}: {before / 1e6:.2f} MB -> {after / 1e6:.2f} MB")
        check_fingerprints(HEADS)
    report()


if __name__ == "__main__":
    main()
