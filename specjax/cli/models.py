"""`specjax save-model`: a model by name or path (a GGUF file, a packaged model, an embedded
one) written as a Hugging Face directory (config.json, model.safetensors, tokenizer), so it
can be compared with, or served by, other tools. `specjax save-head`: a draft head written
in a layout others publish (drafters/formats/writers.py), for vLLM and SGLang."""

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


def add_save_head(subparsers):
    from specjax.drafters.formats.writers import FORMATS
    from specjax.io.embedded import default_pair, embedded_heads

    heads = ", ".join(embedded_heads()) or "none installed"
    p = subparsers.add_parser(
        "save-head",
        aliases=["save_head"],
        help="write a draft head in a published layout (EAGLE-1/2, EAGLE-3, speculators, Medusa, DFlash) for engines",
        description="Load a draft head as --drafter takes it (an embedded head, a directory written by train-head "
        "or save_drafter, or a published head) against its target, and write it in --format: eagle (EAGLE-1/2: "
        "config.json + model.safetensors), eagle3 (EAGLE-3, midlayer.*, d2t/t2d), speculators (vLLM's "
        "speculators config.json; a block head as speculators' dflash), medusa (medusa_lm_head.safetensors), dflash "
        "(a block head with Qwen3 layers in z-lab's DFlash layout: dflash_config, fc, hidden_norm) or specjax "
        "(drafter.json). A head whose "
        "network is not the published one (specjax's own EAGLE head, its multi-layer head with a reduce matrix) "
        "is refused with what differs. See docs/heads.md and docs/head_formats_block.md.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("head", help=f"the head: an embedded one ({heads}) or a directory")
    p.add_argument("--target", default=default_pair()[0], help="the target model the head drafts for (as --target)")
    p.add_argument("--format", required=True, choices=FORMATS, help="the layout to write")
    p.add_argument("--out", required=True, help="directory to write (created; must be empty if it exists)")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="store the weights in this precision (bfloat16 halves the files; loading casts them to the "
        "target's dtype); default: as they are",
    )
    p.set_defaults(func=_save_head)
    return p


def _save_head(args) -> int:
    import dataclasses
    from pathlib import Path

    from specjax.drafters.formats.native import cast_floating, load_head, save_drafter
    from specjax.io.presets import load_model

    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {out} exists and is not empty; choose a new directory")
    target = load_model(args.target)
    head = load_head(args.head, target)
    if args.dtype:
        head = dataclasses.replace(head, params=cast_floating(head.params, args.dtype))
    save_drafter(head, out, target_name=args.target, target=target, format=args.format)
    print(f"wrote {args.head} ({head.name} head for {args.target}) as {args.format} to {out}")
    return 0
