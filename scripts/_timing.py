"""Helpers shared by the measuring scripts (round_profile.py, weight_formats.py, the parity scripts).

Timing itself is specjax's (specjax/engine/clock.py: every call ends in block_until_ready,
warm-up calls compile, configurations run round-robin so a noisy neighbour slows all alike);
this file adds what those two scripts report beside it: quartiles, the machine, the prompts,
a model in a weight format, and a forward of a given width timed with its cache donated.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHAT_PROMPTS = ROOT / "configs" / "prompts" / "stdlib_chat"
FORMATS = ("float32", "bfloat16", "int8")
# /proc/cpuinfo flags that decide which matrix kernels XLA:CPU can use (issue 40).
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def log(message: str) -> None:
    """Progress goes to stderr, so stdout holds only the results a caller may parse."""
    print(message, file=sys.stderr, flush=True)


def summary(seconds: list[float], scale: float = 1e3) -> dict:
    """Median and interquartile range of repeated timings, in ms (scale 1e3) by default."""
    values = sorted(s * scale for s in seconds)
    if len(values) >= 2:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    else:
        q1 = q3 = values[0]
    return {"median": statistics.median(values), "q1": q1, "q3": q3, "iqr": q3 - q1, "n": len(values)}


def leading_agreement(a: list[int], b: list[int]) -> int:
    """How many leading tokens two sequences share (greedy agreement between two runs)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def cpu_flags() -> dict[str, bool]:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return {flag: flag in flags for flag in CPU_FLAGS}


def machine() -> dict:
    """Where the numbers came from, and the exact command that produced them."""
    from specjax.bench.timing import environment, load_average

    return {
        **environment(),
        "cpu_flags": cpu_flags(),
        "os_cpu_count": os.cpu_count(),
        "load_average": load_average(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "max_map_count": _max_map_count(),  # how many compiled programs a process can keep alive
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
    }


def _max_map_count() -> int | None:
    from specjax.runtime import memory_mappings

    mappings = memory_mappings()
    return None if mappings is None else mappings[1]


def load_target(name: str, weights: str = "float32", seed: int = 0):
    """The target in a weight format (specjax.load_model(..., weights=...))."""
    from specjax.io.presets import load_model

    if weights not in FORMATS:
        raise ValueError(f"--weights must be one of {', '.join(FORMATS)}, got {weights!r}")
    return load_model(name, seed=seed, weights=weights)


def weight_bytes(model) -> dict:
    """Bytes of parameters a decode step reads: every array, except that an untied input
    embedding is read one row per token (a gather), not whole."""
    import jax

    flat = jax.tree_util.tree_flatten_with_path(model.params)[0]
    total = sum(int(leaf.nbytes) for _, leaf in flat)
    embed = sum(int(leaf.nbytes) for path, leaf in flat if "embed" in jax.tree_util.keystr(path))
    tied = model.config.tie_word_embeddings
    return {"total": total, "embedding": embed, "per_step": total if tied else total - embed}


def chat_prompts(tokenizer, count: int, skip: int = 0) -> list[list[int]]:
    """`count` prompts from configs/prompts/stdlib_chat/*.jsonl, taken round-robin over the
    categories (after skipping `skip` per category), encoded as `specjax generate --chat`
    does: with the tokenizer's chat template when it has one (raw text otherwise: the
    byte-level presets have none)."""
    from specjax.bench.prompt_sets import encode, read_prompt_file

    files = sorted(CHAT_PROMPTS.glob("*.jsonl"))
    if not files:
        raise ValueError(f"no chat prompts under {CHAT_PROMPTS}")
    per_file = [read_prompt_file(str(f))[skip:] for f in files]
    chat = getattr(tokenizer, "chat_template", None) is not None
    picked = []
    for i in range(max(len(p) for p in per_file)):
        picked += [prompts[i][1] for prompts in per_file if i < len(prompts)]
    if len(picked) < count:
        raise ValueError(f"asked for {count} chat prompts, {CHAT_PROMPTS} holds {len(picked)} after skipping {skip}")
    return [encode(tokenizer, text, chat) for text in picked[:count]]


def held_out_prompts(tokenizer, domain: str, count: int) -> list[list[int]]:
    """`count` prompts of `domain`: "chat" (chat_prompts), or the stdlib corpus's held-out
    "code" / "prose" prompts of 96 bytes (as E3)."""
    if domain == "chat":
        return chat_prompts(tokenizer, count)
    from specjax.bench.prompt_sets import Prompts, load_prompts

    return load_prompts([Prompts(domain=domain, count=count, prompt_bytes=96)], tokenizer).tokens


def describe_prompts(domain: str) -> str:
    """held_out_prompts' `domain` in words, for a README."""
    if domain == "chat":
        return "chat prompts (configs/prompts/stdlib_chat, with the chat template)"
    return f"held-out {domain} prompts of 96 bytes"


def context_tokens(tokenizer, context: int) -> list[int]:
    """A prompt of exactly `context` tokens: chat prompts concatenated, cut to length."""
    tokens: list[int] = []
    for prompt in chat_prompts(tokenizer, 10):
        tokens += prompt
    if len(tokens) < context:
        tokens = (tokens * (context // max(len(tokens), 1) + 1))[:context]
    return tokens[:context]


def chain_forward(config, params, tokens, start, cache):
    """The target's forward of tokens [B, T] at positions start .. start + T - 1, a chain
    continuing the cache (as plain decoding and a chain's verify run it) -> (logits [B, T, V],
    cache). Not jitted: callers jit it, some inside a context that changes how it lowers."""
    import jax.numpy as jnp
    from specjax.models import forward

    positions = start + jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    return forward(config, params, tokens, positions, cache)


def forward_call(model, width: int, context: int, cache_length: int, features=False):
    """A zero-argument callable running one jitted target forward of `width` tokens at
    positions context - 1 .. context + width - 2 (a verify at L = context), its KV cache
    donated and kept between calls, as the loop keeps it. `features=True` returns the
    final-norm states instead of the logits, so XLA drops the LM head: the forward without it.
    """
    import functools

    import jax
    import jax.numpy as jnp
    from specjax.models import forward, init_cache

    config = model.config

    @functools.partial(jax.jit, donate_argnums=1)
    def run(params, cache, tokens, positions):
        out = forward(config, params, tokens, positions, cache, features=features)
        return out[1], (out[2] if features else out[0])

    holder = {"cache": init_cache(config, 1, cache_length)}
    tokens = jnp.ones((1, width), jnp.int32)
    positions = (context - 1 + jnp.arange(width, dtype=jnp.int32))[None]  # [1, W]

    def call():
        holder["cache"], result = run(model.params, holder["cache"], tokens, positions)
        return result

    return call


def _product(fmt: str, padded: bool = True):
    """einsum(spec, x, w, scale) as the model runs it in format `fmt` (models/quant.py
    `project`: few rows padded to the format's MIN_ROWS); padded=False: the bare kernel."""
    from specjax.models import quant

    if padded or fmt == "float32":
        return lambda x, w, scale, spec: quant.project(x, w, scale, spec, fmt)
    return lambda x, w, scale, spec: quant._product(x, w, scale, spec, fmt)


def dot_call(fmt: str, rows: int, d_in: int, d_out: int, padded: bool = True):
    """A zero-argument callable: random [1, rows, d_in] activations times a [d_in, d_out]
    matrix stored in weight format `fmt`, through the format's product (`_product`):
    float32 einsum; bfloat16 with float32 accumulation; int8 weights per output channel and
    int8 activations per token, int32 accumulation."""
    import functools

    import jax
    import jax.numpy as jnp

    spec = "btd,dv->btv"
    keys = jax.random.split(jax.random.key(rows * 7919 + d_out), 2)
    x = jax.random.normal(keys[0], (1, rows, d_in), jnp.float32)
    w = jax.random.normal(keys[1], (d_in, d_out), jnp.float32) * 0.02
    scale = None
    if fmt == "int8":
        from specjax.models.quant import quantize

        w, scale = quantize(w, (0,))
    elif fmt == "bfloat16":
        w = w.astype(jnp.bfloat16)
    product = _product(fmt, padded)
    run = jax.jit(lambda x, w, scale: product(x, w, scale, spec).astype(jnp.float32))
    return functools.partial(run, x, w, scale)


def lm_head_call(model, rows: int):
    """A zero-argument callable: the model's own LM head (its stored matrix, in its format)
    over random final-norm states [1, rows, D]: the last product of a forward, alone."""
    import functools

    import jax
    import jax.numpy as jnp

    name = "embed" if model.config.tie_word_embeddings else "lm_head"
    spec = "btd,vd->btv" if name == "embed" else "btd,dv->btv"
    fmt = getattr(model.config, "weights", "float32")
    w, scale = model.params[name], model.params.get(f"{name}_scale")
    x = jax.random.normal(jax.random.key(rows), (1, rows, model.config.hidden_size), jnp.float32)
    product = _product(fmt)
    run = jax.jit(
        lambda x, w, scale: product(x.astype(jnp.dtype(model.config.dtype)), w, scale, spec).astype(jnp.float32)
    )
    return functools.partial(run, x, w, scale)


def bandwidth(megabytes: int, repeats: int) -> dict:
    """GB/s of a donated x * c over `megabytes` (read + write: memcpy's traffic) and of a sum (read only)."""
    import jax
    import jax.numpy as jnp

    from specjax.engine.clock import timed

    scale = jax.jit(lambda x: x * 1.0001, donate_argnums=0)
    total = jax.jit(jnp.sum)
    holder = {"x": scale(jnp.ones((megabytes * 2**20 // 4,), jnp.float32))}
    nbytes = holder["x"].nbytes
    jax.block_until_ready(total(holder["x"]))
    copy, read = [], []
    for _ in range(repeats):
        copy.append(timed(lambda: holder.update(x=scale(holder["x"])) or holder["x"]))
        read.append(timed(lambda: total(holder["x"])))
    return {"bytes": nbytes, "copy_gbps": summary([2 * nbytes / t for t in copy], 1e-9),
            "read_gbps": summary([nbytes / t for t in read], 1e-9)}  # fmt: skip


def write_json(path: str | Path, result: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {path}")
    return path


def pyplot():
    """matplotlib.pyplot on a file backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plot written (pip install matplotlib)")
        return None
    return plt
