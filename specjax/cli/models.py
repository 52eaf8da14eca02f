"""`specjax save-model`: a model by name or path (a GGUF file, a packaged model, an embedded
one) written as a Hugging Face directory (config.json, model.safetensors, tokenizer), so it
can be compared with, or served by, other tools."""

from __future__ import annotations

from specjax.cli.generate import HelpFormatter


def add_save_model(subparsers):
    p = subparsers.add_parser(
        "save-model",
        aliases=["save_model"],
        help="write a model (GGUF file, packaged or embedded model) as a Hugging Face directory",
        description="Load a model as --target takes it (a GGUF file, smollm2-135m-instruct, an embedded or "
        "random model, an HF directory) and write it as a Hugging Face directory: config.json, "
        "model.safetensors (dequantized weights in --dtype) and the tokenizer with its chat template. "
        "transformers' AutoModelForCausalLM and AutoTokenizer load the result.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("model", help="model name or path (e.g. smollm2-135m-instruct, path/model.gguf)")
    p.add_argument("--out", required=True, help="directory to write (created; must be empty if it exists)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weight dtype")
    p.set_defaults(func=_save_model)
    return p


def _save_model(args) -> int:
    from pathlib import Path

    from specjax.io.hf import save_model
    from specjax.io.presets import load_model

    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {out} exists and is not empty; choose a new directory")
    model = load_model(args.model, dtype=args.dtype)
    save_model(model, out)
    print(f"wrote {args.model} ({model.num_parameters:,} parameters, {args.dtype}) to {out}")
    return 0
