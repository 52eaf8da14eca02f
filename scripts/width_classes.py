"""Which row counts share a matmul kernel on this machine: the mechanism behind greedy
speculative output that leaves plain output (issue 40; `results/gpu_h200` saw it in bfloat16).

A verify forward runs the target over K + 1 rows per sequence, plain decoding over one. If the
dot kernel XLA picks for one row accumulates in another order than the one for K + 1 rows, the
same token at the same position gets logits that differ in their last bits, and a near-tie
argmax can flip: speculative greedy output then leaves plain greedy output although both are
"correct". This script computes row 0 of `x[:, :t] @ w` for t = 1..16 in each weight format and
groups the row counts whose row 0 is bitwise equal: one class = the row's result does not depend
on the width; several = the width changes the numerics. Attention's score dot is checked too.

    python scripts/width_classes.py --out results/width_classes/width_classes_<cpu>.json

On the 2-core Intel Xeon (AMX) VM, jax 0.10.2: float32 has classes {1} and {2..16}; bfloat16
with float32 accumulation {1}, {2} and {3..16}; int8 x int8 -> int32 one class (integer sums are
exact); attention's scores one class. So padding every target forward to the first row count of
the last class makes plain steps and verifies run the same kernel, and greedy output match.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _timing import machine

# (name, stored dtype, accumulation dtype): the weight formats' matmuls (models/quant.py)
FORMATS = (
    ("float32", jnp.float32, None),
    ("bfloat16 (float32 accumulation)", jnp.bfloat16, jnp.float32),
    ("bfloat16 (bfloat16 result)", jnp.bfloat16, None),
    ("int8 (int32 accumulation)", jnp.int8, jnp.int32),
)
SHAPES = ((576, 192), (576, 1536), (1536, 576), (576, 49152))  # SmolLM2-135M: q/k/v, gate/up, down, LM head


def classes(results: dict[int, np.ndarray]) -> list[list[int]]:
    """Row counts grouped by bitwise-equal row 0, in order."""
    groups: list[tuple[np.ndarray, list[int]]] = []
    for t, row in results.items():
        for rep, members in groups:
            if np.array_equal(rep, row):
                members.append(t)
                break
        else:
            groups.append((row, [t]))
    return [members for _, members in groups]


def _operands(rng, dtype, shape_x, shape_w):
    if dtype == jnp.int8:
        return (jnp.asarray(rng.integers(-127, 128, s), jnp.int8) for s in (shape_x, shape_w))
    return (jnp.asarray(rng.standard_normal(s), dtype) for s in (shape_x, shape_w))


def measure(max_rows: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for name, dtype, accumulate in FORMATS:
        dot = jax.jit(lambda x, w, a=accumulate: jnp.einsum("btd,df->btf", x, w, preferred_element_type=a))
        for d, f in SHAPES:
            x, w = _operands(rng, dtype, (1, max_rows, d), (d, f))  # x [1, T, D], w [D, F]
            rows = {t: np.asarray(dot(x[:, :t], w)).astype(np.float64)[0, 0] for t in range(1, max_rows + 1)}
            out.setdefault(name, {})[f"{d}x{f}"] = classes(rows)
    scores = jax.jit(lambda q, k: jnp.einsum("bthd,bshd->bhts", q, k))  # q [1, T, H, d], k [1, S, H, d]
    for name, dtype in (("attention scores float32", jnp.float32), ("attention scores bfloat16", jnp.bfloat16)):
        q, k = _operands(rng, dtype, (1, max_rows, 9, 64), (1, 300, 9, 64))
        rows = {t: np.asarray(scores(q[:, :t], k)).astype(np.float64)[0, :, 0] for t in range(1, max_rows + 1)}
        out[name] = {"9 heads x 64, 300 keys": classes(rows)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-rows", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the JSON here too")
    args = parser.parse_args()
    record = {
        "machine": machine(),  # CPU model and flags (avx512_bf16, amx), jax, load, the command
        "classes": measure(args.max_rows, args.seed),
    }
    text = json.dumps(record, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
