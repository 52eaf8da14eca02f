"""Block heads in the layouts engines load (drafters/formats/block_published.py,
docs/head_formats_block.md): z-lab's DFlash layout and speculators' `dflash`.

A block head with Qwen3 layers is the published DFlash network: written and read back it
is the same head (params bit for bit, the same sampled generation), and a numpy DFlash
forward built from the written files alone, as the engines read them (z-lab dflash/model.py),
gives the head's block logits. Heads whose network is another (specjax's trained heads with
Llama layers, DSpark, DFlash 2, a head reading the target's last block) are refused with what
differs; the config keys are those vLLM and SGLang read.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TARGET_CONFIG
from safetensors.numpy import load_file
from specjax.models import BlockMask, full_forward, init_cache
from specjax.models.block_net import block_head_forward, init_block_head_params
from specjax.models.dflash2_net import init_dflash2_extras
from specjax.models.dspark_net import init_dspark_extras
from specjax.models.heads import head_config

import specjax
from specjax.core.sampling import SamplingConfig
from specjax.drafters import BlockHead, DFlash2, DraftContext, DSpark
from specjax.drafters.formats.writers import write_published

MASK, K, LAYERS = TARGET_CONFIG.vocab_size - 1, 3, (0,)  # block 1 is the tiny target's last
PROMPTS = [[5, 9, 11, 3, 7], [2, 8]]
_forward = jax.jit(full_forward, static_argnums=(0, 3))  # (config, params, tokens, feature layers)


def _head(target, model_type: str = "qwen3", seed: int = 0, **fields) -> BlockHead:
    """A random two-layer head, matrices scaled up and norms perturbed so a mixed-up tensor shows."""
    config = head_config(target.config, 4, 2, 64).replace(num_hidden_layers=2, model_type=model_type)
    fields = {"feature_layers": LAYERS, "mask_token_id": MASK, "block_size": K, **fields}
    params = init_block_head_params(config, len(fields["feature_layers"]), seed, target.params)
    keys = iter(jax.random.split(jax.random.key(seed + 7), len(jax.tree.leaves(params))))

    def scaled(x):
        return 4.0 * x if x.ndim > 1 else x + 0.3 * jax.random.normal(next(keys), x.shape, x.dtype)

    return BlockHead(params=jax.tree.map(scaled, params), config=config, **fields)


@pytest.fixture(scope="module")
def head(target):
    return _head(target)


@pytest.fixture(scope="module")
def written(head, target, tmp_path_factory):
    """{format: (directory, the head read back)} for both layouts."""
    root = tmp_path_factory.mktemp("block_formats")
    out = {}
    for format in ("dflash", "speculators"):
        directory = specjax.save_drafter(head, root / format, "tiny", target, format=format)
        out[format] = directory, specjax.load_drafter(directory, target)
    return out


@pytest.mark.parametrize("format", ["dflash", "speculators"])
def test_a_round_trip_is_the_same_head(head, written, format):
    _, again = written[format]
    assert type(again) is BlockHead and again == head.without_weights()
    assert jax.tree.structure(again.params) == jax.tree.structure(head.params)
    for x, y in zip(jax.tree.leaves(head.params), jax.tree.leaves(again.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@functools.partial(jax.jit, static_argnums=(0, 3))
def _proposal(drafter, params, target_params, length: int, tokens, features, key):
    """One round's sampled (T = 1) proposal after a prefill of tokens[:, :length]: (tokens [B, K], q [B, K, V])."""
    b = tokens.shape[0]
    lengths = jnp.full((b,), length, jnp.int32)
    ctx = DraftContext(
        tokens=tokens,
        lengths=lengths,
        prompt_lengths=lengths,
        done=jnp.zeros((b,), bool),
        target_params=target_params,
        target=TARGET_CONFIG,
        num_speculative_tokens=K,
        sampling=SamplingConfig(temperature=1.0),
        features=features,
    )
    state = drafter.init(params, ctx, tokens[:, :length], tokens.shape[1])
    proposal, _ = drafter.propose(params, state, ctx.replace(features=None), key)
    return proposal.tokens, proposal.q


def test_the_read_head_proposes_what_the_written_one_did(head, written, target):
    tokens = jnp.asarray([PROMPTS[0] + [0] * 11, [4, 4, 9, 1, 2] + [0] * 11], jnp.int32)  # [2, 16]
    _, features = _forward(target.config, target.params, tokens[:, :5], LAYERS)
    heads = [head, *(again for _, again in written.values()), _head(target, seed=1)]
    key = jax.random.key(5)
    out = [_proposal(h, h.params, target.params, 5, tokens, features, key) for h in heads]
    for drafts, q in out[1:3]:
        np.testing.assert_array_equal(np.asarray(drafts), np.asarray(out[0][0]))
        np.testing.assert_array_equal(np.asarray(q), np.asarray(out[0][1]))
    assert np.abs(np.asarray(out[3][1]) - np.asarray(out[0][1])).max() > 1e-2  # another head proposes otherwise


def test_config_keys_as_engines_read_them(written, target):
    zlab = json.loads((written["dflash"][0] / "config.json").read_text())
    assert zlab["architectures"] == ["DFlashDraftModel"] and zlab["model_type"] == "qwen3"
    assert zlab["block_size"] == K + 1  # the engines' block counts the anchor
    assert zlab["dflash_config"] == {"mask_token_id": MASK, "target_layer_ids": list(LAYERS)}
    assert zlab["num_target_layers"] == TARGET_CONFIG.num_hidden_layers and zlab["num_hidden_layers"] == 2
    assert zlab["layer_types"] == ["full_attention"] * 2 and zlab["torch_dtype"] == "float32"
    spec = json.loads((written["speculators"][0] / "config.json").read_text())
    assert spec["speculators_model_type"] == "dflash" and spec["sample_from_anchor"] is False
    assert (spec["block_size"], spec["mask_token_id"], spec["draft_vocab_size"]) == (K + 1, MASK, 48)
    assert spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == K
    assert spec["speculators_config"]["verifier"]["name_or_path"] == "tiny"
    assert spec["transformer_layer_config"]["model_type"] == "qwen3"
    # vLLM's update_dflash: eagle_aux_hidden_state_layer_ids = the ids, dflash_config.target_layer_ids
    # = ids - 1, the z-lab ids (the output of target layer i): both layouts name the same blocks.
    assert [i - 1 for i in spec["aux_hidden_state_layer_ids"]] == zlab["dflash_config"]["target_layer_ids"]
    zlab_tensors = load_file(str(written["dflash"][0] / "model.safetensors"))
    spec_tensors = load_file(str(written["speculators"][0] / "model.safetensors"))
    assert set(spec_tensors) - set(zlab_tensors) == {"embed_tokens.weight", "lm_head.weight"}
    assert zlab_tensors["fc.weight"].shape == (32, 32) and zlab_tensors["layers.1.self_attn.k_norm.weight"].shape == (
        8,
    )
    np.testing.assert_array_equal(spec_tensors["lm_head.weight"], np.asarray(target.params["lm_head"]).T)


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, positions, theta):  # x [T, heads, hd]: transformers' rotate_half layout
    hd = x.shape[-1]
    angles = positions[:, None] * theta ** (-np.arange(0, hd, 2) / hd)[None]  # [T, hd/2]
    cos, sin = np.cos(np.concatenate([angles] * 2, -1))[:, None], np.sin(np.concatenate([angles] * 2, -1))[:, None]
    return x * cos + np.concatenate([-x[..., hd // 2 :], x[..., : hd // 2]], -1) * sin


def _dflash_reference(directory, target, tokens):
    """z-lab's DFlashDraftModel forward (dflash/model.py) in numpy from the files alone: the
    block [anchor, MASK x K] at the end of `tokens` reads the context before it. -> [K, V]."""
    c = json.loads((directory / "config.json").read_text())
    w = {k: v.astype(np.float64) for k, v in load_file(str(directory / "model.safetensors")).items()}
    eps, hd, n = c["rms_norm_eps"], c["head_dim"], len(tokens)
    _, feats = _forward(
        target.config, target.params, jnp.asarray([tokens]), features=tuple(c["dflash_config"]["target_layer_ids"])
    )
    ctx = _rms(np.asarray(feats[0, : n - 1], np.float64) @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    block = [tokens[-1]] + [c["dflash_config"]["mask_token_id"]] * (c["block_size"] - 1)
    x = np.asarray(target.params["embed"], np.float64)[block]
    positions = np.arange(n - 1 + len(block), dtype=np.float64)
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}.self_attn"
        h = _rms(x, w[f"layers.{i}.input_layernorm.weight"], eps)
        q = _rms((h @ w[f"{p}.q_proj.weight"].T).reshape(len(block), -1, hd), w[f"{p}.q_norm.weight"], eps)
        both = np.concatenate([ctx, h])
        k = _rms((both @ w[f"{p}.k_proj.weight"].T).reshape(len(both), -1, hd), w[f"{p}.k_norm.weight"], eps)
        v = (both @ w[f"{p}.v_proj.weight"].T).reshape(len(both), -1, hd)
        q, k = _rope(q, positions[n - 1 :], c["rope_theta"]), _rope(k, positions, c["rope_theta"])
        group = q.shape[1] // k.shape[1]
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)  # no mask: non-causal over all of it
        attn = np.exp(scores - scores.max(-1, keepdims=True))
        out = np.einsum("hqk,khd->qhd", attn / attn.sum(-1, keepdims=True), v).reshape(len(block), -1)
        x = x + out @ w[f"{p}.o_proj.weight"].T
        h = _rms(x, w[f"layers.{i}.post_attention_layernorm.weight"], eps)
        gate, up = h @ w[f"layers.{i}.mlp.gate_proj.weight"].T, h @ w[f"layers.{i}.mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[f"layers.{i}.mlp.down_proj.weight"].T
    return (_rms(x, w["norm.weight"], eps) @ np.asarray(target.params["lm_head"], np.float64))[1:]


def test_the_files_compute_the_heads_block_logits(head, written, target):
    tokens = PROMPTS[0]
    n = len(tokens)
    _, feats = _forward(target.config, target.params, jnp.asarray([tokens]), features=LAYERS)
    cache = init_cache(head.config, 1, 16)
    cache = cache.replace(lengths=jnp.asarray([n - 1]))
    block = jnp.arange(n - 1, n + K)[None]  # positions L-1 .. L-1+K
    ids = jnp.asarray([[tokens[-1]] + [MASK] * K])
    mask = BlockMask(start=jnp.asarray([n - 1]), slots=block, width=K + 1, mode="bidirectional")
    context = jnp.arange(n - 1)[None]
    mine, _ = jax.jit(block_head_forward, static_argnums=0)(
        head.config, head.params, target.params, feats[:, : n - 1], context, ids, block, cache, mask
    )
    reference = _dflash_reference(written["dflash"][0], target, tokens)
    np.testing.assert_allclose(np.asarray(mine[0, 1:]), reference, rtol=2e-4, atol=2e-4)


def test_other_networks_are_refused_with_what_differs(target, tmp_path):
    trained = _head(target, model_type="llama")  # what `specjax train-head` builds
    with pytest.raises(ValueError, match=r"cannot be saved as DFlash.*without the per-head q/k RMSNorm"):
        specjax.save_drafter(trained, tmp_path / "a", "tiny", target, format="dflash")
    last = _head(target, feature_layers=(0, 1))
    with pytest.raises(ValueError, match=r"reads block 1, the target's last"):
        specjax.save_drafter(last, tmp_path / "b", "tiny", target, format="speculators")
    own = _head(target)
    own = dataclasses.replace(own, params={**own.params, "lm_head": jnp.ones((32, 48))})
    with pytest.raises(ValueError, match=r"own LM head.*format='speculators'"):
        specjax.save_drafter(own, tmp_path / "c", "tiny", target, format="dflash")
    mine = _head(target)
    plain = {f.name: getattr(mine, f.name) for f in dataclasses.fields(BlockHead)}
    for kind, extras, reason in [
        (DSpark, init_dspark_extras(mine.config, 4), "logit bias W2 · W1"),
        (DFlash2, init_dflash2_extras(mine.config, 4, 2), "convolves inside every layer"),
    ]:
        other = kind(**{**plain, "params": {**mine.params, **extras}})
        with pytest.raises(ValueError, match=rf"{other.name} head cannot be saved as DFlash.*{reason}"):
            write_published(other, tmp_path / "d", "speculators", "tiny", target)
    assert not any((tmp_path / name).exists() for name in "abcd")  # nothing half-written


def test_unsupported_published_variants_are_refused(written, target, tmp_path):
    directory = written["speculators"][0]
    config = json.loads((directory / "config.json").read_text())
    for change, message in [
        ({"sample_from_anchor": True}, "sample_from_anchor=true"),
        ({"speculators_model_type": "dspark"}, "speculators' DSpark"),
    ]:
        copy = tmp_path / message.split()[0].strip("'=")
        copy.mkdir()
        (copy / "model.safetensors").write_bytes((directory / "model.safetensors").read_bytes())
        (copy / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(ValueError, match=message):
            specjax.load_drafter(copy, target)


def test_a_head_trained_with_qwen3_layers_saves_loads_and_exports(target, tmp_path):
    """train-head's `block.layer_type: qwen3` builds the layers the DFlash engines serve: with
    layer_init target they are the target's own plus fresh q/k norms; the head keeps its
    layer type through specjax's own files and exports as DFlash, where a Llama-layer head is refused."""
    from specjax.training.block_objective import BlockHeadConfig, block_head_parts, init_block_params

    def start(layer_type):
        block = BlockHeadConfig(layer_type=layer_type, layer_init="target", feature_layers=(0,), block_size=3,
                                mask_token_id=0)  # fmt: skip
        head, layers, _, as_head = block_head_parts(block, target)
        return as_head(init_block_params(head, block, target.config, target.params, layers, seed=0))

    qwen3 = start("qwen3")
    attn, copied = qwen3.params["layers"][0]["attn"], target.params["layers"][0]["attn"]
    np.testing.assert_array_equal(attn["q_proj"], copied["q_proj"])
    np.testing.assert_array_equal(attn["q_norm"]["scale"], np.ones(8))
    specjax.save_drafter(qwen3, tmp_path / "own", "tiny", target)
    loaded = specjax.load_drafter(str(tmp_path / "own"), target)
    assert loaded.config.model_type == "qwen3"
    specjax.save_drafter(loaded, tmp_path / "dflash", "tiny", target, format="dflash")
    assert json.loads((tmp_path / "dflash" / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]
    with pytest.raises(ValueError, match="q/k RMSNorm"):
        specjax.save_drafter(start("llama"), tmp_path / "llama", "tiny", target, format="dflash")
    with pytest.raises(ValueError, match=r"block\.layer_type must be one of llama, qwen3"):
        BlockHeadConfig(layer_type="mistral")
