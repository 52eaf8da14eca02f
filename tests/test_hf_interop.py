"""Hugging Face interop: checkpoints load into specjax and compute what transformers computes.

Every model is tiny and random, built by transformers itself (or by specjax and read
back by transformers), and compared against transformers' PyTorch forward and greedy
`generate`. Weights are scaled up and biases/norms perturbed away from their zero/one
init, so a wrong layout, a dropped bias or a transposed kernel changes the numbers.
"""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

import specjax
import specjax.io.hf

VOCAB = 61
PROMPTS = [[5, 9, 2], [17, 3, 40, 11, 60, 7]]
MAX_NEW = 12
_SIZES = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "initializer_range": 0.35,
    # No special ids: generation must run its full length on both sides.
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}
HF_CONFIGS = {
    "llama_gqa_bias": lambda: transformers.LlamaConfig(
        **_SIZES, rope_theta=500.0, attention_bias=True, tie_word_embeddings=False
    ),
    "llama_head_dim_mlp_bias": lambda: transformers.LlamaConfig(
        **_SIZES, head_dim=16, mlp_bias=True, tie_word_embeddings=True
    ),
    "qwen2": lambda: transformers.Qwen2Config(**_SIZES, tie_word_embeddings=True),
    "mistral": lambda: transformers.MistralConfig(**_SIZES, sliding_window=None),
    "gpt2": lambda: transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, initializer_range=0.5, bos_token_id=None
    ),
}


def make_hf(config, seed: int = 0):
    """A random transformers model whose biases and norm weights are not at their init."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def save_hf(model, directory, **kwargs):
    model.save_pretrained(directory, **kwargs)  # transformers 5 always writes safetensors
    return directory


def hf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(np.asarray(ids))).logits.float().numpy()


def hf_greedy(model, prompt) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW)
    return out[0, len(prompt) :].tolist()


def random_ids(batch=2, length=12, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, size=(batch, length))


@pytest.fixture(scope="module", params=sorted(HF_CONFIGS))
def hf_pair(request, tmp_path_factory):
    hf = make_hf(HF_CONFIGS[request.param]())
    return hf, specjax.load_model(save_hf(hf, tmp_path_factory.mktemp(request.param)))


def test_logits_match_transformers(hf_pair):
    hf, model = hf_pair
    ids = random_ids()
    np.testing.assert_allclose(specjax.io.model.logits(model, ids), hf_logits(hf, ids), atol=1e-4, rtol=0)


def test_greedy_matches_transformers_generate(hf_pair):
    hf, model = hf_pair
    out = specjax.generate(model, PROMPTS, specjax.GenerationConfig(max_new_tokens=MAX_NEW))
    for prompt, tokens in zip(PROMPTS, out.tokens, strict=True):
        expected = hf_greedy(hf, prompt)
        assert len(set(expected)) >= 4, f"degenerate reference {expected}: the test would prove little"
        assert tokens == expected


def test_loaded_config_maps_hf_fields(hf_pair):
    hf, model = hf_pair
    cfg, hf_cfg = model.config, hf.config
    assert cfg.model_type == hf_cfg.model_type
    assert cfg.vocab_size == VOCAB and cfg.num_hidden_layers == 2 and cfg.dtype == "float32"
    assert cfg.tie_word_embeddings == hf_cfg.tie_word_embeddings
    assert model.tokenizer is None  # the directory has no tokenizer files
    assert model.num_parameters == cfg.num_parameters == sum(p.numel() for p in hf.parameters())


def _randomized(config: specjax.ModelConfig, seed: int = 0) -> specjax.Model:
    """init_model with scaled kernels and perturbed biases/norms (zeros and ones test nothing)."""
    model = specjax.init_model(config, seed)
    leaves, treedef = jax.tree.flatten(model.params)
    rng = np.random.default_rng(seed)
    moved = [x * 10 if x.ndim > 1 else x + 0.1 * rng.standard_normal(x.shape).astype(np.float32) for x in leaves]
    return specjax.Model(config, jax.tree.unflatten(treedef, moved))


_BASE = specjax.ModelConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
SPECJAX_CONFIGS = {
    "llama_all_biases": _BASE.replace(
        tie_word_embeddings=False, attention_bias=True, o_proj_bias=True, mlp_bias=True, rope_theta=500.0
    ),
    "qwen2": _BASE.replace(model_type="qwen2", attention_bias=True),
    "mistral_head_dim": _BASE.replace(model_type="mistral", head_dim=16, tie_word_embeddings=False),
    "gpt2": _BASE.replace(model_type="gpt2", num_key_value_heads=4, intermediate_size=128, rms_norm_eps=1e-5),
}


@pytest.mark.parametrize("name", sorted(SPECJAX_CONFIGS))
def test_save_model_round_trips_through_transformers(name, tmp_path):
    model = _randomized(SPECJAX_CONFIGS[name])
    out = specjax.save_model(model, tmp_path)
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == model.config.model_type and len(written["architectures"]) == 1

    ids = random_ids()
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    np.testing.assert_allclose(hf_logits(hf, ids), specjax.io.model.logits(model, ids), atol=1e-4, rtol=0)

    loaded = specjax.load_model(out)
    assert loaded.config == model.config
    assert jax.tree.structure(loaded.params) == jax.tree.structure(model.params)
    for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(model.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_llama_with_qkv_bias_only_saves_a_zero_o_proj_bias(tmp_path):
    """HF Llama's attention_bias covers q, k, v and o; the missing o bias is written as zeros."""
    model = _randomized(_BASE.replace(attention_bias=True))
    out = specjax.save_model(model, tmp_path)
    ids = random_ids()
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    np.testing.assert_allclose(hf_logits(hf, ids), specjax.io.model.logits(model, ids), atol=1e-4, rtol=0)
    loaded = specjax.load_model(out)
    assert loaded.config == model.config.replace(o_proj_bias=True)
    assert not np.asarray(loaded.params["layers"][0]["attn"]["o_bias"]).any()


def test_sharded_checkpoint_loads(tmp_path):
    hf = make_hf(HF_CONFIGS["llama_gqa_bias"]())
    save_hf(hf, tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and not (tmp_path / "model.safetensors").exists()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    ids = random_ids()
    np.testing.assert_allclose(
        specjax.io.model.logits(specjax.load_model(tmp_path), ids), hf_logits(hf, ids), atol=1e-4
    )


def test_bfloat16_load_is_close_to_float32(tmp_path):
    hf = make_hf(HF_CONFIGS["llama_gqa_bias"]())
    save_hf(hf, tmp_path)
    fp32, bf16 = specjax.load_model(tmp_path), specjax.load_model(tmp_path, dtype="bfloat16")
    assert bf16.config == fp32.config.replace(dtype="bfloat16")
    assert all(x.dtype == jax.numpy.bfloat16 for x in jax.tree.leaves(bf16.params))
    ids = random_ids()
    full, low = specjax.io.model.logits(fp32, ids), specjax.io.model.logits(bf16, ids)
    assert low.dtype == np.float32
    # transformers' own bfloat16 copy of this model is off by ~4% of the largest logit too.
    assert np.abs(low - full).max() < 0.1 * np.abs(full).max()
    assert (low.argmax(-1) == full.argmax(-1)).mean() > 0.8

    out = specjax.save_model(bf16, tmp_path / "bf16")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    again = specjax.load_model(out, dtype="bfloat16")
    for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(bf16.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


@pytest.fixture(scope="module")
def hf_target_dir(tmp_path_factory):
    return save_hf(make_hf(HF_CONFIGS["llama_gqa_bias"]()), tmp_path_factory.mktemp("target"))


@pytest.mark.parametrize("draft_config", ["llama_small", "gpt2"])
def test_speculative_greedy_with_hf_models_equals_target_greedy(hf_target_dir, draft_config, tmp_path):
    if draft_config == "llama_small":
        config = transformers.LlamaConfig(
            **{**_SIZES, "hidden_size": 16, "num_hidden_layers": 1, "intermediate_size": 32}
        )
    else:  # a draft of another family: the engine only sees forward() and the cache
        config = HF_CONFIGS["gpt2"]()
    target = specjax.load_model(hf_target_dir)
    draft = specjax.load_model(save_hf(make_hf(config, seed=1), tmp_path))
    plain = specjax.generate(target, PROMPTS, specjax.GenerationConfig(max_new_tokens=MAX_NEW))
    spec = specjax.generate(
        target,
        PROMPTS,
        specjax.GenerationConfig(max_new_tokens=MAX_NEW),
        draft=draft,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=3),
    )
    assert spec.tokens == plain.tokens


# --- errors: each names the problem -------------------------------------------------


@pytest.fixture
def llama_dir(hf_target_dir, tmp_path):
    """A private copy of a valid checkpoint, for a test to break."""
    return shutil.copytree(hf_target_dir, tmp_path / "model")


def _edit_config(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _edit_tensors(directory, edit):
    path = directory / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_unsupported_architecture(llama_dir):
    _edit_config(llama_dir, architectures=["FalconForCausalLM"], model_type="falcon")
    with pytest.raises(ValueError, match=r"unsupported architecture 'FalconForCausalLM'.*LlamaForCausalLM"):
        specjax.load_model(llama_dir)


def test_missing_weight(llama_dir):
    _edit_tensors(llama_dir, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing weight 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        specjax.load_model(llama_dir)


def test_shape_mismatch(llama_dir):
    _edit_tensors(llama_dir, lambda t: t.update({"model.norm.weight": np.ones(31, np.float32)}))
    with pytest.raises(ValueError, match=r"shape mismatch for weight 'model\.norm\.weight'.*\(32,\).*\(31,\)"):
        specjax.load_model(llama_dir)


def test_unexpected_weight_is_an_error_and_harmless_buffers_are_not(llama_dir):
    extra = {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32)}
    _edit_tensors(llama_dir, lambda t: t.update(extra))
    specjax.load_model(llama_dir)
    _edit_tensors(llama_dir, lambda t: t.update({"model.layers.0.adapter.weight": np.ones(3, np.float32)}))
    with pytest.raises(ValueError, match=r"unexpected weights.*'model\.layers\.0\.adapter\.weight'"):
        specjax.load_model(llama_dir)


def test_corrupt_safetensors(llama_dir):
    path = llama_dir / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"cannot read .*model\.safetensors.*corrupt or truncated"):
        specjax.load_model(llama_dir)


def test_missing_directory_config_and_weights(tmp_path):
    with pytest.raises(ValueError, match=r"neither a model directory nor an embedded model name"):
        specjax.load_model(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"no config\.json"):
        specjax.load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(HF_CONFIGS["mistral"]().to_dict()))
    with pytest.raises(ValueError, match=r"no weights in .*model\.safetensors"):
        specjax.load_model(tmp_path)


def test_mistral_sliding_window_that_binds_is_honoured(tmp_path):
    """A window below max_position_embeddings masks keys more than 16 positions back (once
    refused; tests/test_families.py checks windows in generation too)."""
    hf = make_hf(transformers.MistralConfig(**_SIZES, sliding_window=16))
    model = specjax.load_model(save_hf(hf, tmp_path))
    assert model.config.sliding_window == 16
    ids = random_ids(length=40)
    np.testing.assert_allclose(specjax.io.model.logits(model, ids), hf_logits(hf, ids), atol=1e-4, rtol=0)
    unwindowed = specjax.Model(model.config.replace(sliding_window=None), model.params)
    assert np.abs(specjax.io.model.logits(unwindowed, ids)[:, 16:] - hf_logits(hf, ids)[:, 16:]).max() > 1e-2


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, r"rope scaling 'longrope'"),
        ({"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported"),
        ({"num_hidden_layers": 3}, r"missing weight 'model\.layers\.2\."),
    ],
)
def test_config_the_model_cannot_honor(llama_dir, changes, message):
    _edit_config(llama_dir, **changes)
    with pytest.raises(ValueError, match=message):
        specjax.load_model(llama_dir)


def test_embedded_names_resolve_and_unknown_names_list_them(hf_target_dir, monkeypatch):
    monkeypatch.setattr(specjax.io.hf, "embedded_path", lambda name: hf_target_dir if name == "tiny" else None)
    monkeypatch.setattr(specjax.io.hf, "embedded_names", lambda: ["tiny"])
    assert specjax.load_model("tiny").config.model_type == "llama"
    with pytest.raises(ValueError, match=r"'not-a-model'.*embedded models: tiny"):
        specjax.load_model("not-a-model")


def test_model_type_is_validated():
    with pytest.raises(ValueError, match=r"model_type must be one of llama, qwen2, mistral, phi3, qwen3, .*, gpt2"):
        specjax.ModelConfig(model_type="falcon")
    with pytest.raises(ValueError, match=r"num_key_value_heads must equal num_attention_heads"):
        specjax.ModelConfig(model_type="gpt2")


def test_logits_refuse_positions_past_the_learned_table():
    model = specjax.init_model(SPECJAX_CONFIGS["gpt2"])
    with pytest.raises(ValueError, match=r"65 tokens exceed max_position_embeddings \(64\)"):
        specjax.io.model.logits(model, np.zeros((1, 65), np.int32))
