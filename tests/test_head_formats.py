"""Published draft heads (EAGLE-1/2, EAGLE-3, Medusa-1/2, speculators) load into specjax and
compute what their reference math computes.

Random checkpoints are written in each public layout (tests/_torch_heads.py builds them from
transformers' Llama modules, with the published tensor names) for a tiny 7-layer HF Llama
target (7 layers: EAGLE-3's default layers 2, L//2, L-3 are distinct), loaded with
`specjax.load_drafter`, and compared with the torch reference: teacher-forced draft logits at
positions >= 1 within 1e-4 of their scale. Greedy decoding with each equals plain greedy; the
reduced-vocabulary EAGLE-3 head samples the target's distribution at T=1, and the same head
with its q left in draft-vocabulary ids (d2t applied to the tokens only) fails that test.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import _torch_heads as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import save_file
from specjax.models import TreeMask, full_forward, init_cache
from specjax.models.heads import eagle_forward
from test_hf_interop import make_hf, save_hf

import specjax
from specjax.bench.distribution import chi_square_p_value
from specjax.core.sampling import SamplingConfig, probabilities
from specjax.drafters import Eagle, Medusa
from specjax.drafters.formats.published import eagle3_layers
from specjax.trees import Tree

VOCAB, DRAFT_VOCAB, LAYERS = 16, 8, 7
TARGET = transformers.LlamaConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    initializer_range=0.35,
    tie_word_embeddings=False,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
# The draft vocabulary: 8 target ids, ascending as EAGLE-3's training picks them.
USED = torch.tensor([0, 2, 3, 5, 8, 9, 12, 15])
D2T = USED - torch.arange(DRAFT_VOCAB)
SPECULATORS_IDS = [1, 3, 6]  # vLLM convention: HF hidden_states[i], i.e. specjax blocks (0, 2, 5)


def _write(directory, config: dict | None, tensors: dict, name: str = "model.safetensors"):
    directory.mkdir(parents=True)
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    tensors = {k: v.detach().clone().contiguous() for k, v in tensors.items()}  # tied Medusa blocks: own copies
    if name.endswith(".safetensors"):
        save_file(tensors, str(directory / name))
    else:
        torch.save(tensors, directory / name)
    return directory


@pytest.fixture(scope="module")
def hf_target(tmp_path_factory):
    """(transformers' target, the HF directory it is saved in)."""
    hf = make_hf(TARGET)
    return hf, save_hf(hf, tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="module")
def pair(hf_target):
    return hf_target[0], specjax.load_model(hf_target[1])


@pytest.fixture(scope="module")
def heads(pair, tmp_path_factory):
    """{name: (checkpoint directory, torch reference module, what it reads)}."""
    hf, _ = pair
    root = tmp_path_factory.mktemp("published")
    out = {}
    for name, bias, theta, file in (
        ("eagle1_bias", True, 500.0, "model.safetensors"),
        ("eagle1", False, 10000.0, "pytorch_model.bin"),
    ):
        config = ref.head_llama_config(TARGET, rope_theta=theta)
        module = ref.perturb(ref.Eagle1(config, bias), 1.5, seed=len(out))
        module.embed_tokens.weight.data.copy_(hf.model.embed_tokens.weight.data)  # a copy of the target's
        hf_config = {**config.to_dict(), "bias": bias, "architectures": ["LlamaForCausalLM"]}
        out[name] = (_write(root / name, hf_config, module.state_dict(), file), module, "eagle1")
    # The speculators converter's EAGLE-1 layout: fc -> fusion_fc, layers.0 -> transformer, no embedding.
    _, module, _ = out["eagle1"]
    renamed = {
        k.replace("fc.", "fusion_fc.", 1).replace("layers.0.", "transformer.", 1): v
        for k, v in module.state_dict().items()
        if k != "embed_tokens.weight"
    }
    layer_config = {k: v for k, v in module.layers[0].self_attn.config.to_dict().items() if k != "architectures"}
    spec_config = {"speculators_model_type": "eagle", "transformer_layer_config": layer_config, "fusion_bias": False}
    out["speculators_eagle"] = (_write(root / "speculators_eagle", spec_config, renamed), module, "eagle1")
    config = ref.head_llama_config(TARGET)
    module = ref.perturb(ref.Eagle3(config, DRAFT_VOCAB, D2T), 1.5, seed=5)
    hf_config = {**config.to_dict(), "draft_vocab_size": DRAFT_VOCAB, "architectures": ["LlamaForCausalLM"]}
    out["eagle3"] = (_write(root / "eagle3", hf_config, module.state_dict()), module, "eagle3")
    spec = ref.perturb(ref.Eagle3(config, DRAFT_VOCAB, D2T, speculators=True), 1.5, seed=6)
    spec_config = {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": {k: v for k, v in config.to_dict().items() if k != "architectures"},
        "draft_vocab_size": DRAFT_VOCAB,
        "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": SPECULATORS_IDS,
        "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "tiny", "architectures": []}},
    }
    tensors = {**spec.state_dict(), "embed_tokens.weight": hf.model.embed_tokens.weight}
    out["speculators"] = (_write(root / "speculators", spec_config, tensors), spec, "speculators")
    for name, lm_heads, layers, file in (
        ("medusa1", True, 1, "medusa_lm_head.safetensors"),
        ("medusa2", False, 2, "medusa_lm_head.pt"),
    ):
        module = ref.perturb(ref.medusa_heads(TARGET.hidden_size, VOCAB, 3, layers, lm_heads), 2.0, seed=7)
        medusa_config = {"medusa_num_heads": 5, "medusa_num_layers": layers, "base_model_name_or_path": "tiny"}
        out[name] = (_write(root / name, medusa_config, module.state_dict(), file), module, name)
    return out


@pytest.fixture(scope="module")
def loaded(pair, heads):
    _, target = pair
    return {name: specjax.load_drafter(directory, target) for name, (directory, _, _) in heads.items()}


TOKENS = np.random.default_rng(0).integers(0, VOCAB, (2, 10))
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1], [7], [14, 15]]  # ragged
# One compile per head variant and shape: config, from_target and options are static.
_eagle = jax.jit(eagle_forward, static_argnums=(0, 8, 9))


def _specjax_logits(drafter, target, tokens):
    """Teacher-forced draft logits [B, T, V] (or [B, H, T, V] for Medusa) from the loaded head."""
    if isinstance(drafter, Medusa):
        _, f = full_forward(target.config, target.params, tokens, features=True)
        b, t, d = f.shape
        logits = specjax.models.heads.medusa_logits(drafter.params, f.reshape(b * t, d), target.config, target.params)
        return np.asarray(logits).reshape(b, t, -1, VOCAB).transpose(0, 2, 1, 3)
    _, f = full_forward(target.config, target.params, tokens, features=drafter.feature_layers or True)
    prev = jnp.concatenate([jnp.zeros_like(f[:, :1]), f[:, :-1]], axis=1)  # f_{p-1}
    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    cache = init_cache(drafter.config, b, t)
    logits, _, _ = _eagle(
        drafter.config, drafter.params, target.params, tokens, prev, positions, cache, None, True, drafter.options
    )
    return np.asarray(logits)


def _reference_logits(hf, module, kind, tokens):
    ids = torch.tensor(tokens)
    with torch.no_grad():
        hs = hf(ids, output_hidden_states=True).hidden_states
        if kind.startswith("medusa"):  # medusa1: each head ends in its own LM head; medusa2: the target's
            out = [head(hs[-1]) if kind == "medusa1" else hf.lm_head(head(hs[-1])) for head in module]
            return np.stack([o.numpy() for o in out], axis=1)  # [B, H, T, V]
        if kind == "eagle1":  # entry i = (token i+1, final-norm state i); specjax's position i + 1
            return hf.lm_head(module(hs[-1][:, :-1], ids[:, 1:])).numpy()
        layers = SPECULATORS_IDS if kind == "speculators" else [2, LAYERS // 2, LAYERS - 3]
        hidden3 = torch.cat([hs[i] for i in layers], dim=-1)[:, :-1]
        return module(hidden3, ids[:, 1:], hf.model.embed_tokens).numpy()


@pytest.mark.parametrize(
    "name", ["eagle1_bias", "eagle1", "eagle3", "speculators", "speculators_eagle", "medusa1", "medusa2"]
)
def test_teacher_forced_logits_match_the_reference(pair, heads, loaded, name):
    hf, target = pair
    _, module, kind = heads[name]
    mine = _specjax_logits(loaded[name], target, TOKENS)
    theirs = _reference_logits(hf, module, kind, TOKENS)
    if not kind.startswith("medusa"):
        mine = mine[:, 1:]  # specjax's position 0 has no reference entry
    finite = np.isfinite(theirs)
    np.testing.assert_array_equal(np.isfinite(mine), finite)  # -inf outside the draft vocabulary, same places
    scale = np.abs(theirs[finite]).max()
    np.testing.assert_allclose(mine[finite], theirs[finite], rtol=1e-4, atol=1e-4 * scale)


def test_variants_load_as_options(loaded):
    """The options each format sets, read from the files and keys."""
    assert loaded["eagle1_bias"].options.fc_bias and not loaded["eagle1"].options.fc_bias
    assert loaded["eagle1_bias"].config.rope_theta == 500.0  # the head's own, not the target's
    assert loaded["eagle3"].feature_layers == (1, LAYERS // 2 - 1, LAYERS - 4)
    assert loaded["eagle3"].options.draft_vocab_size == DRAFT_VOCAB
    assert loaded["speculators"].feature_layers == tuple(i - 1 for i in SPECULATORS_IDS)
    medusa1, medusa2 = loaded["medusa1"], loaded["medusa2"]
    assert (medusa1.num_heads, medusa1.num_layers, medusa1.lm_heads) == (3, 1, True)  # 3 heads, not config's 5
    assert (medusa2.num_heads, medusa2.num_layers, medusa2.lm_heads) == (3, 2, False)


def test_cached_steps_equal_one_pass_with_position_zero_hidden(pair, loaded):
    """An imported head's cache holds position p at slot p - 1: feeding the sequence in two
    cached calls gives the logits of one pass, so the engine's catch-up and draft steps see
    what teacher forcing sees."""
    _, target = pair
    drafter = loaded["eagle1_bias"]
    tokens = jnp.asarray(TOKENS)
    _, f = full_forward(target.config, target.params, tokens, features=True)
    prev = jnp.concatenate([jnp.zeros_like(f[:, :1]), f[:, :-1]], axis=1)
    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))

    def run(cache, sl):
        return _eagle(
            drafter.config, drafter.params, target.params, tokens[:, sl], prev[:, sl], positions[:, sl], cache,
            None, True, drafter.options,
        )  # fmt: skip

    whole, _, _ = run(init_cache(drafter.config, b, t), slice(None))
    first, cache, _ = run(init_cache(drafter.config, b, t), slice(0, t // 2))
    second, cache, _ = run(cache, slice(t // 2, None))
    np.testing.assert_allclose(np.asarray(second), np.asarray(whole[:, t // 2 :]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(first[:, 1:]), np.asarray(whole[:, 1 : t // 2]), rtol=1e-5, atol=1e-5)
    assert np.asarray(cache.lengths).tolist() == [t, t]
    # The second half as a token tree (a chain: each node sees its ancestors), as a round's tree
    # drafting feeds it: window slots from t // 2, the committed prefix below.
    _, cache, _ = run(init_cache(drafter.config, b, t), slice(0, t // 2))
    n = t - t // 2
    start = jnp.full((b,), t // 2)
    mask = TreeMask(start=start, slots=positions[:, t // 2 :], visible=jnp.tril(jnp.ones((n, n), bool)))
    as_tree, _, _ = _eagle(
        drafter.config, drafter.params, target.params, tokens[:, t // 2 :], prev[:, t // 2 :], positions[:, t // 2 :],
        cache, mask, True, drafter.options,
    )  # fmt: skip
    np.testing.assert_allclose(np.asarray(as_tree), np.asarray(whole[:, t // 2 :]), rtol=1e-5, atol=1e-5)


def test_imported_heads_round_trip_through_specjax_files(pair, loaded, tmp_path):
    """save_drafter keeps a published head's options and layer fields: it loads back the same."""
    _, target = pair
    for name, head in loaded.items():
        again = specjax.load_drafter(specjax.save_drafter(head, tmp_path / name, target=target), target)
        assert again.without_weights() == head.without_weights(), name
        for a, b in zip(jax.tree.leaves(head.params), jax.tree.leaves(again.params), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.fixture(scope="module")
def plain_greedy(pair):
    return specjax.generate(pair[1], PROMPTS, specjax.GenerationConfig(max_new_tokens=16))


# One head per drafter path (EAGLE-1's, EAGLE-3's over a tree, Medusa's): greedy exactness does
# not depend on the head's values, which the teacher-forced test checks for every layout.
@pytest.mark.parametrize("name", ["eagle1_bias", "eagle3", "medusa1"])
def test_greedy_with_an_imported_head_equals_plain_greedy(pair, loaded, plain_greedy, name):
    _, target = pair
    config = specjax.GenerationConfig(max_new_tokens=16)
    plain = plain_greedy
    speculative = specjax.SpeculativeConfig(
        num_speculative_tokens=3, tree=Tree.full(2, 2) if name == "eagle3" else None
    )
    out = specjax.generate(target, PROMPTS, config, draft=loaded[name], speculative=speculative)
    assert out.tokens == plain.tokens


PROMPT = [1, 2, 3]
SAMPLES = 6000


@dataclasses.dataclass(frozen=True)
class _TokensOnlyMapped(Eagle):
    """The negative control: the draft vocabulary's logits are not mapped (d2t ignored, so q
    stays in draft ids); only the drawn tokens are mapped to target ids afterwards."""

    def propose(self, weights, state, ctx, key):
        d2t = weights["d2t"]
        proposal, state = super().propose({**weights, "d2t": jnp.zeros_like(d2t)}, state, ctx, key)
        return proposal.replace(tokens=proposal.tokens + d2t[proposal.tokens]), state


def _exact_joint(model, sampling) -> np.ndarray:
    first = probabilities(jnp.asarray(specjax.io.model.logits(model, [PROMPT])[0, -1]), sampling)
    seconds = specjax.io.model.logits(model, [[*PROMPT, t] for t in range(VOCAB)])[:, -1]
    return np.asarray(first[:, None] * probabilities(jnp.asarray(seconds), sampling)).reshape(-1)


@pytest.mark.parametrize("variant", ["mapped", "d2t_ignored"])
def test_reduced_vocabulary_head_samples_the_targets_distribution(pair, loaded, variant):
    _, target = pair
    head = loaded["eagle3"]
    if variant == "d2t_ignored":
        head = _TokensOnlyMapped(**{f.name: getattr(head, f.name) for f in dataclasses.fields(head)})
    expected = _exact_joint(target, SamplingConfig(temperature=1.0))
    out = specjax.generate(
        target,
        [PROMPT] * SAMPLES,
        specjax.GenerationConfig.at_temperature(1.0, max_new_tokens=2, seed=1),
        draft=head,
        speculative=specjax.SpeculativeConfig(num_speculative_tokens=2),
    )
    tokens = np.asarray(out.tokens)
    p_value = chi_square_p_value(tokens[:, 0] * VOCAB + tokens[:, 1], expected)
    if variant == "mapped":
        assert p_value > 1e-3
        assert 0.0 < out.stats.acceptance_rate < 1.0
    else:
        assert p_value < 1e-8


def test_a_published_head_directory_is_a_drafter_spec_like_a_specjax_head(pair, hf_target, heads, loaded):
    """`--drafter DIR` and {method: head, model: DIR, aux_layers: ...} reach the published
    reader; a Hugging Face model directory (config.json + model.safetensors too) stays a
    draft model."""
    from specjax.drafters.formats.published import published_format
    from specjax.drafters.registry import resolve_method

    _, target = pair
    directory = str(heads["eagle3"][0])
    assert resolve_method(directory, specjax.load_model) == "head"
    assert published_format(heads["medusa2"][0]) == "medusa"  # a torch pickle
    assert published_format(target_dir := hf_target[1]) is None
    assert resolve_method(str(target_dir), specjax.load_model) == "draft_model"
    drafter = specjax.load_drafter(directory, target)
    assert drafter.without_weights() == loaded["eagle3"].without_weights()
    blocks = specjax.load_drafter({"method": "eagle3", "model": directory, "aux_layers": [0, 2, 5]}, target)
    assert blocks.feature_layers == (0, 2, 5)
    with pytest.raises(ValueError, match="aux_layers is a list of block indices"):
        specjax.load_drafter({"kind": "head", "path": directory, "aux_layers": "0,2"}, target)


# --- Errors ---------------------------------------------------------------------------------


def test_wrong_target_is_a_clear_error(pair, heads):
    _, target = pair
    wider = target.config.replace(hidden_size=64, intermediate_size=64)
    with pytest.raises(ValueError, match="hidden_size=32, the target 64"):
        specjax.load_drafter(heads["eagle1"][0], wider)
    with pytest.raises(ValueError, match="Medusa heads read hidden size 32, the target's is 64"):
        specjax.load_drafter(heads["medusa1"][0], wider)
    with pytest.raises(ValueError, match="vocab_size=16, the target 32"):
        specjax.load_drafter(heads["eagle3"][0], target.config.replace(vocab_size=32))
    other = specjax.load_model(save_hf(make_hf(TARGET, seed=1), heads["eagle1"][0].parent / "other"))
    with pytest.raises(ValueError, match=r"embedding .* is not the target's.*allow_transfer=True"):
        specjax.load_drafter(heads["eagle1"][0], other)
    assert specjax.load_drafter(heads["eagle1"][0], other, allow_transfer=True).options.hide_first
    with pytest.raises(ValueError, match="read against its target"):
        specjax.load_drafter(heads["eagle1"][0])


def _copy(src, dst, edit_config=None, edit_tensors=None):
    from safetensors.torch import load_file

    config = json.loads((src / "config.json").read_text())
    tensors = load_file(src / "model.safetensors")
    return _write(
        dst, edit_config(config) if edit_config else config, edit_tensors(tensors) if edit_tensors else tensors
    )


def test_bad_files_are_clear_errors(pair, heads, tmp_path, monkeypatch):
    _, target = pair
    eagle3, eagle1 = heads["eagle3"][0], heads["eagle1_bias"][0]
    cases = [
        (lambda c: c, lambda t: {**t, "extra.weight": torch.zeros(3)}, r"unexpected tensors .*'extra.weight'"),
        (lambda c: {**c, "norm_before_residual": True}, None, "norm_before_residual is not supported"),
        (lambda c: {**c, "draft_vocab_size": 9}, None, "draft_vocab_size=9"),
        (None, lambda t: {**t, "d2t": t["d2t"] * 0 + 15}, "d2t maps the draft vocabulary"),
        (None, lambda t: {k: v for k, v in t.items() if k != "d2t"}, "lacks d2t"),
        (None, lambda t: {**t, "fc.weight": t["fc.weight"][:, :64]}, r"fc.weight has shape \(32, 64\)"),
    ]
    for i, (edit_config, edit_tensors, message) in enumerate(cases):
        with pytest.raises(ValueError, match=message):
            specjax.load_drafter(_copy(eagle3, tmp_path / f"e3_{i}", edit_config, edit_tensors), target)
    no_bias = _copy(eagle1, tmp_path / "no_bias", lambda c: {**c, "bias": False})
    with pytest.raises(ValueError, match=r"says no fc bias, but .* has fc.bias"):
        specjax.load_drafter(no_bias, target)
    unknown = _write(tmp_path / "unknown", {}, {"foo.weight": torch.zeros(2)})
    with pytest.raises(ValueError, match="cannot tell which draft-head format"):
        specjax.load_drafter(unknown, target)
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a valid safetensors file"):
        specjax.load_drafter(tmp_path / "corrupt", target)
    with pytest.raises(ValueError, match=r"is neither a specjax head directory .* a published head"):
        specjax.load_drafter(tmp_path, target)
    for flag in ("fc_norm", "norm_output"):  # speculators' variant flags are refused, not ignored
        edited = _copy(heads["speculators"][0], tmp_path / flag, lambda c, f=flag: {**c, f: True})
        with pytest.raises(ValueError, match=f"EAGLE-3 variant {flag} is not supported"):
            specjax.load_drafter(edited, target)
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    with pytest.raises(ValueError, match=r"torch pickle.*install torch.*convert the file to safetensors"):
        specjax.load_drafter(heads["eagle1"][0], target)


def test_eagle3_layer_conventions():
    """The default reads HF hidden_states (2, L//2, L-3) = specjax blocks (1, L//2-1, L-4);
    explicit ids are vLLM's (hidden_states[i]: block i - 1) unless told SGLang's (block i)."""
    assert eagle3_layers({}, 32) == (1, 15, 28)
    ids = {"eagle_aux_hidden_state_layer_ids": [2, 16, 29]}
    assert eagle3_layers(ids, 32) == (1, 15, 28)
    assert eagle3_layers(ids, 32, convention="sglang") == (2, 16, 29)
    assert eagle3_layers(ids, 32, aux_layers=(3, 4, 5)) == (3, 4, 5)
    with pytest.raises(ValueError, match="needs 7 or more"):
        eagle3_layers({}, 6)
