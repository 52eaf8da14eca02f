"""Per-component profile of one speculative round, and the roofline it is measured against.

What one chain round does (specjax/engine/rounds.py chain_round, core/state.py finish_round):
the drafter proposes K tokens, the target verifies them in one forward of width K + 1 (its
K/V are written in that forward: there is no separate cache commit beyond a length change),
the acceptance rule (core/acceptance.py) picks the accepted prefix, `commit` (core/loop.py)
scatters the tokens, and the drafter's `update` sees the verdict. Each piece is jitted and
timed apart, all interleaved round-robin in one process (medians and IQR, ms):

  forward_wW   target forward of width W with its KV cache (W = 1 is the plain step)
  body_wW      the same forward without the LM head (features returned, logits dropped)
  lm_head_wW   the LM head alone: [W, D] x [D, V] in the weight format's dot kernel
  acceptance   probabilities + greedy rule on [1, K+1, V] logits (per call, inside a loop)
  commit       core.loop.commit of K + 1 candidates (per call, inside a loop)
  dispatch     an empty jitted call: the host cost included in every per-call time above
  propose_X    drafter X's propose of K tokens (its state donated, as in the loop)
  round_X      the engine's whole jitted round (round_plain: one plain decode step)

Then whole `specjax.generate` calls (ignore_eos) give the host overhead: call time minus
init_state (prefill) minus rounds x round time. The roofline: memcpy bandwidth (a donated
x * c over --bandwidth-mb, read + write), GEMM/GEMV rates at the model's matrix shapes in the
format, the weights' bytes per step, and roofline step = bytes / bandwidth. Tokens per round
come from short greedy generates over chat prompts; the speedup bounds are in the README.

    python scripts/round_profile.py --drafter smollm2-eagle3 --drafter prompt-lookup
    python scripts/round_profile.py --target random-target --repeats 3 --new-tokens 16 --drafter prompt-lookup
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import (
    bandwidth,
    chat_prompts,
    context_tokens,
    dot_call,
    forward_call,
    lm_head_call,
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
    parser.add_argument("--weights", default="float32", choices=("float32", "bfloat16", "int8"), help="weight format")
    parser.add_argument("--drafter", action="append", default=[], help="a drafter name (repeatable): load_drafter")
    parser.add_argument("--widths", default="1,2,3,4,5,6,7,8", help="verify widths to time (1 and K + 1 always)")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per round (verify width K + 1)")
    parser.add_argument("--context", type=int, default=256, help="tokens in the cache before the round")
    parser.add_argument("--repeats", type=int, default=15, help="timed repetitions of each component")
    parser.add_argument("--inner", type=int, default=100, help="loop iterations per timed call of tiny parts")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens of each timed generate call")
    parser.add_argument("--call-repeats", type=int, default=5, help="timed repetitions of the generate calls")
    parser.add_argument("--bandwidth-mb", type=int, default=256, help="array size of the bandwidth test")
    parser.add_argument("--gemm-rows", default="1,2,5", help="activation rows of the GEMM/GEMV rates")
    parser.add_argument("--tpr-prompts", type=int, default=5, help="chat prompts for tokens per round")
    parser.add_argument("--tpr-tokens", type=int, default=64, help="new tokens per prompt for tokens per round")
    parser.add_argument("--out", default=None, help="JSON path (default results/round_profile/<target>_<weights>.json)")
    args = parser.parse_args(argv)
    args.widths = sorted({int(w) for w in args.widths.split(",")} | {1, args.k + 1})
    args.gemm_rows = [int(m) for m in args.gemm_rows.split(",")]
    name = Path(args.target).name.removesuffix(".gguf")
    args.out = args.out or f"results/round_profile/{name}_{args.weights}.json"
    return args


def matrix_shapes(config) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of each matrix a decode step multiplies by (one layer's, and the head)."""
    d, h, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    dh = config.head_dim or d // h
    return {"q_proj": (d, h * dh), "k_proj": (d, kv * dh), "v_proj": (d, kv * dh), "o_proj": (h * dh, d),
            "gate_proj": (d, config.intermediate_size), "up_proj": (d, config.intermediate_size),
            "down_proj": (config.intermediate_size, d), "lm_head": (d, config.vocab_size)}  # fmt: skip


def tiny_parts(config, k: int, context: int, inner: int) -> dict:
    """acceptance, commit and dispatch, each `inner` times in a fori_loop whose iterations
    depend on each other (so XLA cannot hoist the work out of the loop)."""
    import jax
    import jax.numpy as jnp

    from specjax.core.acceptance import greedy_rule
    from specjax.core.loop import commit
    from specjax.core.sampling import SamplingConfig, probabilities

    greedy = SamplingConfig()

    @functools.partial(jax.jit, donate_argnums=0)
    def accept(logits, drafts):  # [1, K+1, V], [1, K]
        def body(_, carry):
            logits, total = carry
            n, next_token = greedy_rule(None, drafts, probabilities(logits, greedy), None)
            return logits.at[0, 0, next_token[0]].add(1.0), total + n

        return jax.lax.fori_loop(0, inner, body, (logits, jnp.zeros((1,), jnp.int32)))

    @functools.partial(jax.jit, donate_argnums=0)
    def commit_loop(tokens, candidates):  # [1, S], [1, K+1]
        def body(_, carry):
            tokens, lengths = carry
            num_new = jnp.full((1,), k + 1, jnp.int32)
            eos = jnp.array([-1], jnp.int32)
            tokens, new_lengths, _ = commit(tokens, lengths, lengths, jnp.zeros((1,), bool), candidates, num_new,
                                            jnp.int32(1 << 20), eos)  # fmt: skip
            return tokens, new_lengths - num_new  # back to the same length: every call does the same work

        return jax.lax.fori_loop(0, inner, body, (tokens, jnp.full((1,), context, jnp.int32)))

    keys = jax.random.split(jax.random.key(3))
    holder = {
        "logits": jax.random.normal(keys[0], (1, k + 1, config.vocab_size), jnp.float32),
        "tokens": jnp.zeros((1, context + 2 * (k + 1)), jnp.int32),
    }
    drafts = jax.random.randint(keys[1], (1, k), 0, config.vocab_size, jnp.int32)
    candidates = jnp.concatenate([drafts, drafts[:, :1]], axis=1)
    empty = jax.jit(lambda x: x + 1)
    one = jnp.zeros((), jnp.int32)

    def run_accept():
        holder["logits"], n = accept(holder["logits"], drafts)
        return n

    def run_commit():
        holder["tokens"], lengths = commit_loop(holder["tokens"], candidates)
        return lengths

    return {"acceptance": run_accept, "commit": run_commit, "dispatch": lambda: empty(one)}


def drafter_calls(target, drafter, name: str, prompt: list[int], k: int, new_tokens: int) -> dict:
    """propose_<name> and round_<name> callables on a state prefilled with `prompt`."""
    import jax

    import specjax
    from specjax.engine.generation import jit_round
    from specjax.engine.rounds import draft_context

    config = specjax.GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True)
    spec = None if drafter is None else specjax.SpeculativeConfig(num_speculative_tokens=k)

    def state():
        return specjax.init_state(target, [prompt], config, draft=drafter, speculative=spec)

    weights = None if drafter is None else drafter.weights()
    rounds = {"state": state()}

    def run_round():
        rounds["state"] = jit_round(target.params, weights, rounds["state"])
        return rounds["state"]

    calls = {f"round_{name}": run_round}
    if drafter is not None:

        @functools.partial(jax.jit, donate_argnums=2)
        def propose(target_params, weights, draft_state, state, key):
            ctx = draft_context(state, target_params)
            proposal, draft_state = state.plan.drafter.propose(weights, draft_state, ctx, key)
            return draft_state, proposal.tokens

        held = state()
        proposing = {"draft": held.draft_state, "state": held.replace(draft_state=None)}

        def run_propose():
            proposing["draft"], tokens = propose(target.params, weights, proposing["draft"], proposing["state"],
                                                 jax.random.key(0))  # fmt: skip
            return tokens

        calls[f"propose_{name}"] = run_propose
    return calls


def host_overhead(target, drafters: dict, prompt: list[int], args, med: dict) -> dict:
    """Whole `specjax.generate` calls against the same work as one compiled program.

    launch(n) runs prefill and all rounds on the device without returning to the host;
    launch(1) is the prefill and one round, so prefill = launch(1) - round. The host overhead
    is the whole call minus the device parts: generate - (prefill + rounds x round)."""
    import specjax
    from specjax.engine.clock import interleaved

    config = specjax.GenerationConfig(max_new_tokens=args.new_tokens, ignore_eos=True)
    spec = specjax.SpeculativeConfig(num_speculative_tokens=args.k)
    calls, rounds = {}, {}
    for name, drafter in {"plain": None, **drafters}.items():
        kwargs = {} if drafter is None else {"draft": drafter, "speculative": spec}
        prepared = specjax.prepare(target, [prompt], config, **kwargs)
        rounds[name] = prepared.run().stats.rounds
        calls[f"generate_{name}"] = lambda kw=kwargs: specjax.generate(target, [prompt], config, **kw).tokens
        calls[f"run_{name}"] = lambda p=prepared: p.run().tokens
        calls[f"launch_{name}"] = lambda p=prepared: p.launch()
        calls[f"launch1_{name}"] = lambda p=prepared: p.launch(1)
    times = {key: summary(t) for key, t in interleaved(calls, args.call_repeats, warmup=1).items()}
    out = {}
    for name, n in rounds.items():
        t = {part: times[f"{part}_{name}"]["median"] for part in ("generate", "run", "launch", "launch1")}
        prefill = t["launch1"] - med[f"round_{name}"]
        overhead = t["generate"] - prefill - n * med[f"round_{name}"]
        out[name] = {"rounds": n, "ms": {part: times[f"{part}_{name}"] for part in t}, "prefill_ms": prefill,
                     "planning_ms": t["generate"] - t["run"], "chunking_ms": t["run"] - t["launch"],
                     "host_overhead_ms": overhead, "host_overhead_per_round_ms": overhead / n}  # fmt: skip
    return out


def tokens_per_round(target, drafter, prompts: list[list[int]], k: int, new_tokens: int) -> dict:
    """Greedy generates over chat prompts, one at a time, stopping at EOS as `specjax generate` does."""
    import specjax

    config = specjax.GenerationConfig(max_new_tokens=new_tokens)
    spec = specjax.SpeculativeConfig(num_speculative_tokens=k)
    rounds = accepted = generated = 0
    for prompt in prompts:
        stats = specjax.generate(target, [prompt], config, draft=drafter, speculative=spec).stats
        rounds, accepted, generated = (rounds + stats.rounds, accepted + stats.accepted_tokens,
                                       generated + stats.generated_tokens)  # fmt: skip
    return {"prompts": len(prompts), "rounds": rounds, "accepted_tokens": accepted, "generated_tokens": generated,
            "tokens_per_round": 1 + accepted / max(rounds, 1)}  # fmt: skip


def main(argv=None) -> dict:
    args = parse_args(argv)
    import specjax
    from specjax.engine.clock import interleaved

    log(f"loading {args.target} ({args.weights})")
    target = load_target(args.target, args.weights)
    drafters, failed = {}, {}
    for name in args.drafter:
        try:
            drafters[name] = specjax.load_drafter(name, target)
        except ValueError as error:  # e.g. a head that cannot read this weight format: say so, profile the rest
            log(f"  drafter {name}: {error}")
            failed[name] = {"error": str(error)}
    prompt = context_tokens(target.tokenizer, args.context)
    cache_length = args.context + max(args.widths) + 1
    result = {"machine": machine(), "args": {k: v for k, v in vars(args).items()}, "ms": {}}

    log("roofline: bandwidth and matrix rates")
    result["bandwidth"] = bandwidth(args.bandwidth_mb, args.repeats)
    shapes = matrix_shapes(target.config)
    # Each shape at each row count through the format's product as the model runs it; for
    # bfloat16/int8 also one row unpadded (the kernel the padding avoids, models/quant.py).
    plan = {f"{n}_m{m}": (n, m, True) for n in shapes for m in args.gemm_rows}
    if args.weights != "float32":
        plan.update({f"{n}_m1_unpadded": (n, 1, False) for n in shapes})
    gemm_times = interleaved({k: dot_call(args.weights, m, *shapes[n], padded=p) for k, (n, m, p) in plan.items()},
                             args.repeats, warmup=1)  # fmt: skip
    result["gemm"] = {}
    for key, (n, m, _) in plan.items():
        ms = summary(gemm_times[key])
        result["gemm"][key] = {
            "shape": [m, *shapes[n]],
            "ms": ms,
            "gflops": 2e-6 * m * math.prod(shapes[n]) / ms["median"],
        }

    log(f"components: widths {args.widths}, drafters {list(drafters) or 'none'}")
    calls = {}
    for w in args.widths:
        calls[f"forward_w{w}"] = forward_call(target, w, args.context, cache_length)
        calls[f"body_w{w}"] = forward_call(target, w, args.context, cache_length, features=True)
        calls[f"lm_head_w{w}"] = lm_head_call(target, w)
    calls.update(tiny_parts(target.config, args.k, args.context, args.inner))
    calls.update(drafter_calls(target, None, "plain", prompt, args.k, args.new_tokens))
    for name, drafter in drafters.items():
        calls.update(drafter_calls(target, drafter, name, prompt, args.k, args.new_tokens))
    times = interleaved(calls, args.repeats, warmup=2)
    for key, seconds in times.items():
        per = args.inner if key in ("acceptance", "commit") else 1
        result["ms"][key] = summary([s / per for s in seconds])
    med = {key: s["median"] for key, s in result["ms"].items()}

    log("whole generate calls (host overhead)")
    result["host"] = host_overhead(target, drafters, prompt, args, med)
    log("tokens per round on chat prompts")
    chats = chat_prompts(target.tokenizer, args.tpr_prompts)
    bytes_ = weight_bytes(target)
    bw = result["bandwidth"]["copy_gbps"]["median"] * 1e9
    roofline_ms = 1e3 * bytes_["per_step"] / bw
    plain_ms = med["forward_w1"]
    result["roofline"] = {
        "weight_bytes": bytes_, "copy_gbps": bw / 1e9, "read_gbps": result["bandwidth"]["read_gbps"]["median"],
        "roofline_step_ms": roofline_ms, "plain_step_ms": plain_ms, "roofline_over_plain_step": roofline_ms / plain_ms,
        "effective_gbps_plain_step": bytes_["per_step"] / plain_ms / 1e6,
    }  # fmt: skip
    result["drafters"] = dict(failed)
    for name, drafter in drafters.items():
        tpr = tokens_per_round(target, drafter, chats, args.k, args.tpr_tokens)
        tau, propose = tpr["tokens_per_round"], med[f"propose_{name}"]
        fixed = propose + med["acceptance"] + med["commit"]
        result["drafters"][name] = {**tpr, "propose_ms": propose, "round_ms": med[f"round_{name}"],
            "update_and_rest_ms": med[f"round_{name}"] - med[f"forward_w{args.k + 1}"] - fixed,
            "speedup_measured_parts": tau * med["round_plain"] / med[f"round_{name}"],
            "bound_verify_at_roofline": tau * plain_ms / (roofline_ms + fixed),
            "bound_all_at_roofline": tau * roofline_ms / (roofline_ms + fixed)}  # fmt: skip
        log(f"  {name}: {tau:.2f} tokens/round, propose {propose:.3f} ms")
    for key in ("acceptance", "commit", "dispatch", "round_plain", *[f"forward_w{w}" for w in args.widths]):
        log(f"  {key:>14}: {med[key]:9.3f} ms")
    speed = roofline_ms / plain_ms
    log(f"  roofline step {roofline_ms:.3f} ms, plain step {plain_ms:.3f} ms ({speed:.0%} of roofline speed)")
    write_json(args.out, result)
    plot(result, args, Path(args.out).with_suffix(".png"))
    return result


def plot(result: dict, args, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    ms = result["ms"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    for prefix, label in (("forward", "forward"), ("body", "without LM head"), ("lm_head", "LM head alone")):
        keys = [f"{prefix}_w{w}" for w in args.widths]
        left.errorbar(args.widths, [ms[k]["median"] for k in keys], yerr=[[ms[k]["median"] - ms[k]["q1"] for k in keys],
                      [ms[k]["q3"] - ms[k]["median"] for k in keys]], marker="o", capsize=3, label=label)  # fmt: skip
    left.axhline(result["roofline"]["roofline_step_ms"], color="k", linestyle="--", label="roofline (bytes / memcpy)")
    left.set(xlabel="verify width", ylabel="ms (median, IQR)", title=f"{args.target} ({args.weights})")
    left.legend()
    parts = ["dispatch", "acceptance", "commit", "round_plain", f"forward_w{args.k + 1}"]
    parts += [k for k in ms if k.startswith(("propose_", "round_")) and k != "round_plain"]
    right.barh(
        parts,
        [ms[k]["median"] for k in parts],
        xerr=[[ms[k]["median"] - ms[k]["q1"] for k in parts], [ms[k]["q3"] - ms[k]["median"] for k in parts]],
    )
    right.set(xlabel="ms (median)", title=f"one round's parts, K = {args.k}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
