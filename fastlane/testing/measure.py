"""What a test (or a benchmark) reads off recorded runs."""

from __future__ import annotations


def most_at_once(intervals: list[tuple[int, int]]) -> int:
    """The most intervals open at one instant (an end at the instant of a start closes first)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    active = peak = 0
    for _, step in edges:
        active += step
        peak = max(peak, active)
    return peak
