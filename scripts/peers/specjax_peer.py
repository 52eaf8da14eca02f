"""specjax's methods: plain decoding and its speculative drafters, in each weight format.

The target is the packaged GGUF dequantised to float32 (specjax.load_model), then stored in
the format asked for (specjax/io/weight_formats.py). The drafters are E8's on SmolLM2
(results/smollm2_e8_int8): the shipped EAGLE-3 head, the distilled 2-layer draft loaded in
the same format, and prompt lookup n = 1-3, all at K = 4, greedy. Each call is one
`specjax.generate` of one prompt, which ends in a device_get: its wall time is finished work.

A call that compiled is timed again (`retimed` in the row's counters): a dozen methods x
prompt shapes hold more programs than the process keeps alive (specjax/runtime.py clears
JAX's caches near vm.max_map_count), and the first full run here (2026-12-06) timed 10-20 s
recompiles as 64-token calls that take 2 s warm. engine/clock.py's `timed_warm` does the same.
"""

from __future__ import annotations

from collections.abc import Callable

from method import Call, Method, timed

# label -> the drafter spec (as bench configs write it); None is plain decoding.
DRAFTERS: dict[str, object] = {
    "plain": None,
    "lookup n=1-3": {"method": "prompt_lookup", "prompt_lookup_min": 1, "prompt_lookup_max": 3},
    "eagle3 head": "smollm2-eagle3",
    "distilled draft": "smollm2-draft",
}


def load_target(weights: str):
    import specjax

    return specjax.load_model("smollm2-135m-instruct", weights=weights)


def methods(weights: str, k: int, kinds: list[str], on_error: Callable[[str, BaseException], None]) -> list[Method]:
    """specjax's methods in weight format `weights`; a drafter that fails to load is passed to
    `on_error` (label, exception) and left out, the others still run."""
    from _timing import weight_bytes

    import specjax
    from specjax.drafters import make_drafter
    from specjax.runtime import compiled_programs

    target = load_target(weights)
    per_step = weight_bytes(target)["per_step"]
    config = specjax.GenerationConfig(ignore_eos=True)
    models: dict[str, object] = {}

    def load(name):  # draft-side models in the target's format, loaded once (as the bench does)
        if name not in models:
            models[name] = specjax.load_model(name, weights=weights)
        return models[name]

    out = []
    for kind in kinds:
        spec = DRAFTERS[kind]
        try:
            if spec is None:
                drafter, speculative = None, None
            else:
                speculative = specjax.SpeculativeConfig.parse(spec).replace(num_speculative_tokens=k)
                drafter = make_drafter(speculative, load, target.config)
        except Exception as error:  # reported with its message, never dropped
            on_error(f"specjax {weights} {kind}", error)
            continue

        def run(ids: list[int], n: int, drafter=drafter, speculative=speculative) -> Call:
            def call():
                holder["out"] = specjax.generate(
                    target, [ids], config.replace(max_new_tokens=n), draft=drafter, speculative=speculative
                )
                return holder["out"].tokens[0]

            holder: dict = {}
            before = compiled_programs()
            tokens, seconds = timed(call)
            retimed = compiled_programs() != before
            if retimed:  # the program was compiled (or recompiled after a cache clear) in the timer
                tokens, seconds = timed(call)
            stats = holder["out"].stats
            extra = {"retimed": int(retimed)}
            if drafter is not None:
                extra["mean_acceptance_length"] = stats.mean_acceptance_length
            return Call(list(map(int, tokens)), seconds, forwards=1 + stats.target_forwards, extra=extra)

        out.append(
            Method(
                peer="specjax",
                name=f"specjax {weights} {kind}",
                kind=kind,
                weights=f"GGUF Q4_1 dequantised, stored {weights}",
                computes_in=weights,
                twin=weights,
                run=run,
                bytes_per_step=per_step,
                notes="" if spec is None else f"K = {k}",
            )
        )
    return out
