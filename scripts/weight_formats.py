"""Weight formats side by side: forward speed by width, quality against float32, exactness.

For each format of --weights (specjax.load_model(..., weights=FORMAT)), on one target:

  speed      a jitted target forward of width W (batch 1, KV cache of --context tokens,
             donated), W in --widths, every (format, width) interleaved round-robin in one
             process so the ratios are side by side; medians and IQR in ms.
  quality    on --prompts held-out chat prompts (configs/prompts/stdlib_chat, chat template
             applied as `specjax generate --chat` does): each format's greedy continuation of
             --new-tokens tokens (ignore_eos) against float32's, counted as the tokens
             before the first divergence (median and per prompt); and the mean next-token
             KL(float32 || format) at the positions of float32's continuation, with both
             models reading prompt + float32 continuation (teacher forced).
  exactness  greedy prompt-lookup speculation (K = --k) equals plain greedy in the same
             format, token for token, on those prompts (true/false per format).

Writes JSON (--out) and a PNG beside it (matplotlib if installed), and prints a
README-ready markdown table on stdout; progress goes to stderr.

    python scripts/weight_formats.py --weights float32 bfloat16 int8
    python scripts/weight_formats.py --target random-target --weights float32 --repeats 3 --prompts 2 --new-tokens 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import (
    FORMATS,
    chat_prompts,
    forward_call,
    load_target,
    log,
    machine,
    pyplot,
    summary,
    weight_bytes,
    write_json,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct", help="a model name or path (specjax.load_model)")
    parser.add_argument("--weights", nargs="+", default=list(FORMATS), choices=FORMATS, help="formats to compare")
    parser.add_argument("--widths", default="1,2,5,8", help="forward widths to time, comma-separated")
    parser.add_argument("--context", type=int, default=256, help="tokens in the cache before each timed forward")
    parser.add_argument("--repeats", type=int, default=15, help="timed repetitions of each (format, width)")
    parser.add_argument("--prompts", type=int, default=16, help="held-out chat prompts for quality and exactness")
    parser.add_argument("--new-tokens", type=int, default=64, help="greedy tokens per prompt")
    parser.add_argument("--batch-size", type=int, default=1, help="prompts per generate call")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per round of the exactness check")
    parser.add_argument("--kl-batch", type=int, default=4, help="prompts per teacher-forced forward of the KL")
    parser.add_argument("--out", default=None, help="JSON path (default results/weight_formats/<target>.json)")
    args = parser.parse_args(argv)
    args.widths = [int(w) for w in args.widths.split(",")]
    if "float32" not in args.weights:  # the reference of every quality number
        args.weights = ["float32", *args.weights]
    name = Path(args.target).name.removesuffix(".gguf")
    args.out = args.out or f"results/weight_formats/{name}.json"
    return args


def greedy(model, prompts: list[list[int]], new_tokens: int, batch_size: int, drafter=None, k: int = 4):
    """Greedy continuations of exactly `new_tokens` tokens (ignore_eos), `batch_size` prompts a call."""
    import specjax

    config = specjax.GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True)
    spec = specjax.SpeculativeConfig(num_speculative_tokens=k)
    kwargs = {} if drafter is None else {"draft": drafter, "speculative": spec}
    out = []
    for i in range(0, len(prompts), batch_size):
        out += specjax.generate(model, prompts[i : i + batch_size], config, **kwargs).tokens
    return out


def first_divergence(reference: list[int], tokens: list[int]) -> int:
    """Tokens equal to the reference before the first that differs (len(reference): none differs)."""
    return next((i for i, (a, b) in enumerate(zip(reference, tokens, strict=False)) if a != b), len(reference))


def next_token_kl(reference_model, model, prompts, continuations, batch: int) -> list[float]:
    """Per prompt: mean KL(reference || model) of the next-token distributions at the positions
    that predict the reference's continuation (prompt end .. one before the last token)."""
    import jax
    import numpy as np

    from specjax.io.model import logits

    rows = [p + c for p, c in zip(prompts, continuations, strict=True)]
    width = max(len(r) for r in rows)  # one padded length: one compile per format
    out = []
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        tokens = np.zeros((len(chunk), width), np.int32)  # right padding: a causal model never reads it
        for j, row in enumerate(chunk):
            tokens[j, : len(row)] = row
        log_p = np.asarray(jax.nn.log_softmax(logits(reference_model, tokens), axis=-1))
        log_q = np.asarray(jax.nn.log_softmax(logits(model, tokens), axis=-1))
        for j, prompt in enumerate(prompts[i : i + batch]):
            at = slice(len(prompt) - 1, len(chunk[j]) - 1)  # [N] positions predicting the continuation
            kl = np.sum(np.exp(log_p[j, at]) * (log_p[j, at] - log_q[j, at]), axis=-1)
            out.append(float(np.mean(kl)))
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    import specjax
    from specjax.engine.clock import interleaved

    models = {}
    for fmt in args.weights:
        log(f"loading {args.target} ({fmt})")
        models[fmt] = load_target(args.target, fmt)
    result = {"machine": machine(), "args": vars(args), "formats": {}}

    log(f"timing forwards: widths {args.widths}, formats {args.weights}")
    cache_length = args.context + max(args.widths)
    calls = {(fmt, w): forward_call(m, w, args.context, cache_length) for fmt, m in models.items() for w in args.widths}
    keyed = interleaved({f"{fmt}_w{w}": fn for (fmt, w), fn in calls.items()}, args.repeats, warmup=2)
    ms = {key: summary(t) for key, t in keyed.items()}
    for fmt, model in models.items():
        med = {w: ms[f"{fmt}_w{w}"]["median"] for w in args.widths}
        result["formats"][fmt] = {
            "weight_bytes": weight_bytes(model),
            "forward_ms": {w: ms[f"{fmt}_w{w}"] for w in args.widths},
            "over_width_1": {w: med[w] / med[args.widths[0]] for w in args.widths},
            "over_float32": {w: med[w] / ms[f"float32_w{w}"]["median"] for w in args.widths},
        }

    prompts = chat_prompts(models["float32"].tokenizer, args.prompts)
    log(f"quality and exactness on {len(prompts)} chat prompts, {args.new_tokens} new tokens")
    reference = greedy(models["float32"], prompts, args.new_tokens, args.batch_size)
    for fmt, model in models.items():
        plain = reference if fmt == "float32" else greedy(model, prompts, args.new_tokens, args.batch_size)
        lookup = specjax.load_drafter("prompt-lookup", model)
        spec = greedy(model, prompts, args.new_tokens, args.batch_size, drafter=lookup, k=args.k)
        agree = [first_divergence(r, t) for r, t in zip(reference, plain, strict=True)]
        kl = (
            [0.0] * len(prompts)
            if fmt == "float32"
            else next_token_kl(models["float32"], model, prompts, reference, args.kl_batch)
        )
        mismatched = [i for i, (a, b) in enumerate(zip(plain, spec, strict=True)) if a != b]
        result["formats"][fmt].update(
            tokens_to_divergence={"median": statistics.median(agree), "per_prompt": agree},
            kl_from_float32={"mean": statistics.fmean(kl), "per_prompt": kl},
            speculative_equals_plain=not mismatched,
            speculative_mismatched_prompts=mismatched,
        )
        log(f"  {fmt}: divergence {statistics.median(agree)}, KL {statistics.fmean(kl):.2e}, exact {not mismatched}")

    write_json(args.out, result)
    plot(result, args, Path(args.out).with_suffix(".png"))
    table = markdown(result, args)
    print(table)
    return result


def markdown(result: dict, args) -> str:
    """The README table: one row per format."""
    w = args.widths
    last = w[-2] if len(w) > 2 else w[-1]  # width 5 of the defaults: the verify width of K = 4
    head = ["weights", "MB/step", *[f"width {x} (ms)" for x in w], f"width {last} / width {w[0]}",
            f"tokens to divergence (median of {args.prompts}, of {args.new_tokens})", "next-token KL vs float32",
            f"lookup K={args.k} == plain"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for fmt, r in result["formats"].items():
        cells = [fmt, f"{r['weight_bytes']['per_step'] / 1e6:.1f}"]
        cells += [f"{r['forward_ms'][x]['median']:.2f}" for x in w]
        cells += [f"{r['over_width_1'][last]:.2f}", f"{r['tokens_to_divergence']['median']:g}"]
        cells += [f"{r['kl_from_float32']['mean']:.2e}", "yes" if r["speculative_equals_plain"] else "**no**"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(result: dict, args, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for fmt, r in result["formats"].items():
        f = r["forward_ms"]
        left.errorbar(args.widths, [f[w]["median"] for w in args.widths], marker="o", capsize=3, label=fmt,
                      yerr=[[f[w]["median"] - f[w]["q1"] for w in args.widths],
                            [f[w]["q3"] - f[w]["median"] for w in args.widths]])  # fmt: skip
        right.plot(r["tokens_to_divergence"]["per_prompt"], marker="o", linestyle="", label=fmt)
    left.set(xlabel="forward width", ylabel="ms (median, IQR)", title=f"{args.target}: forward by width")
    right.set(xlabel="prompt", ylabel="tokens before first divergence", title="greedy agreement with float32")
    left.legend()
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
