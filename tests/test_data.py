"""The stdlib corpus: deterministic, disjoint splits and reproducible batches."""

from __future__ import annotations

import numpy as np
import pytest

from specjax.training import data


@pytest.mark.parametrize("domain", data.DOMAINS)
def test_splits_are_disjoint_and_cover_every_document(domain):
    names = {split: {d.name for d in data.split_documents(domain, split)} for split in data.SPLITS}
    assert all(names.values()), "every split needs documents"
    assert not names["train"] & names["validation"]
    assert not names["train"] & names["test"]
    assert not names["validation"] & names["test"]
    assert sum(len(n) for n in names.values()) == len(data.documents(domain))
    assert len(names["train"]) > 0.8 * len(data.documents(domain))


def test_split_is_a_pure_function_of_the_name():
    assert data.split_of("json/decoder.py") == data.split_of("json/decoder.py")
    fractions = np.mean([[data.split_of(f"doc{i}") == s for s in data.SPLITS] for i in range(4000)], axis=0)
    np.testing.assert_allclose(fractions, [0.90, 0.05, 0.05], atol=0.02)


def test_code_corpus_excludes_tests_and_site_packages():
    for doc in data.documents("code"):
        parts = doc.name.split("/")[:-1]
        assert "site-packages" not in parts and "test" not in parts


def test_manifest_records_interpreter_and_sizes():
    manifest = data.manifest()
    assert manifest["python"].count(".") == 2
    assert manifest["domains"]["code"]["train"]["bytes"] > 1_000_000
    assert manifest["domains"]["prose"]["test"]["documents"] > 0


def test_training_batches_depend_only_on_seed_and_step():
    config = data.DataConfig(seq_len=32, batch_size=8, prose_fraction=0.5)
    a = data.training_batch(config, seed=0, step=5)
    assert a.shape == (8, 33) and a.dtype == np.int32
    np.testing.assert_array_equal(a, data.training_batch(config, seed=0, step=5))
    assert not np.array_equal(a, data.training_batch(config, seed=0, step=6))
    assert not np.array_equal(a, data.training_batch(config, seed=1, step=5))
    assert a.max() < 259 and a.min() >= 0


def test_held_out_prompts_come_from_the_test_split():
    test_text = "".join(d.text for d in data.split_documents("code", "test"))
    prompts = data.held_out_prompts("code", 5)
    assert len(prompts) == 5 and len(set(prompts)) == 5
    assert all(p and p in test_text for p in prompts)


def test_bad_data_config():
    with pytest.raises(ValueError, match="prose_fraction"):
        data.DataConfig(prose_fraction=1.5)
    with pytest.raises(ValueError, match="unknown split"):
        data.split_documents("code", "dev")
