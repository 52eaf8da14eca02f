"""The peer comparison's pure helpers (scripts/peers/): output agreement, round-robin order,
paired ratios, and the q/k row order the draft GGUF is written in. The comparison itself
loads three frameworks and runs for minutes: scripts/peers/compare.py --quick checks it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts" / "peers"))
import outputs
import weights


def test_first_divergence_is_none_only_for_identical_outputs():
    assert outputs.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert outputs.first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert outputs.first_divergence([4], [5]) == 0
    assert outputs.first_divergence([1, 2, 3], [1, 2]) == 2  # a short output diverges where it ends


def test_agreement_counts_identical_prompts_and_the_earliest_divergence():
    got = outputs.agreement([[1, 2, 3], [4, 5, 6], [7, 8]], [[1, 2, 3], [4, 0, 6], [7, 0]])
    assert got == {"first_divergence": [None, 1, 1], "identical_prompts": 1, "prompts": 3, "earliest_divergence": 1}
    assert outputs.agreement([[1]], [[1]])["earliest_divergence"] is None
    with pytest.raises(ValueError, match="2 reference outputs, 1 to compare"):
        outputs.agreement([[1], [2]], [[1]])


def test_rotation_gives_every_method_every_position():
    names = ["a", "b", "c"]
    orders = [outputs.rotated(names, s) for s in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert outputs.rotated(names, 4) == ["b", "c", "a"] and outputs.rotated([], 2) == []


def test_paired_ratios_are_baseline_over_method_per_round():
    seconds = {"base": [1.0, 2.0, 4.0], "fast": [0.5, 1.0, 1.0], "slow": [2.0, 4.0, 8.0]}
    ratios = outputs.paired_ratios(seconds, "base")
    assert ratios == pytest.approx({"base": 1.0, "fast": 2.0, "slow": 0.5})
    with pytest.raises(ValueError, match="rounds"):
        outputs.paired_ratios({"base": [1.0], "x": [1.0, 2.0]}, "base")


def test_permute_qk_is_the_inverse_of_the_gguf_readers_unpermute():
    from specjax.io.gguf_file import _unpermute

    w = np.arange(3 * 8 * 5, dtype=np.float32).reshape(3 * 8, 5)  # 3 heads of d_head 8, 5 inputs
    permuted = weights.permute_qk(w, 3)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(_unpermute(permuted, 3), w)
