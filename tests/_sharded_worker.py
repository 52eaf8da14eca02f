"""Sharded generation against unsharded, on 8 host CPU devices; run by tests/test_sharding.py.

Needs XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax starts (so it runs in
its own process). For every mesh it asserts, and prints one JSON line of what it checked:
  - plain and speculative (draft model, sharded or replicated) greedy tokens == unsharded;
  - full-forward logits within 1e-5 of unsharded (fp32);
  - param and cache leaves really split as the layout says (shard shapes, not specs only);
  - a second call with the same shapes compiles nothing;
  - on one mesh, the parallel drafters (ParallelDraft, BlockHead) also give plain's tokens.
Mode "distributed" (two processes of 4 devices, see tests/test_sharding.py) prints the plain
tokens only: the speculative loop is the same SPMD program kind, and the test must stay short.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np

import specjax
from specjax.drafters import BlockHead, ParallelDraft
from specjax.io.sharding import replicate_model, shard_model
from specjax.parallel import make_mesh

# One mesh of each kind (about 15 s each on a 2-core CPU): (1, 8) all tensor-parallel (kv
# heads replicated 2 -> 8, vocabulary split 8 ways), (2, 4) mixed (kv heads 2 -> 4, the
# replicated draft, slice loading, the parallel drafters), (8, 1) all data-parallel. (4, 2)
# is left out: a mixed mesh like (2, 4) whose kv-head repeat is 1 (the same layout code).
MESHES = ((1, 8), (2, 4), (8, 1))
# 8 query heads and 2 kv heads: on model=8 and model=4 the kv heads must be replicated.
TARGET = specjax.ModelConfig(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)
DRAFT = TARGET.replace(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_key_value_heads=1)
DRAFT = DRAFT.replace(tie_word_embeddings=True)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13], [5, 6, 7], [40, 41, 42, 43], [2], [9, 9]]
NEW, K = 12, 3
CONFIG = specjax.GenerationConfig(max_new_tokens=NEW)
SPEC = specjax.SpeculativeConfig(num_speculative_tokens=K)
_COMPILES = []  # one entry per backend compilation (not importing specjax.bench saves seconds)
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: (
        _COMPILES.append(event) if event == "/jax/core/compile/backend_compile_duration" else None
    )
)


def compiled_programs() -> int:
    return len(_COMPILES)


def scaled(config, seed, scale=8.0):
    """Peaked, varied greedy paths (see tests/conftest.py): random std-0.02 weights scaled up."""
    model = specjax.init_model(config, seed)
    return specjax.Model(config, jax.tree.map(lambda x: x * scale if x.ndim > 1 else x, model.params))


def shard_shape(x) -> tuple:
    return tuple(x.sharding.shard_shape(x.shape))


def check_params(model, mesh_shape) -> None:
    _, m = mesh_shape
    layer = model.params["layers"][0]
    heads, kv = model.config.num_attention_heads, model.config.num_key_value_heads
    assert kv == max(TARGET.num_key_value_heads, m), (kv, m)  # GQA kv heads replicated up to the model axis
    assert shard_shape(layer["attn"]["q_proj"]) == (64, heads // m, 8), shard_shape(layer["attn"]["q_proj"])
    assert shard_shape(layer["attn"]["k_proj"]) == (64, kv // m, 8)
    assert shard_shape(layer["attn"]["o_proj"]) == (heads // m, 8, 64)
    assert shard_shape(layer["mlp"]["gate_proj"]) == (64, 128 // m)
    assert shard_shape(layer["mlp"]["down_proj"]) == (128 // m, 64)
    assert shard_shape(model.params["lm_head"]) == (64, 64 // m)
    assert shard_shape(model.params["embed"]) == (64 // m, 64)
    assert shard_shape(layer["input_norm"]["scale"]) == (64,)
    assert len(layer["attn"]["q_proj"].sharding.device_set) == 8


def check_cache(cache, mesh_shape, rows, kv) -> None:
    d, m = mesh_shape
    layers, b, s, n_kv, hd = cache.k.shape
    assert (b, n_kv) == (rows, kv), (cache.k.shape, rows, kv)
    assert shard_shape(cache.k) == (layers, b // d, s, n_kv // m, hd), (shard_shape(cache.k), mesh_shape)
    assert shard_shape(cache.lengths) == (b // d,), shard_shape(cache.lengths)


def run_meshes() -> None:
    target, draft = scaled(TARGET, 0), scaled(DRAFT, 1)
    ref_plain = specjax.generate(target, PROMPTS, CONFIG).tokens
    ref_spec = specjax.generate(target, PROMPTS, CONFIG, draft=draft, speculative=SPEC)
    probe = np.array([p + [0] * (7 - len(p)) for p in PROMPTS], np.int32)
    ref_logits = specjax.io.model.logits(target, probe)
    for shape in MESHES:
        mesh = make_mesh(*shape)
        st = shard_model(target, mesh)
        check_params(st, shape)
        replicate_draft = shape == (2, 4)  # measure both: one mesh keeps a full draft per device
        sd = replicate_model(draft, mesh) if replicate_draft else shard_model(draft, mesh)

        logits = specjax.io.model.logits(st, probe)
        err = float(np.max(np.abs(logits - ref_logits)))
        assert err <= 1e-5, (shape, err)

        prepared = specjax.prepare(st, PROMPTS, CONFIG)
        state = prepared.launch(NEW)
        check_cache(state.target_cache, shape, 8, st.config.num_key_value_heads)
        assert shard_shape(state.tokens)[0] == 8 // shape[0]
        plain = prepared.collect(state).tokens
        assert plain == ref_plain, (shape, plain, ref_plain)

        spec_prepared = specjax.prepare(st, PROMPTS, CONFIG, draft=sd, speculative=SPEC)
        spec_state = spec_prepared.launch(NEW)
        check_cache(spec_state.target_cache, shape, 8, st.config.num_key_value_heads)
        spec = spec_prepared.collect(spec_state)
        assert spec.tokens == ref_spec.tokens, (shape, spec.tokens, ref_spec.tokens)
        assert spec.stats.acceptance_rate == ref_spec.stats.acceptance_rate

        prepared.run(), spec_prepared.run()  # generate's programs (prefill, chunks of rounds), not launch's
        before = compiled_programs()
        again = specjax.generate(st, PROMPTS, CONFIG).tokens
        again_spec = specjax.generate(st, PROMPTS, CONFIG, draft=sd, speculative=SPEC)
        recompiles = compiled_programs() - before
        assert again == ref_plain and again_spec.tokens == ref_spec.tokens
        assert recompiles == 0, (shape, recompiles)
        print(
            json.dumps(
                {
                    "mesh": list(shape),
                    "logit_err": err,
                    "recompiles": recompiles,
                    "draft": "replicated" if replicate_draft else "sharded",
                    "ok": True,
                }
            ),
            flush=True,
        )
    check_loading(target, make_mesh(2, 4))
    check_parallel_drafters(target, draft, make_mesh(2, 4), ref_plain)
    print(json.dumps({"tokens": ref_plain, "spec_tokens": ref_spec.tokens}), flush=True)


def check_loading(target, mesh) -> None:
    """load_model(mesh=) reads per-device slices and equals shard_model; init_model(mesh=) too."""
    import tempfile

    from specjax.io import sharded_loading as loading
    from specjax.io.hf_config import _llama_family_fields
    from specjax.io.hf_weights import SINGLE_FILE, write_params

    with tempfile.TemporaryDirectory() as tmp:
        # save_model's files, without the transformers import save_model spends seconds on.
        hf = {"model_type": "llama", "vocab_size": TARGET.vocab_size, "tie_word_embeddings": TARGET.tie_word_embeddings}
        (Path(tmp) / "config.json").write_text(json.dumps({**hf, **_llama_family_fields(TARGET)}))
        write_params(Path(tmp) / SINGLE_FILE, TARGET, target.params)
        loading.reset_reads()
        loaded = specjax.load_model(tmp, mesh=mesh)
    expected = shard_model(target, mesh)
    assert loaded.config == expected.config
    for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(expected.params), strict=True):
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim), (a.sharding, b.sharding)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    reads = dict(loading.READS)
    # q_proj [H * d_head, D] over model=4: each device read 2 of the 8 heads' rows, never all.
    q = [shape for name, shape in loading.READS if name == "model.layers.0.self_attn.q_proj.weight"]
    assert q and all(shape == (16, 64) for shape in q), q
    # k_proj holds 2 kv heads, replicated to 4: each device read the one head it needs.
    assert reads["model.layers.0.self_attn.k_proj.weight"] == (8, 64), reads["model.layers.0.self_attn.k_proj.weight"]
    assert reads["lm_head.weight"] == (16, 64)
    initialised = specjax.init_model(TARGET, 5, mesh=mesh)
    reference = shard_model(specjax.init_model(TARGET, 5), mesh)
    for a, b in zip(jax.tree.leaves(initialised.params), jax.tree.leaves(reference.params), strict=True):
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-7)
    print(json.dumps({"loading": "ok", "reads": len(loading.READS)}), flush=True)


def check_parallel_drafters(target, draft, mesh, ref_plain) -> None:
    """ParallelDraft (a sharded draft) and a BlockHead (its weights as given, the target
    sharded) on a (2, 4) mesh: greedy output equals unsharded plain greedy."""
    from specjax.models.block_net import init_block_head_params
    from specjax.models.heads import head_config

    st = shard_model(target, mesh)
    layers = (0, 1)
    head = head_config(TARGET, 2, 1, 64).replace(num_hidden_layers=1)
    params = init_block_head_params(head, len(layers), 0, target.params)
    drafters = {
        "parallel_draft": ParallelDraft(shard_model(draft, mesh), DRAFT.vocab_size - 1),
        "block_head": BlockHead(
            params=params, config=head, feature_layers=layers, mask_token_id=TARGET.vocab_size - 1, block_size=K
        ),
    }
    for name, drafter in drafters.items():
        out = specjax.generate(st, PROMPTS, CONFIG, draft=drafter, speculative=SPEC)
        assert out.tokens == ref_plain, (name, out.tokens, ref_plain)
    print(json.dumps({"parallel_drafters": sorted(drafters)}), flush=True)


def run_distributed(process_id: int, port: int) -> None:
    """One of two processes on localhost with 4 CPU devices each: a (2, 4) mesh over both."""
    from specjax.parallel.multihost import initialize

    initialize(f"localhost:{port}", num_processes=2, process_id=process_id, cpu_collectives="gloo")
    assert jax.device_count() == 8 and jax.local_device_count() == 4, (jax.device_count(), jax.local_device_count())
    mesh = make_mesh(data=2, model=4)
    target = shard_model(scaled(TARGET, 0), mesh)
    plain = specjax.generate(target, PROMPTS, CONFIG).tokens
    print(json.dumps({"process": process_id, "tokens": plain}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "meshes":
        run_meshes()
    else:
        run_distributed(int(sys.argv[2]), int(sys.argv[3]))
