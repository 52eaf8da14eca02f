"""E12 (the SPEED-Bench-style protocol): the committed prompt files are what the builder makes and
share no turn with the training prompts, and a tiny bench run on the byte-level pair of
tests/test_bench.py fills both splits (per category at batch 1; per bucket x batch size, best K)."""

from __future__ import annotations

import importlib
import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from test_bench import bench_pair

from specjax.bench import BenchConfig, run_bench
from specjax.configs import from_dict
from specjax.io.tokenizer import ByteTokenizer

ROOT = Path(__file__).parents[1]
PROTOCOL = ROOT / "configs/prompts/protocol"


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def builder():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return importlib.import_module("_protocol_qualitative")  # make_protocol_prompts.py's qualitative half
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def test_the_qualitative_file_is_what_the_builder_makes_and_disjoint_from_training(builder):
    # The throughput files need SmolLM2's tokenizer (`make_protocol_prompts.py --check` covers them).
    records = builder.qualitative_records()  # raises SystemExit on a turn shared with training
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    assert (PROTOCOL / "qualitative.jsonl").read_text(encoding="utf-8") == text
    counts = Counter(r["category"] for r in records)
    assert list(counts) == list(builder.CATEGORIES) and len(counts) == 11
    assert all(20 <= n <= 40 for n in counts.values()), counts
    assert {r["difficulty"] for r in records} == {"easy", "medium", "hard"}
    assert any(len(r["turns"]) > 1 for r in records) and all(r["source"] and r["turns"] for r in records)
    training = builder.training_turns()
    assert not any(t in training for r in records for t in r["turns"])
    with pytest.raises(SystemExit, match="also training prompts"):
        builder.check_disjoint([{"id": "x", "turns": [next(iter(training))]}])


def test_throughput_files_hold_their_buckets_input_length():
    for bucket, tokens in {"1k": 1024, "2k": 2048, "4k": 4096, "8k": 7936, "bytes_256": 256}.items():
        records = _records(PROTOCOL / f"throughput_{bucket}.jsonl")
        assert len(records) == 12 and {r["category"] for r in records} == {bucket}
        assert all(tokens - 8 <= r["input_tokens"] <= tokens for r in records)
    byte = _records(PROTOCOL / "throughput_bytes_768.jsonl")
    assert all(len(ByteTokenizer().encode(r["turns"][0])) == r["input_tokens"] <= 768 for r in byte)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """A tiny prompt directory (two categories, one record in two turns, one bucket) and one run.

    Few compiled programs: every prompt pads to 32 tokens (17-32 byte tokens; the second turn
    too, after a reply of 2 tokens, at most 6 bytes decoded), so the qualitative split's K = 2
    at batch 1 shares its programs with the throughput split's."""
    prompts = tmp_path_factory.mktemp("protocol_prompts")
    rows = [
        {"category": "math", "turns": ["What's 2 plus 3?", "4+5?"]},
        {"category": "math", "turns": ["What is 7 minus 2?"]},
        {"category": "writing", "turns": ["A line about rain, please."]},
        {"category": "rag", "turns": ["x" * 400]},  # longer than the 256 positions: skipped and counted
    ]
    (prompts / "qualitative.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    long = [{"category": "b32", "turns": ["the quick brown fox jumps"]}, {"category": "b32", "turns": ["abc " * 6]}]
    target, draft = bench_pair()
    config = {
        "experiments": ["protocol"],
        "max_new_tokens": 2,
        "timing": {"repeats": 1, "cost_inner": 1, "tpot_target_ms": 1000.0},
        "protocol": {
            "prompt_dir": str(prompts),
            "temperatures": [0.0],
            "num_speculative_tokens": 2,
            "buckets": ["b32"],
            "batch_sizes": [2],  # batch 1 is the qualitative split's already
            "ks": [1, 2],
            # Two drafters timed one group each (each beside its own plain); lookup is untimed
            # in the throughput split, so that split's programs stay the draft's.
            "drafters": [{"name": "draft"}, {"name": "lookup", "draft": {"method": "prompt_lookup"}}],
            "drafters_per_group": 1,
            "throughput_drafters": ["draft"],
        },
    }
    out = tmp_path_factory.mktemp("bench_protocol")
    config = from_dict(BenchConfig, config)
    # The first run dies in its throughput split (the bucket's file is missing) after timing both
    # qualitative groups; the second resumes from what the first left in finished_parts.json.
    with pytest.raises(ValueError, match=r"throughput_b32\.jsonl does not exist"):
        run_bench(config, out, target=target, draft=draft, progress=False)
    left = json.loads((out / "finished_parts.json").read_text())["parts"]
    assert list(left) == ["protocol/qualitative/draft", "protocol/qualitative/lookup"]
    (prompts / "throughput_b32.jsonl").write_text("".join(json.dumps(r) + "\n" for r in long))
    return run_bench(config, out, target=target, draft=draft, progress=False), out, left


def test_e12_resumes_from_the_groups_a_killed_run_finished(bench):
    results, out, left = bench
    result = results["experiments"]["protocol"]
    assert result["resumed_parts"] == ["protocol/qualitative/draft", "protocol/qualitative/lookup"]
    # The same timings, not new ones: each row as the first run measured it.
    qual = [{k: v for k, v in r.items() if k not in ("timing_group", "split")} for r in result["rows"]]
    assert qual[: sum(map(len, left.values()))] == [r for rows in left.values() for r in rows]
    assert not (out / "finished_parts.json").exists()  # the whole run is in results.json now


def test_e12_reports_categories_at_batch_1_and_the_best_k_per_bucket_and_batch(bench):
    results, out, _ = bench
    result = results["experiments"]["protocol"]
    assert result["qualitative"] == {
        "turns_per_category": {"math": 3, "writing": 1},
        "skipped_per_category": {"rag": 1},
    }
    qual = [r for r in result["rows"] if r["split"] == "qualitative" and r["method"] == "speculative"]
    assert {r["category"] for r in qual} == {"all", "math", "writing"} and all(r["batch_size"] == 1 for r in qual)
    assert all(r["output_matches_plain"] for r in result["rows"] if r["method"] == "speculative")
    groups = {}
    for r in result["rows"]:
        if r["split"] == "qualitative":
            groups.setdefault(r["timing_group"], set()).add(
                r.get("drafter") if r["method"] == "speculative" else "plain"
            )
    assert groups == {0: {"plain", "draft"}, 1: {"plain", "lookup"}}
    best = result["best_k"]
    assert [(b["bucket"], b["batch_size"]) for b in best] == [("b32", 2)]
    for b in best:
        assert b["best_k"] == max(b["speedup_by_k"], key=b["speedup_by_k"].get) and set(b["speedup_by_k"]) == {1, 2}
        assert b["tokens_per_second"] == pytest.approx(b["speedup_vs_plain"] * b["plain_tokens_per_second"])
    assert "| draft | 0 |" in result["tables"]["qualitative acceptance length"]
    assert "| b32 | 2 |" in result["tables"]["throughput"]
    for name in ("e12_protocol.png", "e12_protocol.csv", "e12_protocol.md", "summary.md"):
        assert (out / name).stat().st_size > 0
    assert "## throughput" in (out / "e12_protocol.md").read_text()
    assert "### throughput\n\n" + result["tables"]["throughput"] in (out / "summary.md").read_text()


def test_e12_bad_settings_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match=r"protocol\.per_bucket must be >= 1"):
        from_dict(BenchConfig, {"protocol": {"per_bucket": 0}})
    with pytest.raises(ValueError, match=r"protocol\.drafters_per_group must be at least 1"):
        from_dict(BenchConfig, {"protocol": {"drafters_per_group": 0}})
    with pytest.raises(ValueError, match="nothing to run"):
        from_dict(BenchConfig, {"protocol": {"qualitative": False, "buckets": []}})
