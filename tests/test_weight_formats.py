"""Weight formats (models/quant.py, specjax/io/weight_formats.py): int8 products are exact
integer arithmetic and independent of the other rows; each format stays close to float32;
greedy speculative output equals plain greedy output within a format; loading and heads."""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TARGET_CONFIG
from flax import nnx
from specjax.models import graphdef
from specjax.models.heads import head_config, init_eagle_params
from specjax.models.llama import embedding, lm_head, params_embedding, params_lm_head
from specjax.models.quant import project, quantize

import specjax
from specjax.drafters import Eagle, PromptLookup, target_fingerprint
from specjax.io.model import logits
from specjax.io.presets import load_model
from specjax.io.weight_formats import with_weights

SPEC = "btd,df->btf"
PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 8, 9], [7, 20]]  # ragged, with repeats
GREEDY = specjax.GenerationConfig(max_new_tokens=16)


def _reference(x, w):
    """int8 `project` in numpy: per-row activation scale, exact integer products."""
    x, w = np.asarray(x, np.float32), np.asarray(w, np.float32)
    ws = np.abs(w).max(axis=0) * np.float32(1 / 127)
    qw = np.clip(np.round(w / np.where(ws == 0, 1, ws)), -127, 127).astype(np.int64)
    xs = np.abs(x).max(axis=-1) * np.float32(1 / 127)
    qx = np.clip(np.round(x / np.where(xs == 0, 1, xs)[..., None]), -127, 127).astype(np.int64)
    acc = np.einsum("btd,df->btf", qx, qw)
    assert np.abs(acc).max() < 2**31
    return acc.astype(np.float32) * (xs[..., None] * ws).astype(np.float32)


def test_int8_project_is_exact_and_each_row_independent_of_the_others():
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (5, 1, 48)) * jnp.arange(1, 6.0)[:, None, None]  # rows of other scales
    x = x.at[3].set(0.0)  # an all-zero row: scale 0, no NaN
    w = jax.random.normal(kw, (48, 40)).at[:, 7].set(0.0)  # an all-zero channel too
    qw, ws = quantize(w, (0,))
    run = jax.jit(lambda x: project(x, qw, ws, SPEC, "int8"))
    together = np.asarray(run(x))  # [5, 1, 40]
    np.testing.assert_array_equal(together, _reference(x, w))
    assert np.isfinite(together).all() and not together[3].any() and not together[:, :, 7].any()
    for i in range(5):
        alone = np.asarray(run(x[i : i + 1]))  # one row: padded to two inside project
        pair = np.asarray(run(x[jnp.array([i, (i + 1) % 5])]))
        np.testing.assert_array_equal(alone[0], together[i])
        np.testing.assert_array_equal(pair[0], together[i])
    # One row along T instead of B takes the same path.
    np.testing.assert_array_equal(np.asarray(run(x[2:3])), np.asarray(run(x[2:3].reshape(1, 1, 48))))


def test_a_bfloat16_row_is_the_same_bits_decoded_alone_or_verified_among_others():
    """The mechanism of greedy speculation leaving plain output (results/width_classes): the
    row count picks the dot kernel (here bfloat16 with float32 accumulation sums one row, two
    rows and three or more in three different orders). Padded to MIN_ROWS, a row decoded
    alone (a plain step), among K + 1 (a verify) or in a batch gets the same bits. With
    MIN_ROWS["bfloat16"] at 1 this fails on the machines measured so far."""
    kx, kw = jax.random.split(jax.random.key(1))
    x = jax.random.normal(kx, (1, 8, 576))  # SmolLM2's width: the kernels of a real model
    w = jax.random.normal(kw, (576, 1536)).astype(jnp.bfloat16)
    run = jax.jit(lambda x: project(x, w, None, SPEC, "bfloat16"))
    rows = {t: np.asarray(run(x[:, :t]))[0, 0] for t in (1, 2, 3, 5, 8)}
    same = {t: bool(np.array_equal(rows[t], rows[8])) for t in rows}
    assert all(same.values()), same


def _kl(p_logits, q_logits) -> float:
    p = jax.nn.log_softmax(jnp.asarray(p_logits, jnp.float32), axis=-1)
    q = jax.nn.log_softmax(jnp.asarray(q_logits, jnp.float32), axis=-1)
    return float(jnp.mean(jnp.sum(jnp.exp(p) * (p - q), axis=-1)))


# The non-float32 formats' families in three shapes: Llama; Qwen2 with biases and a tied
# head; Gemma 3's (1 + w) norms (test_smoothing.py folds into each).
FAMILY_CONFIGS = {
    "llama": TARGET_CONFIG,
    "qwen2-bias-tied": TARGET_CONFIG.replace(tie_word_embeddings=True, attention_bias=True, model_type="qwen2"),
    "gemma3-tied": TARGET_CONFIG.replace(
        model_type="gemma3_text", tie_word_embeddings=True, query_pre_attn_scalar=8.0, rope_local_base_freq=1e4
    ),
}


@pytest.mark.parametrize("config", FAMILY_CONFIGS.values(), ids=FAMILY_CONFIGS.keys())
def test_each_format_stays_close_to_float32(config):
    model = specjax.init_model(config, seed=2)
    model = specjax.Model(config, jax.tree.map(lambda x: x * 8 if x.ndim > 1 else x, model.params))
    tokens = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8]]
    reference = logits(model, tokens)
    assert with_weights(model, "float32") is model
    np.testing.assert_array_equal(logits(with_weights(model, "float32"), tokens), reference)
    kl = {}
    for fmt in ("bfloat16", "int8"):
        converted = with_weights(model, fmt)
        assert converted.config.weights == fmt
        out = logits(converted, tokens)
        assert np.isfinite(out).all() and not np.array_equal(out, reference)
        kl[fmt] = _kl(reference, out)
        assert np.mean(out.argmax(-1) == reference.argmax(-1)) >= 0.9, fmt
    assert 0 < kl["bfloat16"] < kl["int8"] < 0.02, kl


@pytest.fixture(scope="module")
def formats(target, noisy_draft):
    """(target, draft) per format, and the plain greedy output of each target."""
    out = {}
    for fmt in ("bfloat16", "int8"):
        t = with_weights(target, fmt)
        out[fmt] = t, with_weights(noisy_draft, fmt), specjax.generate(t, PROMPTS, GREEDY).tokens
    return out


@pytest.mark.parametrize(
    "fmt, drafter",
    [("bfloat16", "draft"), ("int8", "draft"), ("int8", "float32 draft"), ("int8", "lookup"), ("int8", "tree")],
)
def test_greedy_speculation_equals_plain_greedy_within_a_format(formats, noisy_draft, fmt, drafter):
    """Chains, and a token tree (its nodes off their positions: models/tree_layout.py)."""
    target, draft, plain = formats[fmt]
    draft = {"draft": draft, "float32 draft": noisy_draft, "lookup": PromptLookup(), "tree": draft}[drafter]
    tree = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)] if drafter == "tree" else None
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=3, tree=tree)
    out = specjax.generate(target, PROMPTS, GREEDY, draft=draft, speculative=speculative)
    assert out.tokens == plain
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens  # acceptances and rejections


def test_load_model_takes_a_format_and_names_the_formats_on_a_bad_one():
    model = load_model("random-target", weights="int8")
    assert model.config.weights == "int8"
    assert model.params["layers"][0]["mlp"]["up_proj"].dtype == jnp.int8
    assert model.params["lm_head_scale"].shape == (model.config.vocab_size,)
    assert model.tokenizer is not None
    for bad in ("int4", "fp8"):
        with pytest.raises(ValueError, match="float32, bfloat16, int8"):
            load_model("random-target", weights=bad)
    with pytest.raises(ValueError, match="float32, bfloat16, int8"):
        TARGET_CONFIG.replace(weights="int4")
    gpt2 = specjax.init_model(TARGET_CONFIG.replace(model_type="gpt2", num_key_value_heads=4))
    with pytest.raises(ValueError, match="weights='int8' is not supported for model_type 'gpt2' yet"):
        with_weights(gpt2, "int8")
    with pytest.raises(ValueError, match="already int8"):
        with_weights(model, "bfloat16")


def test_a_head_for_the_float32_target_loads_on_its_converted_target(tmp_path, target):
    layer = head_config(TARGET_CONFIG, 2, 1, 32)
    eagle = Eagle(params=init_eagle_params(layer, target.params, 0, TARGET_CONFIG), config=layer)
    path = specjax.save_drafter(eagle, tmp_path / "eagle", target_name="tiny-target", target=target)
    for fmt in ("bfloat16", "int8"):
        converted = with_weights(target, fmt)
        assert target_fingerprint(converted) == target_fingerprint(target)
        assert specjax.load_drafter(path, converted).name == "eagle"
    other = with_weights(specjax.Model(TARGET_CONFIG, jax.tree.map(lambda x: -x, target.params)), "int8")
    with pytest.raises(ValueError, match="other weights"):
        specjax.load_drafter(path, other)


def test_params_helpers_match_the_module(target):
    """params_embedding / params_lm_head (what a draft head reading its target would call)
    equal the module's lookup and head in every format."""
    tokens = jnp.array([[3, 9, 4], [1, 1, 2]])
    for fmt in ("bfloat16", "int8"):
        model = with_weights(target, fmt)
        module = nnx.merge(graphdef(model.config), model.params)
        hidden = embedding(module, tokens)
        np.testing.assert_array_equal(params_embedding(model.config, model.params, tokens), hidden)
        np.testing.assert_array_equal(params_lm_head(model.config, model.params, hidden), lm_head(module, hidden))
    # An int8 matrix in a float32 product (a head's module merged with an int8 target) is refused.
    qw, _ = quantize(jnp.ones((4, 3)), (0,))
    with pytest.raises(ValueError, match="int8 weight in a float32 product"):
        project(jnp.ones((1, 1, 4)), qw, None, SPEC, "float32")


def test_cli_and_bench_configs_take_a_format(capsys):
    from specjax.bench import BenchConfig
    from specjax.bench.context import load_model as bench_model
    from specjax.cli import main
    from specjax.cli.generate import _loader
    from specjax.configs import apply_overrides, from_dict

    args = ["generate", "--target", "random-draft", "--prompt", "abcabc", "--max-new-tokens", "4", "--plain"]
    assert main([*args, "--weights", "int8", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["settings"]["weights"] == "int8" and record["stats"]["generated_tokens"] == 4
    with pytest.raises(SystemExit):  # argparse: an unknown format is a usage error
        main([*args, "--weights", "int4"])
    assert "float32, bfloat16, int8" in capsys.readouterr().err.replace("'", "")
    # --drafter's model names load in the same format (a preset, and a shape).
    load = _loader(argparse.Namespace(seed=0, weights="bfloat16"))
    assert load("random-draft").config.weights == load(TARGET_CONFIG).config.weights == "bfloat16"
    assert from_dict(BenchConfig, apply_overrides({}, ["weights=int8"])).weights == "int8"
    with pytest.raises(ValueError, match="float32, bfloat16, int8"):
        from_dict(BenchConfig, {"weights": "int4"})
    assert bench_model(TARGET_CONFIG, seed=0, weights="bfloat16").config.weights == "bfloat16"


@pytest.fixture(scope="module")
def stdlib_pair():
    """The embedded target in float32 and int8, and a prompt it answers with repeats."""
    target = load_model("stdlib-target")
    prompts = [target.tokenizer.encode("def merge_sorted(a, b):\n    "), target.tokenizer.encode("import os\n")]
    return target, with_weights(target, "int8"), prompts


@pytest.mark.parametrize("head", ["stdlib-eagle", "stdlib-eagle3-published", "stdlib-medusa", "stdlib-block-head"])
def test_a_head_drafts_as_well_for_the_int8_target(stdlib_pair, head):
    """Every head kind reads its target's embedding and LM head: on an int8 target it must
    read the codes times their scales (models/heads.py target_embedding / target_logits),
    or its drafts are noise. Greedy output equals plain int8 output, and the head keeps
    most of the acceptance it has on the float32 target (the targets' argmaxes mostly agree)."""
    target, int8, prompts = stdlib_pair
    config = specjax.GenerationConfig(max_new_tokens=24, eos_token_id=None)
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=3)
    accepted = {}
    for name, model in (("float32", target), ("int8", int8)):
        drafter = specjax.load_drafter(head, model)
        out = specjax.generate(model, prompts, config, draft=drafter, speculative=speculative)
        assert out.tokens == specjax.generate(model, prompts, config).tokens
        accepted[name] = out.stats.accepted_tokens / out.stats.drafted_tokens
    assert accepted["float32"] > 0.3, accepted  # a trained head: the comparison means something
    assert accepted["int8"] > 0.7 * accepted["float32"], accepted


@pytest.mark.parametrize("fmt", ["bfloat16", "int8"])
def test_a_positions_logits_are_the_same_bits_at_every_verify_width(stdlib_pair, fmt):
    """What makes greedy speculation equal plain greedy in these formats by construction, not
    by luck: the logits of a position are bitwise the same whether it is decoded alone (a
    plain step, one row), verified among K + 1 tokens at any index, or decoded beside other
    sequences. XLA:CPU sums a row's softmax and norm in an order that depends on the row count
    (models/fixed_order.py); before the fixed-order sums, int8 at width 8 differed here."""
    target, _, _ = stdlib_pair
    model = with_weights(target, fmt)
    cfg = model.config
    tokens = np.random.default_rng(0).integers(3, 250, size=(3, 68)).astype(np.int32)  # 60 + 8 per sequence

    @jax.jit
    def forward(params, tokens, start, cache):  # tokens [B, T] at positions start.. -> (logits [B, T, V], cache)
        positions = start + jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
        return specjax.models.forward(cfg, params, tokens, positions, cache)

    # The params an argument, as generation passes them (closed over, they were constants of
    # every program: each of the 7 compiles took seconds longer).
    def run(tokens, start, cache):
        return forward(model.params, tokens, start, cache)

    def prefilled(rows):
        return run(tokens[rows, :60], 0, specjax.models.init_cache(cfg, len(rows), 128))[1]

    plain, cache = [], prefilled([0, 1, 2])  # plain decoding: one token a step, batch 3
    for p in range(60, 68):
        logits, cache = run(tokens[:, p : p + 1], p, cache)
        plain.append(np.asarray(logits[:, 0]))  # [3, V]
    plain = np.stack(plain, axis=1)  # [3, 8, V]
    for width in (2, 5, 8):  # verifies: position 60 + j at index j
        verified = np.asarray(run(tokens[:, 60 : 60 + width], 60, prefilled([0, 1, 2]))[0])
        np.testing.assert_array_equal(verified, plain[:, :width], err_msg=f"verify width {width}")
    alone = np.asarray(run(tokens[1:2, 60:65], 60, prefilled([1]))[0])  # the middle sequence at batch 1
    np.testing.assert_array_equal(alone[0], plain[1, :5])


def test_the_cost_model_counts_a_formats_bytes(target):
    """Roofline and cost-model byte counts read the stored dtype: an int8 weight is 1 byte."""
    from specjax.bench.cost_model import matmul_bytes, matmul_parameters

    n = matmul_parameters(target)
    assert matmul_bytes(target) == 4 * n
    assert matmul_parameters(with_weights(target, "int8")) == n  # the scales are no matrices
    assert n < matmul_bytes(with_weights(target, "int8")) < 1.1 * n  # norms and biases stay float32
    assert 2 * n < matmul_bytes(with_weights(target, "bfloat16")) < 2.2 * n


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_fixed_attention_gives_a_query_the_same_bits_beside_any_number_of_others(dtype):
    """The attention of the bfloat16 and int8 formats (`fixed`): a query row's output is the
    same bits whether it runs alone (a plain step) or among T - 1 others (a verify of width T,
    a tree), at SmolLM2-135M's attention shapes (3 KV heads of 3 query heads each, d_head 64).
    XLA:CPU picks a dot's kernel, and the order it sums a row in, by how many rows the dot
    runs (G x T): with T in the scores' and the weighted values' rows, widths 9, 10 and 17
    summed otherwise, and SmolLM2 in int8 left plain greedy output at K = 8."""
    from specjax.models.attention import attend
    from specjax.models.cache import init_cache

    shapes = {"num_hidden_layers": 1, "num_key_value_heads": 3, "resolved_head_dim": 64}
    cfg = argparse.Namespace(**shapes, dtype=dtype, weights="int8")  # what init_cache reads
    rng = np.random.default_rng(0)
    prefix, widths = 60, (1, 2, 5, 8, 9, 10, 16, 17, 33)
    n = prefix + max(widths)
    q = jnp.asarray(rng.standard_normal((2, n, 9, 64)), dtype)  # [B, T, H, d_head]
    k = jnp.asarray(rng.standard_normal((2, n, 3, 64)), dtype)  # [B, T, n_kv, d_head]
    v = jnp.asarray(rng.standard_normal((2, n, 3, 64)), dtype)
    positions = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (2, n))

    @jax.jit
    def verify(q, k, v, positions, cache):
        return attend(q, k, v, positions, cache, 0, fixed=True)

    cache = verify(q[:, :prefix], k[:, :prefix], v[:, :prefix], positions[:, :prefix], init_cache(cfg, 2, 128))[1]
    outs = {w: np.asarray(verify(*(a[:, prefix : prefix + w] for a in (q, k, v, positions)), cache)[0]) for w in widths}
    for w in widths[1:]:
        np.testing.assert_array_equal(outs[w][:, 0], outs[1][:, 0], err_msg=f"the first query beside {w - 1} others")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_fixed_attention_gives_a_tree_node_the_bits_of_its_path_decoded_plainly(dtype):
    """A token tree in the bfloat16 and int8 formats: node t sits at a window slot other than
    its position (siblings share a position), so its ancestors' terms would enter the
    fixed-order sums at other places than a plain step puts them, and its output differ by
    an ulp (the int8 E9 on SmolLM2 left plain greedy output). Each node's output must be the
    bits of decoding its path root..t one token a step, at SmolLM2's attention shapes, with
    the window across a cache block boundary and the rows' trees at different positions."""
    from specjax.models.attention import TreeMask, attend
    from specjax.models.cache import init_cache
    from specjax.models.tree_layout import PathLayout

    shapes = {"num_hidden_layers": 1, "num_key_value_heads": 3, "resolved_head_dim": 64}
    cfg = argparse.Namespace(**shapes, dtype=dtype, weights="int8")
    parents = [-1, 0, 0, 0, 1, 1, 2, 3, 4, 4, 6, 8]  # breadth-first: a parent before its children
    depths = [0]
    for p in parents[1:]:
        depths.append(depths[p] + 1)
    ancestors = np.zeros((len(parents), len(parents)), bool)
    for t, p in enumerate(parents):
        ancestors[t] = ancestors[p] if p >= 0 else False
        ancestors[t, t] = True
    rng = np.random.default_rng(1)
    start, n = 60, len(parents)  # the nodes' q, k, v: indices 60..71 of each row
    roots = jnp.asarray([60, 45], jnp.int32)  # [B]: row 0's window 60..71 spans two 32-slot blocks
    q = jnp.asarray(rng.standard_normal((2, start + n, 9, 64)), dtype)  # [B, T, H, d_head]
    k = jnp.asarray(rng.standard_normal((2, start + n, 3, 64)), dtype)  # [B, T, n_kv, d_head]
    v = jnp.asarray(rng.standard_normal((2, start + n, 3, 64)), dtype)

    @jax.jit
    def call(q, k, v, positions, cache, tree=None):
        return attend(q, k, v, positions, cache, 0, tree, fixed=True)

    # Both rows prefilled with 60 tokens; row 1's tree then starts at 45 (its slots past 45
    # are stale: overwritten or past every node's position, as after a rejected round).
    prefix = jnp.broadcast_to(jnp.arange(start, dtype=jnp.int32), (2, start))
    cache = call(q[:, :start], k[:, :start], v[:, :start], prefix, init_cache(cfg, 2, 128, block_size=32))[1]
    slots = roots[:, None] + jnp.arange(n, dtype=jnp.int32)  # [B, N]
    positions = roots[:, None] + jnp.asarray(depths, jnp.int32)
    layout = PathLayout.of(parents)
    mask = TreeMask(start=roots, slots=slots, visible=jnp.asarray(ancestors), layout=layout)
    tree_out = np.asarray(call(q[:, start:], k[:, start:], v[:, start:], positions, cache, mask)[0])
    for t in range(n):
        path, node = [], t
        while node >= 0:
            path.insert(0, start + node)
            node = parents[node]
        plain = cache
        for depth, index in enumerate(path):  # one token a step, at slot = position
            one = (a[:, index : index + 1] for a in (q, k, v))
            out, plain = call(*one, roots[:, None] + depth, plain)
        np.testing.assert_array_equal(tree_out[:, t], np.asarray(out)[:, 0], err_msg=f"node {t} (depth {depths[t]})")
