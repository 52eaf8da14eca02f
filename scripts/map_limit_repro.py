"""Reproduce issue 15 in a minute: fill this process's memory mappings to near Linux's
vm.max_map_count, then compile a few speculative programs (each live XLA:CPU executable
holds a few hundred mappings).

    python scripts/map_limit_repro.py --headroom 4000 --map-headroom 0     # no guard: dies
    python scripts/map_limit_repro.py --headroom 4000                      # default guard: survives

Without the guard the process aborts inside jax's `backend_compile_and_load` with
"LLVM ERROR: Unable to allocate section memory" (SIGABRT, exit code 134), the failure a
long sweep reaches after a few hundred programs. With specjax's default guard
(`specjax.runtime.MAP_HEADROOM = 0.25`) JAX's caches are cleared before a launch
once the mappings pass 75% of the limit, and every call completes.
"""

from __future__ import annotations

import argparse
import faulthandler
import mmap

import specjax
from specjax import runtime as output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--headroom", type=int, default=4000, help="mappings left free after filling")
    parser.add_argument("--map-headroom", type=float, default=output.MAP_HEADROOM, help="the guard's share; 0 = off")
    args = parser.parse_args()
    faulthandler.enable()
    output.MAP_HEADROOM = args.map_headroom
    config = specjax.ModelConfig(vocab_size=48, hidden_size=32, intermediate_size=64, max_position_embeddings=256)
    target = specjax.init_model(config, 0)
    draft = specjax.init_model(config.replace(num_hidden_layers=1), 1)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [7]]
    specjax.generate(target, prompts, specjax.GenerationConfig(max_new_tokens=4))
    limit = output.memory_mappings()[1]
    hold = []  # anonymous pages with alternating protections, so the kernel cannot merge them
    prots = [mmap.PROT_READ, mmap.PROT_READ | mmap.PROT_WRITE]
    while (missing := limit - args.headroom - output.memory_mappings()[0]) > 0:
        for _ in range(missing):
            hold.append(mmap.mmap(-1, 4096, prot=prots[len(hold) % 2]))
    print("filled to", output.memory_mappings(), flush=True)
    for k in range(1, 9):
        for n in (10, 80):  # two cache lengths: two programs per K
            specjax.generate(
                target,
                prompts,
                specjax.GenerationConfig(max_new_tokens=n),
                draft=draft,
                speculative=specjax.SpeculativeConfig(num_speculative_tokens=k),
            )
            print(f"K={k} new={n} mappings={output.memory_mappings()[0]} clears={output.cache_clears()}", flush=True)
    print("survived")


if __name__ == "__main__":
    main()
