"""Does a token tree's node keep the bits of its path decoded plainly, and what does laying its
ancestors at their positions cost?

In the bfloat16 and int8 formats a position's logits must be the same bits however it is
verified (models/fixed_order.py). A tree's nodes sit at window slots other than their
positions; attention therefore reads the window once per root-to-leaf path, the path's nodes
laid at their positions (models/tree_layout.py `PathLayout`, on `TreeMask.layout`). For a weight format's
target (default SmolLM2-135M-Instruct in int8): prefill random tokens, verify random trees in
one forward, and count the (row, node) logits that differ from the plain steps along each
node's path, and the greedy tokens that flip, with the layout (as shipped) and without it
(as the code ran before 7c4f97d). Then time the tree's forward both ways and a chain of the same
width, in one process, alternating, best of 7 x 5 calls.

    python scripts/tree_attention_check.py --out results/width_classes/tree_attention_int8.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _timing import chain_forward, machine

TREES = {"tuned-5": [[0], [1], [0, 0], [0, 0, 0], [1, 0]], "binary-3": "binary-3", "prior-16": "prior-16"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--weights", choices=["bfloat16", "int8"], default="int8")
    parser.add_argument("--trees", default=",".join(TREES), help=f"trees to check, of {', '.join(TREES)}")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--attention-block", type=int, default=256, help="the cache's attention block (slots)")
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def tree_forward(model, tree, laid: bool):
    """A jitted forward of the tree's N + 1 nodes (the root first) after `start` committed
    slots: tokens [B, N + 1], start [B] -> logits [B, N + 1, V]."""
    import jax
    import jax.numpy as jnp
    from specjax.models import PathLayout, TreeMask

    import specjax

    depths, ancestors = jnp.asarray(tree.depths), jnp.asarray(tree.ancestors)
    layout = PathLayout.of(tree.parents) if laid else None

    @jax.jit
    def forward(params, tokens, start, cache):
        slots = start[:, None] + jnp.arange(tokens.shape[1])  # [B, N + 1]
        mask = TreeMask(start=start, slots=slots, visible=ancestors, layout=layout)
        return specjax.models.forward(model.config, params, tokens, start[:, None] + depths, cache, mask)[0]

    return forward


def plain_forward(model):
    import functools

    import jax

    return jax.jit(functools.partial(chain_forward, model.config))  # tokens [B, T] at positions start..


def bits(model, name: str, tree, batch: int) -> list[dict]:
    import jax.numpy as jnp
    import numpy as np

    import specjax

    prefix, n = 60, tree.num_nodes + 1
    rng = np.random.default_rng(0)
    context = rng.integers(3, 40000, size=(batch, prefix)).astype(np.int32)
    nodes = np.concatenate([context[:, -1:], rng.integers(3, 40000, size=(batch, n - 1))], axis=1).astype(np.int32)
    plain = plain_forward(model)
    # The cache of the first prefix - 1 tokens: the root (the last one) is fed again by the tree.
    cache = plain(model.params, context[:, :-1], 0, specjax.models.init_cache(model.config, batch, 128))[1]
    reference = np.zeros((batch, n, model.config.vocab_size), np.float32)
    for t in range(n):  # node t's logits from plain steps along its path
        path = [int(a) for a in np.flatnonzero(tree.ancestors[t])]
        state = cache
        for depth, node in enumerate(path):
            logits, state = plain(model.params, nodes[:, node : node + 1], prefix - 1 + depth, state)
        reference[:, t] = np.asarray(logits[:, 0])
    start = jnp.full((batch,), prefix - 1, jnp.int32)
    rows = []
    for laid in (False, True):
        verified = np.asarray(tree_forward(model, tree, laid)(model.params, nodes, start, cache))
        diff = np.abs(verified - reference).max(axis=-1)  # [B, N + 1]
        rows.append(
            {
                "tree": name,
                "laid": laid,
                "batch": batch,
                "nodes": n,
                "differing": int((diff > 0).sum()),
                "max_abs_diff": float(diff.max()),
                "argmax_flips": int((verified.argmax(-1) != reference.argmax(-1)).sum()),
            }
        )
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def speed(model, name: str, tree, batch: int, block: int) -> dict:
    import jax
    import jax.numpy as jnp

    import specjax

    n = tree.num_nodes + 1
    cache = specjax.models.init_cache(model.config, batch, 256, block_size=block)
    tokens, start = jnp.ones((batch, n), jnp.int32), jnp.full((batch,), 100, jnp.int32)
    chain, unlaid, laid = plain_forward(model), tree_forward(model, tree, False), tree_forward(model, tree, True)
    fns = {
        "unlaid": lambda: unlaid(model.params, tokens, start, cache),
        "laid": lambda: laid(model.params, tokens, start, cache),
        "chain": lambda: chain(model.params, tokens, 100, cache)[0],
    }
    for f in fns.values():
        jax.block_until_ready(f())
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(7):
        for key, f in fns.items():
            begin = time.perf_counter()
            for _ in range(5):
                jax.block_until_ready(f())
            best[key] = min(best[key], (time.perf_counter() - begin) / 5)
    row = {"tree": name, "batch": batch, "width": n, "attention_block": block}
    row |= {f"{k}_ms": round(v * 1e3, 3) for k, v in best.items()}
    row["laid_over_unlaid"] = round(best["laid"] / best["unlaid"], 3)
    row["laid_over_chain"] = round(best["laid"] / best["chain"], 3)
    print(row, file=sys.stderr, flush=True)
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    import specjax

    model = specjax.load_model(args.target, weights=args.weights)
    trees = {name: specjax.Tree.from_spec(TREES[name]) for name in args.trees.split(",")}
    batches = [int(b) for b in args.batches.split(",")]
    record = {
        "command": "python scripts/tree_attention_check.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "weights": args.weights,
        "bits": [row for name, tree in trees.items() for b in batches for row in bits(model, name, tree, b)],
        "speed": [speed(model, name, tree, b, args.attention_block) for name, tree in trees.items() for b in batches],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
