"""A trained head refuses a target it was not trained for: other shapes always, another
config or other weights (its fingerprint) unless allow_transfer=True. Untrained tiny heads
and config-only targets keep this cheap; the embedded heads are checked against the
embedded target they ship for and against the random preset of the same width."""

from __future__ import annotations

import json

import pytest
from conftest import TARGET_CONFIG, scaled_model
from specjax.models.heads import head_config, init_eagle_params, init_medusa_params

import specjax
from specjax.drafters import Eagle, Medusa, target_fingerprint
from specjax.io.presets import RANDOM_PRESETS

THREE = TARGET_CONFIG.replace(num_hidden_layers=3)


def _refuse_loading(spec):
    raise AssertionError(f"load_drafter must not load {spec!r} as a model")


def make_drafter(spec, load, target):
    return specjax.load_drafter(spec, target, load=load)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, target):
    """Head directories saved for the session's tiny target (a Model: both fingerprints) and,
    for the multi-layer head, for a 3-layer config (config fingerprint only)."""
    root = tmp_path_factory.mktemp("head_checks")
    medusa = Medusa(params=init_medusa_params(32, num_heads=3), vocab_size=TARGET_CONFIG.vocab_size)
    layer = head_config(TARGET_CONFIG, 2, 1, 32)
    eagle = Eagle(params=init_eagle_params(layer, target.params, 0, TARGET_CONFIG), config=layer)
    eagle3 = Eagle(params=init_eagle_params(layer, None, 0, THREE, (0, 2)), config=layer, feature_layers=(0, 2))
    return {
        "medusa": specjax.save_drafter(medusa, root / "medusa", target_name="tiny-target", target=target),
        "eagle": specjax.save_drafter(eagle, root / "eagle", target_name="tiny-target", target=target),
        "eagle3": specjax.save_drafter(eagle3, root / "eagle3", target_name="three", target=THREE),
    }


@pytest.mark.parametrize(
    "kind, other, trained, given",
    [
        ("medusa", TARGET_CONFIG.replace(hidden_size=64), "hidden size 32", "hidden size 64"),
        ("medusa", TARGET_CONFIG.replace(vocab_size=64), "vocabulary 48", "vocabulary 64"),
        ("eagle", TARGET_CONFIG.replace(vocab_size=64), "vocabulary 48", "vocabulary 64"),
        ("eagle", TARGET_CONFIG.replace(num_attention_heads=2, num_key_value_heads=1), "head dim 8", "head dim 16"),
        ("eagle3", TARGET_CONFIG, r"feature layers \[0, 2\] \(of 3 layers\)", r"2 layers \(feature layers \[2\]"),
    ],
    ids=["medusa-hidden", "medusa-vocab", "eagle-vocab", "eagle-head-dim", "eagle3-layers"],
)
def test_other_shapes_are_refused_naming_both_sides_even_with_allow_transfer(saved, kind, other, trained, given):
    name = "three" if kind == "eagle3" else "tiny-target"
    for allow_transfer in (False, True):
        with pytest.raises(ValueError, match=rf"trained for {name} with {trained}; the given target has {given}") as e:
            specjax.load_drafter(saved[kind], other, allow_transfer=allow_transfer)
        assert "\n" not in str(e.value) and "waives only the target fingerprint, never shapes" in str(e.value)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_another_target_of_the_same_shapes_is_refused_unless_allow_transfer(saved, target, kind):
    other_weights = scaled_model(TARGET_CONFIG, seed=7)
    other_config = TARGET_CONFIG.replace(intermediate_size=128, rope_theta=500000.0)
    with pytest.raises(
        ValueError,
        match=r"trained for tiny-target \(weights sha256 \w{12}\); the given target has its "
        r"config but other weights \(sha256 \w{12}\).*allow_transfer=True",
    ):
        specjax.load_drafter(saved[kind], other_weights)
    with pytest.raises(
        ValueError,
        match=r"tiny-target \(intermediate_size=64, rope_theta=10000.0\); the given target "
        r"has intermediate_size=128, rope_theta=500000.0: .*allow_transfer: true",
    ):
        specjax.load_drafter(saved[kind], other_config)
    for transfer in (other_weights, other_config):
        assert specjax.load_drafter(saved[kind], transfer, allow_transfer=True).name == kind
    # Its own target, as the Model or as only its config (then the config part is checked).
    assert specjax.load_drafter(saved[kind], target).name == kind
    assert specjax.load_drafter(saved[kind], TARGET_CONFIG).name == kind
    assert target_fingerprint(TARGET_CONFIG.replace(dtype="bfloat16")) == target_fingerprint(TARGET_CONFIG)


def test_heads_saved_before_fingerprints_load_with_shape_checks_only(saved, tmp_path):
    config = json.loads((saved["medusa"] / "drafter.json").read_text())
    config["target"] = {"name": "tiny-target", "hidden_size": 32, "vocab_size": 48}  # as heads were written before
    old = tmp_path / "old"
    old.mkdir()
    (old / "drafter.json").write_text(json.dumps(config))
    (old / "model.safetensors").write_bytes((saved["medusa"] / "model.safetensors").read_bytes())
    assert specjax.load_drafter(old, TARGET_CONFIG.replace(intermediate_size=128)).name == "medusa"
    with pytest.raises(ValueError, match="hidden size 32; the given target has hidden size 64"):
        specjax.load_drafter(old, TARGET_CONFIG.replace(hidden_size=64))


def test_embedded_heads_refuse_the_random_target_and_serve_their_own():
    """The CLI's `--target random-target --drafter stdlib-medusa` (make_drafter with the
    target's config): the random preset has stdlib-target's width and vocabulary, but not
    its config; the EAGLE heads read another head dim and cannot run on it at all."""
    random_target = RANDOM_PRESETS["random-target"]
    with pytest.raises(
        ValueError,
        match=r"stdlib-medusa was trained for stdlib-target \(head_dim=64, .*\); the given "
        r"target has head_dim=32, .*allow_transfer",
    ):
        make_drafter("stdlib-medusa", _refuse_loading, random_target)
    with pytest.raises(
        ValueError,
        match="stdlib-eagle was trained for stdlib-target with head dim 64; the given target has head dim 32",
    ):
        make_drafter("stdlib-eagle", _refuse_loading, random_target)
    transfer = {"kind": "head", "path": "stdlib-medusa", "allow_transfer": True}
    assert make_drafter(transfer, _refuse_loading, random_target).name == "medusa"
    stdlib_target = specjax.load_model("stdlib-target")  # weights too: its fingerprint is the stored one
    assert make_drafter("stdlib-medusa", _refuse_loading, stdlib_target).name == "medusa"
    assert make_drafter({"kind": "head", "path": "stdlib-eagle3"}, _refuse_loading, stdlib_target).name == "eagle"
    with pytest.raises(
        ValueError,
        match=r"unknown key 'allow'; valid keys: .*allow_transfer",
    ):
        make_drafter({"kind": "head", "path": "stdlib-medusa", "allow": True}, _refuse_loading, stdlib_target)


@pytest.mark.parametrize("spec", ["nonsense", "./no/such/head"])
def test_an_unknown_drafter_name_lists_the_spellings(spec):
    with pytest.raises(ValueError, match=f"unknown drafter '{spec}'") as e:
        make_drafter(spec, _refuse_loading, TARGET_CONFIG)
    message = str(e.value)
    assert "\n" not in message
    for spelling in (
        "prompt-lookup",
        "layer-skip, layer-skip:N",
        "stdlib-medusa",
        "stdlib-eagle3",
        "random-target",
        "random-draft",
        "stdlib-target",
        "stdlib-draft",
        "directory",
        "draft_model, fallback, head, layer_skip, parallel_draft, prompt_lookup",
    ):
        assert spelling in message


def test_saving_a_head_for_a_target_it_does_not_fit_is_refused(tmp_path):
    medusa = Medusa(params=init_medusa_params(32, num_heads=2), vocab_size=TARGET_CONFIG.vocab_size)
    with pytest.raises(
        ValueError, match="built with hidden size 32, but the target it is saved for has hidden size 64"
    ):
        specjax.save_drafter(medusa, tmp_path / "head", target=TARGET_CONFIG.replace(hidden_size=64))
    assert not (tmp_path / "head").exists()
