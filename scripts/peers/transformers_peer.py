"""transformers' methods on the same GGUF file: plain `generate`, prompt lookup, assisted.

The target loads with `from_pretrained(dir, gguf_file=...)`, which dequantises the file to
float32 with the gguf package, as specjax does: the two compute on the same float32 numbers.
The assistant is specjax's distilled draft exported whole (scripts/peers/weights.py
hf_draft_dir: its directory borrows the target's embedding, which transformers cannot read).
Settings are the like-for-like ones of scripts/compare_transformers.py: exactly n tokens
(eos_token_id=None, min_new_tokens=n), greedy, a constant K with no confidence stop.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path

from method import Call, Method, timed

KINDS = ("plain", "lookup n=1-3", "distilled draft")


def methods(
    gguf: Path, draft_dir: Path, k: int, threads: int, kinds: list[str], on_error: Callable[[str, BaseException], None]
) -> list[Method]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only
    os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF dequantisation bar
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(threads)
    target = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    # Parameters once each (a tied embedding / LM head counts once): all a decode step reads.
    per_step = sum(p.numel() * p.element_size() for p in target.parameters())
    calls = [0]
    target.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))

    settings: dict[str, dict] = {}
    assistant = None
    for kind in kinds:
        try:
            if kind == "plain":
                settings[kind] = {}
            elif kind == "lookup n=1-3":
                settings[kind] = {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": 3}
            elif kind == "distilled draft":
                assistant = AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32).eval()
                config = copy.deepcopy(assistant.generation_config)
                config.update(
                    num_assistant_tokens=k, num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0
                )
                assistant.generation_config = config
                settings[kind] = {"assistant_model": assistant}
            else:
                raise ValueError(f"unknown transformers method {kind!r} (known: {', '.join(KINDS)})")
        except Exception as error:  # reported with its message, never dropped
            on_error(f"transformers {kind}", error)

    out = []
    for kind, extra in settings.items():

        def run(ids: list[int], n: int, extra=extra) -> Call:
            input_ids = torch.tensor([ids])
            kwargs = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None)

            def call():
                with torch.inference_mode():
                    seq = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs, **extra)
                return seq[0, len(ids) :].tolist()

            calls[0] = 0
            tokens, seconds = timed(call)
            return Call(tokens, seconds, forwards=calls[0])

        out.append(
            Method(
                peer="transformers",
                name=f"transformers {kind}",
                kind=kind,
                weights="GGUF Q4_1 dequantised, stored float32",
                computes_in="float32",
                twin="float32",
                run=run,
                bytes_per_step=per_step,
                notes="" if kind == "plain" else f"K = {k} constant",
            )
        )
    return out
