"""Heads saved in the published layouts (`save_drafter(..., format=...)`) are the published files.

The random checkpoints of tests/test_head_formats.py (one per layout, for its 7-layer HF
Llama target) are loaded, saved in their own format and across formats where the network is
the same, and loaded again: the params and the static head (options, layer config, target
layers) are identical, so are the teacher-forced draft logits, and greedy generation gives
the same tokens with the same acceptance. The files are the published ones: their tensors
equal the original checkpoint's (names, shapes in torch [out, in] layout, values), and the
torch reference of tests/_torch_heads.py, built from the written config.json, loads them
with strict=True and computes what the original computed. Heads whose network is not the
published one are refused with what differs.
"""

from __future__ import annotations

import dataclasses
import json

import _torch_heads as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_head_formats as formats
import torch
import transformers
from safetensors.flax import load_file as load_flax
from safetensors.torch import load_file
from specjax.models.heads import init_medusa_params
from test_head_formats import PROMPTS, TARGET, TOKENS, VOCAB, _reference_logits, _specjax_logits

import specjax
from specjax.cli import main
from specjax.drafters import Eagle, Medusa
from specjax.drafters.formats.files import weights_file
from specjax.trees import Tree

# (fixture head, format to save it in): each published layout in its own format (the first 7), and EAGLE-3
# between its two layouts (the same network, its layer named midlayer.* or layers.0.*).
ROUND_TRIPS = [
    ("eagle1_bias", "eagle"),
    ("eagle1", "eagle"),
    ("eagle3", "eagle3"),
    ("speculators", "speculators"),
    ("speculators_eagle", "speculators"),
    ("medusa1", "medusa"),
    ("medusa2", "medusa"),
    ("eagle3", "speculators"),
    ("speculators", "eagle3"),
]
_FILE = {"medusa": "medusa_lm_head.safetensors"}
# test_head_formats' module-scoped fixtures (its tiny target and its checkpoints), by name here too.
hf_target, pair, heads, loaded = formats.hf_target, formats.pair, formats.heads, formats.loaded


@pytest.fixture(scope="module")
def saved(pair, loaded, tmp_path_factory):
    """{(name, format): (directory written, the head loaded back from it)}."""
    _, target = pair
    root = tmp_path_factory.mktemp("exported")
    out = {}
    for name, format in ROUND_TRIPS:
        directory = specjax.save_drafter(loaded[name], root / f"{name}-{format}", "tiny", target, format=format)
        out[name, format] = directory, specjax.load_drafter(directory, target)
    return out


def _same_head(a, b):
    assert a.without_weights() == b.without_weights()  # options, layer config, target layers, counts
    assert jax.tree.structure(a.params) == jax.tree.structure(b.params)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize(("name", "format"), ROUND_TRIPS)
def test_a_round_trip_keeps_the_head(pair, loaded, saved, name, format):
    _, target = pair
    _, again = saved[name, format]
    _same_head(loaded[name], again)
    mine, theirs = _specjax_logits(again, target, TOKENS), _specjax_logits(loaded[name], target, TOKENS)
    np.testing.assert_array_equal(mine, theirs)


def _tensors(directory, format):
    return load_file(directory / _FILE.get(format, "model.safetensors"))


@pytest.mark.parametrize(("name", "format"), ROUND_TRIPS[:7])
def test_the_files_are_the_published_layout(heads, saved, name, format):
    """Same format: the written tensors are the original checkpoint's, names, dtypes and values
    (an embedding a speculators file may ship is not written: vLLM takes the target's)."""
    original, _, _ = heads[name]
    written, _ = saved[name, format]
    source = weights_file(original)  # a safetensors file or a torch pickle
    state = load_file(source) if source.suffix == ".safetensors" else torch.load(source, weights_only=True)
    theirs = {k: v for k, v in state.items() if not (name == "speculators" and "embed" in k)}
    mine = _tensors(written, format)
    assert sorted(mine) == sorted(theirs)
    for key, value in theirs.items():
        assert mine[key].dtype == value.dtype, key
        torch.testing.assert_close(mine[key], value, rtol=0, atol=0, msg=key)


def _reference_from(directory, format, kind):
    """The torch reference module built from the written config.json, loaded with strict=True."""
    config = json.loads((directory / "config.json").read_text())
    if kind.startswith("medusa"):
        d, vocab = config["hidden_size"], config["vocab_size"]
        module = ref.medusa_heads(d, vocab, config["medusa_num_heads"], config["medusa_num_layers"], kind == "medusa1")
    else:
        layer = config.get("transformer_layer_config", config)
        llama = transformers.LlamaConfig(**layer)
        llama._attn_implementation = "eager"
        if kind == "eagle1":
            module = ref.Eagle1(llama, config["bias"])
        else:  # EAGLE-3 in either layout: its layer is midlayer.* or (speculators) layers.0.*
            vd = config["draft_vocab_size"]
            module = ref.Eagle3(llama, vd, torch.zeros(vd, dtype=torch.long), speculators=format == "speculators")
    module.load_state_dict(_tensors(directory, format), strict=True)
    return module


@pytest.mark.parametrize(("name", "format"), [rt for rt in ROUND_TRIPS if rt[0] != "speculators_eagle"])
def test_the_torch_reference_reads_the_files_strictly(pair, heads, saved, name, format):
    """The reference, configured from the written config.json (rope theta, fc bias, draft
    vocabulary, head counts), computes what the original checkpoint's reference computes."""
    hf, _ = pair
    _, original, kind = heads[name]
    module = _reference_from(saved[name, format][0], format, kind)
    theirs = _reference_logits(hf, original, kind, TOKENS)
    np.testing.assert_array_equal(_reference_logits(hf, module, kind, TOKENS), theirs)


def test_the_configs_say_what_vllm_and_sglang_read(saved):
    eagle1 = json.loads((saved["eagle1_bias", "eagle"][0] / "config.json").read_text())
    assert (eagle1["bias"], eagle1["rope_theta"], eagle1["num_hidden_layers"]) == (True, 500.0, 1)
    eagle3 = json.loads((saved["eagle3", "eagle3"][0] / "config.json").read_text())
    assert eagle3["draft_vocab_size"] == 8 and eagle3["vocab_size"] == VOCAB
    assert "eagle_aux_hidden_state_layer_ids" not in eagle3  # the default layers: every engine reads them alike
    spec = json.loads((saved["speculators", "speculators"][0] / "config.json").read_text())
    assert spec["speculators_model_type"] == "eagle3" and spec["norm_before_residual"] is False
    assert spec["eagle_aux_hidden_state_layer_ids"] == [1, 3, 6]  # vLLM's convention, as the file had them
    assert spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"] >= 1
    assert spec["speculators_config"]["verifier"] == {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]}
    assert spec["transformer_layer_config"]["model_type"] == "llama"
    medusa = json.loads((saved["medusa1", "medusa"][0] / "config.json").read_text())
    assert (medusa["medusa_num_heads"], medusa["medusa_num_layers"]) == (3, 1)  # the true count, not the file's 5


def test_generation_with_a_reexported_head_is_unchanged(pair, loaded, saved):
    """An EAGLE-3 head moved to speculators' layout proposes what it proposed: the same tokens
    with the same acceptance, over a tree. (test_head_formats runs the same generation with the
    original head, so in one session this compiles nothing new.)"""
    _, target = pair
    config = specjax.GenerationConfig(max_new_tokens=16)
    speculative = specjax.SpeculativeConfig(num_speculative_tokens=3, tree=Tree.full(2, 2))
    before = specjax.generate(target, PROMPTS, config, draft=loaded["eagle3"], speculative=speculative)
    after = specjax.generate(target, PROMPTS, config, draft=saved["eagle3", "speculators"][1], speculative=speculative)
    assert after.tokens == before.tokens
    assert after.stats.accepted_per_position == before.stats.accepted_per_position
    assert 0 < after.stats.acceptance_rate < 1


def test_specjax_medusa_heads_save_as_medusa_2(pair, tmp_path):
    """What specjax trains as Medusa is Medusa-2 with one block per head: it saves, loads back
    the same, and the reference reads it strictly."""
    _, target = pair
    params = init_medusa_params(TARGET.hidden_size, 3, seed=4)
    params["b"] = params["b"] + 0.1
    head = Medusa(params=params, vocab_size=VOCAB)
    directory = specjax.save_drafter(head, tmp_path / "medusa", format="medusa")
    _same_head(head, specjax.load_drafter(directory, target))
    module = _reference_from(directory, "medusa", "medusa2")
    np.testing.assert_array_equal(module[2][0].linear.bias.detach().numpy(), np.asarray(params["b"][2]))


def test_qwen2_style_qkv_biases_round_trip(pair, loaded, tmp_path):
    """EAGLE-1's Qwen2 heads have biases on q, k and v only: written as `qkv_bias`, read back."""
    _, target = pair
    head = loaded["eagle1"]
    ((key, layer),) = head.params["layers"].items()
    h, kv, hd = head.config.num_attention_heads, head.config.num_key_value_heads, head.config.resolved_head_dim
    rng = np.random.default_rng(0)
    biases = {f"{n}_bias": rng.normal(size=(m, hd)).astype(np.float32) for n, m in (("q", h), ("k", kv), ("v", kv))}
    params = {**head.params, "layers": {key: {**layer, "attn": {**layer["attn"], **biases}}}}
    biased = dataclasses.replace(head, params=params, config=head.config.replace(attention_bias=True))
    directory = specjax.save_drafter(biased, tmp_path / "qwen2", target=target, format="eagle")
    assert json.loads((directory / "config.json").read_text())["qkv_bias"] is True
    assert "layers.0.self_attn.q_proj.bias" in load_file(directory / "model.safetensors")
    _same_head(biased, specjax.load_drafter(directory, target))


# --- Refusals -------------------------------------------------------------------------------


def _specjax_eagle(published, layers=()):
    """specjax's own EAGLE head (SPECJAX_HEAD: input norm, final norm, position 0 seen; with
    `layers`, its reduce matrix), on an imported head's layer (the values do not matter here)."""
    d = published.config.hidden_size
    params = dict(published.params)
    ((key, layer),) = params["layers"].items()
    params["layers"] = {key: {**layer, "input_norm": {"scale": np.ones(d, np.float32)}}}
    params["final_norm"] = {"scale": np.ones(d, np.float32)}
    if layers:
        params["reduce"] = np.zeros((len(layers) * d, d), np.float32)  # [n * D, D]
    return Eagle(params=params, config=published.config, feature_layers=layers)


def test_heads_the_format_cannot_express_are_refused(pair, loaded, tmp_path):
    _, target = pair
    own = _specjax_eagle(loaded["eagle1"])
    with pytest.raises(ValueError, match=r"input_norm=True.*final_norm=True.*hide_first=False.*format='specjax'$"):
        specjax.save_drafter(own, tmp_path / "a", target=target, format="eagle")
    multi = _specjax_eagle(loaded["eagle1"], layers=(1, 2, 3))
    for format in ("eagle3", "speculators"):
        with pytest.raises(ValueError, match=r"`reduce` matrix.*not the published EAGLE-3.*format='specjax'$"):
            specjax.save_drafter(multi, tmp_path / "b", target=target, format=format)
    with pytest.raises(ValueError, match=r"an EAGLE-3-style head.*format='eagle3' or format='speculators'"):
        specjax.save_drafter(loaded["eagle3"], tmp_path / "c", target=target, format="eagle")
    shown = dataclasses.replace(
        loaded["eagle3"], options=dataclasses.replace(loaded["eagle3"].options, hide_first=False)
    )
    with pytest.raises(ValueError, match="position-0 entry"):
        specjax.save_drafter(shown, tmp_path / "d", format="eagle3")
    with pytest.raises(ValueError, match=r"copy of the target's embedding.*pass target="):
        specjax.save_drafter(loaded["eagle1"], tmp_path / "e", target=target.config, format="eagle")
    with pytest.raises(ValueError, match="these are Medusa heads: use format='medusa'"):
        specjax.save_drafter(loaded["medusa1"], tmp_path / "f", format="eagle3")
    with pytest.raises(ValueError, match="this is an EAGLE head"):
        specjax.save_drafter(loaded["eagle1"], tmp_path / "g", format="medusa")
    with pytest.raises(ValueError, match="unknown head format 'gguf'"):
        specjax.save_drafter(loaded["eagle1"], tmp_path / "h", format="gguf")
    untied = {"w": np.stack([np.eye(32), 2 * np.eye(32)])[None], "b": np.zeros((1, 2, 32))}
    with pytest.raises(ValueError, match="different residual blocks per head"):
        specjax.save_drafter(Medusa(params=untied), tmp_path / "i", format="medusa")
    specjax.save_drafter(loaded["medusa1"], tmp_path / "j")  # specjax's files
    with pytest.raises(ValueError, match=r"already holds drafter\.json"):
        specjax.save_drafter(loaded["medusa1"], tmp_path / "j", format="medusa")
    with pytest.raises(ValueError, match="hidden size 32, but the target's is 64"):
        specjax.save_drafter(
            loaded["medusa1"], tmp_path / "k", target=target.config.replace(hidden_size=64), format="medusa"
        )


def test_save_head_on_the_command_line(hf_target, heads, tmp_path, capsys):
    _, target_dir = hf_target
    out = tmp_path / "cli"
    args = ["save-head", str(heads["medusa2"][0]), "--target", str(target_dir), "--format", "medusa"]
    assert main([*args, "--out", str(out)]) == 0
    assert (out / "medusa_lm_head.safetensors").is_file()
    assert main([*args, "--out", str(out)]) == 2  # not empty
    assert main([*args[:-1], "eagle3", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("specjax: error: format='eagle3' writes EAGLE heads") and len(err) == 2
    assert not (tmp_path / "bad").exists()
    # --dtype bfloat16: the files half the size; loading casts back to the target's dtype.
    small = tmp_path / "small"
    assert main([*args[:-1], "specjax", "--dtype", "bfloat16", "--out", str(small)]) == 0
    stored = load_flax(str(small / "model.safetensors"))
    assert {x.dtype for x in stored.values()} == {jnp.dtype("bfloat16")}
    target = specjax.load_model(target_dir)
    original, reloaded = specjax.load_drafter(heads["medusa2"][0], target), specjax.load_drafter(small, target)
    for a, b in zip(jax.tree.leaves(original.params), jax.tree.leaves(reloaded.params), strict=True):
        assert b.dtype == jnp.dtype(target.config.dtype)
        np.testing.assert_array_equal(b, a.astype(jnp.bfloat16).astype(b.dtype))


def test_speculators_config_names_the_verifiers_repo_its_stored_dtype_and_version(hf_target, heads, tmp_path):
    """A serving engine resolves verifier.name_or_path on the Hub: the target's repo id (its
    config.json's `_name_or_path`), not the name it was given on the command line; torch_dtype is
    the dtype the tensors are stored in (bfloat16 after --dtype bfloat16), and speculators_version
    says which speculators layout the file follows."""
    import shutil

    from specjax.drafters.formats.writers import SPECULATORS_VERSION

    _, target_dir = hf_target
    named = tmp_path / "target"
    shutil.copytree(target_dir, named)
    config = json.loads((named / "config.json").read_text())
    (named / "config.json").write_text(json.dumps({**config, "_name_or_path": "some-org/Tiny-Llama-Instruct"}))
    args = ["save-head", str(heads["speculators"][0]), "--format", "speculators", "--dtype", "bfloat16"]
    assert main([*args, "--target", str(named), "--out", str(tmp_path / "out")]) == 0
    spec = json.loads((tmp_path / "out" / "config.json").read_text())
    assert spec["speculators_config"]["verifier"]["name_or_path"] == "some-org/Tiny-Llama-Instruct"
    assert spec["speculators_version"] == SPECULATORS_VERSION
    assert spec["torch_dtype"] == spec["transformer_layer_config"]["torch_dtype"] == "bfloat16"
    stored = load_flax(str(tmp_path / "out" / "model.safetensors"))
    assert {str(x.dtype) for x in stored.values() if jnp.issubdtype(x.dtype, jnp.floating)} == {"bfloat16"}
    # A local path there is no repo id: the name given is kept.
    (named / "config.json").write_text(json.dumps({**config, "_name_or_path": "/scratch/ckpt/tiny"}))
    assert main([*args, "--target", str(named), "--out", str(tmp_path / "local")]) == 0
    spec = json.loads((tmp_path / "local" / "config.json").read_text())
    assert spec["speculators_config"]["verifier"]["name_or_path"] == str(named)
    assert spec["torch_dtype"] == "bfloat16"


def test_gguf_targets_know_their_hf_repo(monkeypatch):
    """The packaged SmolLM2 file names no repo in its metadata (general.name is "Smollm2 135M 8k
    Lc100K Mix1 Ep2"): the packaged model's repo is used; a file with source metadata names its own."""
    from pathlib import Path

    from specjax.io import gguf_file

    path = gguf_file.packaged_path("smollm2-135m-instruct")
    assert gguf_file._source_repo(gguf_file._reader(path), path) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    meta = {"general.source.repo_url": "https://huggingface.co/org/Model-7B", "general.base_model.0.repo_url": "x/y"}
    monkeypatch.setattr(gguf_file, "_metadata", lambda reader: meta)
    assert gguf_file._source_repo(None, Path("model.gguf")) == "org/Model-7B"
    monkeypatch.setattr(gguf_file, "_metadata", lambda reader: {"general.base_model.0.repo_url": "x/y"})
    assert gguf_file._source_repo(None, Path("model.gguf")) is None  # a base model is another model
