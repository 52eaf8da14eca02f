"""The measurement scripts' pieces (scripts/_timing.py, round_profile.py, weight_formats.py)
compute what they claim, on the tiny session models: the full scripts run for minutes."""

from __future__ import annotations

import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import _timing
import round_profile
import weight_formats


def test_summary_reports_median_and_quartiles_in_ms():
    s = _timing.summary([0.004, 0.001, 0.003, 0.002, 0.005])
    assert s["median"] == pytest.approx(3.0)
    assert (s["q1"], s["q3"], s["iqr"], s["n"]) == pytest.approx((2.0, 4.0, 2.0, 5))


def test_first_divergence_counts_the_agreeing_prefix():
    assert weight_formats.first_divergence([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert weight_formats.first_divergence([1, 2, 3], [1, 2, 3]) == 3
    assert weight_formats.first_divergence([5], [6]) == 0


def test_next_token_kl_is_zero_against_itself_and_positive_against_another_model(target, noisy_draft):
    prompts, continuations = [[1, 2, 3, 4], [5, 6]], [[7, 8, 9], [10, 11, 12]]
    same = weight_formats.next_token_kl(target, target, prompts, continuations, batch=2)
    other = weight_formats.next_token_kl(target, noisy_draft, prompts, continuations, batch=1)
    assert same == pytest.approx([0.0, 0.0], abs=1e-6)
    assert len(other) == 2 and min(other) > 1e-4


def test_forward_call_keeps_its_cache_and_drops_the_lm_head_on_request(target):
    logits = _timing.forward_call(target, 3, context=8, cache_length=12)
    hidden = _timing.forward_call(target, 3, context=8, cache_length=12, features=True)
    assert logits().shape == (1, 3, target.config.vocab_size)
    assert logits().shape == (1, 3, target.config.vocab_size)  # a second call reuses the donated cache
    assert hidden().shape == (1, 3, target.config.hidden_size)


def test_lm_head_call_is_the_models_head_product(target):
    head = target.params["embed"] if target.config.tie_word_embeddings else target.params["lm_head"]
    spec = "btd,vd->btv" if target.config.tie_word_embeddings else "btd,dv->btv"
    call = _timing.lm_head_call(target, 2)
    x = call.args[0]  # the random final-norm states it multiplies
    np.testing.assert_allclose(call(), jnp.einsum(spec, x, head), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8"])
def test_dot_call_multiplies_in_the_format(fmt):
    call = _timing.dot_call(fmt, 2, 16, 8)
    x, w, scale = call.args
    reference = np.asarray(x) @ (np.asarray(w, np.float32) * (1 if scale is None else np.asarray(scale)))
    assert call().shape == (1, 2, 8)
    np.testing.assert_allclose(call(), reference, rtol=0.05, atol=5e-3 if fmt != "float32" else 1e-6)


def test_tiny_parts_time_acceptance_and_commit_in_a_loop(target):
    parts = round_profile.tiny_parts(target.config, k=3, context=8, inner=4)
    assert set(parts) == {"acceptance", "commit", "dispatch"}
    for fn in parts.values():
        fn()
    assert int(parts["commit"]()[0]) == 8  # every iteration returns to the same length


def test_arguments_add_the_reference_format_and_the_verify_width():
    args = weight_formats.parse_args(["--weights", "int8", "--target", "random-target"])
    assert args.weights == ["float32", "int8"] and args.out == "results/weight_formats/random-target.json"
    args = round_profile.parse_args(["--widths", "1,2", "--k", "5"])
    assert args.widths == [1, 2, 6]
    with pytest.raises(SystemExit):
        round_profile.parse_args(["--weights", "int4"])


def test_markdown_table_has_a_row_per_format():
    args = weight_formats.parse_args(["--widths", "1,5,8", "--prompts", "2"])
    row = {
        "weight_bytes": {"per_step": 2e6},
        "forward_ms": {w: {"median": float(w)} for w in (1, 5, 8)},
        "over_width_1": {1: 1.0, 5: 5.0, 8: 8.0},
        "tokens_to_divergence": {"median": 3},
        "kl_from_float32": {"mean": 0.5},
        "speculative_equals_plain": False,
    }
    lines = weight_formats.markdown({"formats": {"float32": row, "int8": row}}, args).splitlines()
    assert len(lines) == 4 and lines[2].startswith("| float32 | 2.0 | 1.00 | 5.00 | 8.00 | 5.00 | 3 |")
    assert lines[3].endswith("| **no** |")
