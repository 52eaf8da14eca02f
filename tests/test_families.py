"""The model families researchers pair, against transformers: Llama 3.x rotary variants,
Qwen3, Phi-3, Gemma 2/3 (sliding window, soft-capping), Mixtral and Qwen3-MoE.

Every model is tiny and random, built and saved by transformers itself; weights are scaled
up and norms perturbed (make_hf) so a wrong layout or a missed option changes the numbers.
Each variant is checked four ways: logits of a ragged batch (full and blockwise attention),
greedy generation token for token, speculative greedy with a same-family draft, and a
save_model round trip that transformers loads. Windowed variants have prompts longer
than their window.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from conftest import noisy_copy
from flax import nnx
from specjax.models import forward, init_cache
from specjax.models.attention import TreeMask, attend
from specjax.models.moe import MoE
from test_hf_interop import _SIZES, VOCAB, _randomized, hf_logits, make_hf, save_hf

import specjax

WINDOW = 6
# Ragged prompts, the longest well past every window below.
PROMPTS = [[5, 9, 2], [17, 3, 40, 11, 60, 7, 1, 22, 35, 8, 14, 50, 2, 9, 33, 41, 6, 12, 27, 30], [8, 1, 59, 4, 33, 7]]
MAX_NEW = 10
RELATIVE = 1e-4  # logits: max |specjax - transformers| <= RELATIVE * max |transformers|

_QWEN3 = {**_SIZES, "head_dim": 16}  # explicit head_dim != hidden / heads
# Untied: with Gemma's sqrt(hidden) embedding scale, a tiny random tied model only repeats
# its input token (the tied case is covered by qwen3 and gemma2_no_window below).
_GEMMA = {**_SIZES, "head_dim": 8, "sliding_window": WINDOW, "query_pre_attn_scalar": 12, "tie_word_embeddings": False}
HF_CONFIGS = {
    # Rotary variants on Llama, parameters chosen so that every branch of each formula is taken
    # (llama3: wavelengths below, inside and above the smoothing band).
    "llama3": lambda: transformers.LlamaConfig(
        **_SIZES,
        rope_parameters={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
            "rope_theta": 500.0,
        },
    ),
    "llama_yarn": lambda: transformers.LlamaConfig(
        **_SIZES,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 1e4},
    ),
    "llama_linear": lambda: transformers.LlamaConfig(
        **_SIZES, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
    ),
    "llama_dynamic": lambda: transformers.LlamaConfig(
        **_SIZES, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}
    ),
    "qwen3": lambda: transformers.Qwen3Config(**_QWEN3, tie_word_embeddings=True),
    # Qwen's per-layer window: layers >= max_window_layers slide.
    "qwen3_window": lambda: transformers.Qwen3Config(
        **_QWEN3, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1
    ),
    "phi3": lambda: transformers.Phi3Config(**_SIZES),
    "mistral_window": lambda: transformers.MistralConfig(**_SIZES, sliding_window=WINDOW),
    # Small caps so that soft-capping changes the numbers.
    "gemma2": lambda: transformers.Gemma2Config(**_GEMMA, attn_logit_softcapping=3.0, final_logit_softcapping=5.0),
    # Local layers on their own rotary base, global layers with linear scaling.
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **_GEMMA,
        sliding_window_pattern=2,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
        },
    ),
    "mixtral": lambda: transformers.MixtralConfig(**_SIZES, num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
        **_QWEN3, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=False
    ),
}
WINDOWED = ("qwen3_window", "mistral_window", "gemma2", "gemma3")
# Seeds whose tiny random models generate varied text from every prompt.
SEEDS = {"qwen3": 1, "qwen3_window": 1}


def _padded(prompts):
    """Right-padded tokens [B, T] and positions for a ragged batch."""
    width = max(map(len, prompts))
    tokens = np.zeros((len(prompts), width), np.int32)
    for row, prompt in enumerate(prompts):
        tokens[row, : len(prompt)] = prompt
    return jnp.asarray(tokens), jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), tokens.shape)


def _relative_error(got, want) -> float:
    return float(np.abs(np.asarray(got) - want).max() / np.abs(want).max())


def hf_greedy(model, prompt, max_new=MAX_NEW) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new)
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module", params=sorted(HF_CONFIGS))
def family(request, tmp_path_factory):
    """(name, transformers model, the specjax model loaded from its checkpoint)."""
    hf = make_hf(HF_CONFIGS[request.param](), seed=SEEDS.get(request.param, 0))
    return request.param, hf, specjax.load_model(save_hf(hf, tmp_path_factory.mktemp(request.param)))


def test_ragged_logits_match_transformers(family):
    name, hf, model = family
    tokens, positions = _padded(PROMPTS)
    width = tokens.shape[1]
    step = jax.jit(forward, static_argnums=0)
    caches = [init_cache(model.config, 3, width)]  # one block: full attention
    if name in WINDOWED:  # blocks of 8 slots: the online softmax, blocks below the window skipped
        caches.append(init_cache(model.config, 3, 40, block_size=8))
    for cache in caches:
        logits, _ = step(model.config, model.params, tokens, positions, cache)
        for row, prompt in enumerate(PROMPTS):
            want = hf_logits(hf, [prompt])[0]
            error = _relative_error(logits[row, : len(prompt)], want)
            assert error < RELATIVE, f"{name} row {row}: relative error {error:.2e}"


def test_greedy_matches_transformers_generate(family):
    name, hf, model = family
    expected = [hf_greedy(hf, prompt) for prompt in PROMPTS]
    assert all(len(set(e)) >= 3 for e in expected), f"degenerate reference {expected}: the test would prove little"
    assert specjax.generate(model, PROMPTS, specjax.GenerationConfig(max_new_tokens=MAX_NEW)).tokens == expected
    if name in ("gemma2", "gemma3"):  # the blockwise path and chunked prefill, under the window
        blocks = specjax.CacheConfig(block_size=4, prefill_chunk=8)
        assert (
            specjax.generate(model, PROMPTS, specjax.GenerationConfig(max_new_tokens=MAX_NEW, cache=blocks)).tokens
            == expected
        )


# Rotary frequencies are constants of the program: llama3 and yarn stand for linear and dynamic.
@pytest.mark.parametrize("family", sorted(set(HF_CONFIGS) - {"llama_linear", "llama_dynamic"}), indirect=True)
def test_speculative_greedy_with_same_family_draft_equals_greedy(family):
    _, _, model = family
    draft = noisy_copy(model, noise=0.3, seed=1)
    plain = specjax.generate(model, PROMPTS, specjax.GenerationConfig(max_new_tokens=MAX_NEW))
    spec = specjax.generate(
        model,
        PROMPTS,
        specjax.GenerationConfig(max_new_tokens=MAX_NEW),
        draft=draft,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=3),
    )
    assert spec.tokens == plain.tokens
    assert 0 < spec.stats.acceptance_rate < 1, "the draft should be close but not exact"


def test_save_model_round_trips_through_transformers(family, tmp_path):
    _, hf, model = family
    out = specjax.save_model(model, tmp_path)
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == hf.config.model_type
    assert written["architectures"] == [type(hf).__name__]
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reloaded) is type(hf)
    ids = np.asarray(PROMPTS[1])[None]
    np.testing.assert_allclose(hf_logits(reloaded, ids), hf_logits(hf, ids), atol=1e-6, rtol=0)
    again = specjax.load_model(out)
    assert again.config == model.config
    for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(model.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert model.num_parameters == sum(p.numel() for p in hf.parameters())


# --- sliding window in the attention itself -------------------------------------------


def _rand(shape, seed):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


@pytest.mark.parametrize("block", [3, 8, 100])
def test_windowed_blockwise_attention_equals_a_masked_reference(block):
    """Random q/k/v at ragged positions; a direct softmax over the last `window` positions."""
    b, s, h, n_kv, hd, width, window = 3, 40, 4, 2, 8, 5, 7
    cache = init_cache(specjax.ModelConfig(num_key_value_heads=n_kv, head_dim=hd), b, s, block_size=block)
    cache = cache.replace(k=_rand(cache.k.shape, 1), v=_rand(cache.v.shape, 2))
    starts = np.array([0, 13, s - width])
    positions = jnp.asarray(starts[:, None] + np.arange(width), jnp.int32)
    q, k, v = _rand((b, width, h, hd), 3), _rand((b, width, n_kv, hd), 4), _rand((b, width, n_kv, hd), 5)
    out, cache = jax.jit(attend, static_argnums=5, static_argnames=("window", "softcap"))(
        q, k, v, positions, cache, 0, window=window, softcap=2.0
    )
    keys, values = np.asarray(cache.k[0]), np.asarray(cache.v[0])
    for row in range(b):
        for t in range(width):
            p = int(positions[row, t])
            seen = np.arange(max(0, p - window + 1), p + 1)
            for head in range(h):
                g = head // (h // n_kv)
                scores = keys[row, seen, g] @ np.asarray(q[row, t, head]) / np.sqrt(hd)
                scores = 2.0 * np.tanh(scores / 2.0)
                weights = np.exp(scores - scores.max())
                want = (weights / weights.sum()) @ values[row, seen, g]
                np.testing.assert_allclose(np.asarray(out[row, t, head]), want, atol=1e-5, rtol=1e-5)


def test_a_tree_wider_than_the_window_is_refused():
    cache = init_cache(specjax.ModelConfig(), 1, 16)
    q = jnp.zeros((1, 3, 4, 16))
    kv = jnp.zeros((1, 3, 2, 16))
    positions = jnp.asarray([[4, 5, 5]], jnp.int32)
    tree = TreeMask(start=jnp.asarray([4]), slots=jnp.asarray([[4, 5, 6]]), visible=jnp.tril(jnp.ones((3, 3), bool)))
    jit_attend = jax.jit(attend, static_argnums=5, static_argnames=("window",))  # one compile, not op by op
    with pytest.raises(ValueError, match=r"token tree of 3 slots is wider than the sliding window \(2\)"):
        jit_attend(q, kv, kv, positions, cache, 0, tree, window=2)
    jit_attend(q, kv, kv, positions, cache, 0, tree, window=3)


@pytest.mark.parametrize("family", ["gemma2"], indirect=True)
def test_tree_speculation_with_a_windowed_target_equals_greedy(family):
    """Tree verification (TreeMask) under a sliding window: committed slots by position,
    tree slots as ancestors; with blocks of 4 slots too."""
    _, _, model = family
    draft = noisy_copy(model, noise=0.3, seed=1)
    tree = specjax.Tree.from_paths([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)])  # 6 slots <= WINDOW
    plain = specjax.generate(model, PROMPTS, specjax.GenerationConfig(max_new_tokens=MAX_NEW)).tokens
    for cache_config in (None, specjax.CacheConfig(block_size=4)):
        out = specjax.generate(
            model,
            PROMPTS,
            specjax.GenerationConfig(max_new_tokens=MAX_NEW, cache=cache_config),
            draft=draft,
            speculative=specjax.SpeculativeConfig(tree=tree),
        )
        assert out.tokens == plain


# --- MoE routing ---------------------------------------------------------------------


def _hf_routing(router, x) -> tuple[np.ndarray, np.ndarray]:
    """transformers' router on x [N, D] -> (probabilities [N, E], dense mixing weights [N, E])."""
    with torch.no_grad():
        logits, scores, experts = router(torch.tensor(np.asarray(x)))
        probs = torch.softmax(logits.float(), dim=-1)
    dense = torch.zeros(probs.shape).scatter(1, experts, scores.float())
    return probs.numpy(), dense.numpy()


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe_norm", "qwen3_moe"])
def test_router_top_k_weights_and_ties_match_transformers(name):
    """Rows without a tie at the k-th place: the same dense weights. Rows with one (expert 2
    and its copy 5; all experts equal): exactly k experts and the same weights, but which of
    the tied experts gets picked is torch.topk's unspecified order (it varies with E, k and
    device); specjax picks the lowest indices."""
    e, k, d = 8, 3, 16
    sizes = {**_SIZES, "hidden_size": d}
    if name == "mixtral":
        hf_config = transformers.MixtralConfig(**sizes, num_local_experts=e, num_experts_per_tok=k)
        router = transformers.models.mixtral.modeling_mixtral.MixtralTopKRouter(hf_config)
    else:
        norm = name.endswith("norm")
        hf_config = transformers.Qwen3MoeConfig(**sizes, num_experts=e, num_experts_per_tok=k, norm_topk_prob=norm)
        router = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeTopKRouter(hf_config)
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(e, d)).astype(np.float32)
    weight[5] = weight[2]  # experts 2 and 5 always tie: inside the top k, at its edge or below
    with torch.no_grad():
        router.weight.copy_(torch.tensor(weight))
    x = rng.normal(size=(64, d)).astype(np.float32)
    x[:2] = 0.0  # every probability equal
    config = specjax.ModelConfig(
        hidden_size=d,
        num_attention_heads=2,
        num_key_value_heads=2,
        model_type="mixtral" if name == "mixtral" else "qwen3_moe",
        num_experts=e,
        num_experts_per_tok=k,
        norm_topk_prob=getattr(hf_config, "norm_topk_prob", True),
    )
    moe = MoE(config, jnp.float32, rngs=nnx.Rngs(0))
    moe.router[...] = jnp.asarray(weight.T)
    ours = np.asarray(moe.routing(jnp.asarray(x)[None]))[0]
    probs, theirs = _hf_routing(router, x)
    edge_ties = 0
    # float32 softmax from two libraries' exp: a few ulps apart (1.006e-6 relative seen on
    # a 0.0083 weight), so 4e-6, far below any difference a wrong expert or norm would make.
    rtol = 4e-6
    for row in range(x.shape[0]):
        ranked = np.sort(probs[row])[::-1]
        assert (ours[row] > 0).sum() == k
        np.testing.assert_allclose(np.sort(ours[row]), np.sort(theirs[row]), rtol=rtol, err_msg=f"row {row}")
        if ranked[k - 1] == ranked[k]:
            edge_ties += 1
        else:
            np.testing.assert_allclose(ours[row], theirs[row], rtol=rtol, err_msg=f"row {row}")
    assert edge_ties > 2, "the test needs ties at the k-th place"
    assert np.array_equal(ours[0] > 0, np.arange(e) < k)  # all tied: the lowest k indices


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_moe_with_duplicate_experts_matches_transformers(name, tmp_path):
    """Experts 0 and 1 are exact copies (router row and weights): their probabilities tie on
    every token, often at the k-th place, where any pick gives the same output but a
    threshold on the k-th probability would add both."""
    hf = make_hf(HF_CONFIGS[name]())
    with torch.no_grad():
        for layer in hf.model.layers:
            moe = layer.mlp  # transformers 5 holds each layer's experts fused: [E, 2F, D] and [E, D, F]
            moe.gate.weight[1] = moe.gate.weight[0]
            for tensor in (moe.experts.gate_up_proj, moe.experts.down_proj):
                tensor[1] = tensor[0]
    model = specjax.load_model(save_hf(hf, tmp_path))
    ids = np.asarray(PROMPTS[1])[None]
    assert _relative_error(specjax.io.model.logits(model, ids), hf_logits(hf, ids)) < RELATIVE


# --- configs specjax builds, and what stays refused -------------------------------------

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
    "qwen3_window_all_layers": _BASE.replace(model_type="qwen3", head_dim=16, sliding_window=5),
    "qwen2_window_per_layer": _BASE.replace(
        model_type="qwen2", attention_bias=True, sliding_window=5, layer_types=("full_attention", "sliding_attention")
    ),
    "mixtral_window": _BASE.replace(model_type="mixtral", num_experts=3, num_experts_per_tok=1, sliding_window=7),
    "phi3_window": _BASE.replace(model_type="phi3", sliding_window=6, tie_word_embeddings=False),
    "gemma2_no_window": _BASE.replace(
        model_type="gemma2", query_pre_attn_scalar=8.0, final_logit_softcapping=4.0, tie_word_embeddings=True
    ),
    "gemma3_yarn": _BASE.replace(
        model_type="gemma3_text",
        query_pre_attn_scalar=8.0,
        rope_local_base_freq=100.0,
        sliding_window=5,
        layer_types=("sliding_attention", "full_attention"),
        rope_scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32},
    ),
    "llama3_bias": _BASE.replace(
        attention_bias=True,
        o_proj_bias=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 2.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "qwen3_moe_norm": _BASE.replace(model_type="qwen3_moe", num_experts=3, num_experts_per_tok=2, norm_topk_prob=True),
}


@pytest.mark.parametrize("name", sorted(SPECJAX_CONFIGS))
def test_specjax_configs_save_for_transformers(name, tmp_path):
    model = _randomized(SPECJAX_CONFIGS[name])
    out = specjax.save_model(model, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = np.random.default_rng(0).integers(0, VOCAB, size=(2, 20))
    assert _relative_error(specjax.io.model.logits(model, ids), hf_logits(hf, ids)) < RELATIVE
    assert specjax.load_model(out).config == model.config


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_hf(make_hf(HF_CONFIGS["llama3"]()), tmp_path_factory.mktemp("llama3"))


def _edited(checkpoint, tmp_path, **changes):
    directory = tmp_path / "model"
    directory.mkdir(parents=True)
    for path in checkpoint.iterdir():
        (directory / path.name).write_bytes(path.read_bytes())
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, r"rope scaling 'longrope'.*not supported"),
        ({"rope_parameters": {"rope_type": "ntk-by-parts", "factor": 2.0}}, r"rope scaling 'ntk-by-parts'"),
        ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, r"'llama3' lacks 'low_freq_factor'"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}}, "partial_rotary"),
        ({"architectures": ["Gemma3ForConditionalGeneration"]}, r"unsupported architecture 'Gemma3ForCondit"),
    ],
)
def test_unsupported_variants_keep_clear_errors(checkpoint, tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        specjax.load_model(_edited(checkpoint, tmp_path, **changes))


def test_family_options_that_stay_refused(tmp_path):
    gemma = make_hf(HF_CONFIGS["gemma3"]())
    base = save_hf(gemma, tmp_path / "gemma")
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        specjax.load_model(_edited(base, tmp_path / "a", use_bidirectional_attention=True))
    with pytest.raises(ValueError, match="hidden_activation 'gelu' is not supported"):
        specjax.load_model(_edited(base, tmp_path / "b", hidden_activation="gelu"))
    qwen = save_hf(make_hf(HF_CONFIGS["qwen3_moe"]()), tmp_path / "qwen")
    with pytest.raises(ValueError, match=r"mlp_only_layers=\[0\].*not supported"):
        specjax.load_model(_edited(qwen, tmp_path / "c", mlp_only_layers=[0]))
    with pytest.raises(ValueError, match=r"rope_type 'longrope' is not supported"):
        specjax.ModelConfig(rope_scaling={"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(ValueError, match=r"'llama3' needs factor, low_freq_factor"):
        specjax.ModelConfig(rope_scaling={"rope_type": "llama3", "factor": 2.0})
    with pytest.raises(ValueError, match="num_experts_per_tok must lie in"):
        specjax.ModelConfig(model_type="mixtral", num_experts=2, num_experts_per_tok=3)
