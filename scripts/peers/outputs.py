"""Pure helpers of the peer comparison: token-for-token agreement and round-robin order."""

from __future__ import annotations

import statistics


def first_divergence(reference: list[int], other: list[int]) -> int | None:
    """The first index where `other` differs from `reference` (a length difference counts
    at the shorter length), or None when the two are the same tokens."""
    for i, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a != b:
            return i
    return None if len(reference) == len(other) else min(len(reference), len(other))


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict:
    """Per-prompt first divergence of `other` from `reference` and a summary: how many
    prompts agree on every token, and the earliest divergence (None when all agree)."""
    if len(reference) != len(other):
        raise ValueError(f"{len(reference)} reference outputs, {len(other)} to compare")
    per_prompt = [first_divergence(a, b) for a, b in zip(reference, other, strict=False)]
    diverged = [d for d in per_prompt if d is not None]
    return {
        "first_divergence": per_prompt,
        "identical_prompts": len(per_prompt) - len(diverged),
        "prompts": len(per_prompt),
        "earliest_divergence": min(diverged) if diverged else None,
    }


def rotated(names: list[str], shift: int) -> list[str]:
    """`names` rotated left by `shift`: each call position sees every method in turn, so a
    slow or noisy stretch of a shared machine falls on all methods alike."""
    if not names:
        return []
    shift %= len(names)
    return names[shift:] + names[:shift]


def paired_ratios(seconds: dict[str, list[float]], baseline: str) -> dict[str, float]:
    """Median over rounds of (baseline's seconds / a method's seconds) in the same round:
    tokens/s relative to the baseline, each round paired so drift between rounds cancels.
    `seconds` maps a method to its seconds per round (all methods the same rounds)."""
    base = seconds[baseline]
    out = {}
    for name, values in seconds.items():
        if len(values) != len(base):
            raise ValueError(f"{name} has {len(values)} rounds, {baseline} {len(base)}")
        out[name] = statistics.median(b / v for b, v in zip(base, values, strict=True))
    return out
