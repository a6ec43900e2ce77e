"""The overview's last hour: trigger lag p50/p99 and runs a second, read off the node's own metrics.

Nothing is added to the fire path for it: every :data:`SAMPLE_SECONDS` this reads the cumulative
buckets of ``fastlane_trigger_lag_seconds`` and the run counters the node keeps anyway, and each
point of the chart is the difference between two samples, its quantiles interpolated within the
buckets as Prometheus' ``histogram_quantile`` does. So a point is as fine as the buckets (0.5, 1,
2, 3, 5, 7.5, 10 ms...) and covers this node only, since it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from fastlane.runtime.metrics import Metrics

SAMPLE_SECONDS = 10.0
KEEP_SECONDS = 3600.0
LIVE_TAIL_MIN_SECONDS = 1.0  # a shorter tail would be mostly noise
FINISHED = ("succeeded", "dead", "lost", "cancelled")  # outcomes of fastlane_runs_total that end a run
FAILED = ("retry", "dead", "lost")  # attempts that failed: retried, or the run's last


@dataclass(frozen=True, slots=True)
class _Sample:
    at: float  # wall-clock seconds
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), +Inf last
    finished: float
    failed: float


@dataclass(frozen=True, slots=True)
class Point:
    """One interval of the chart."""

    at: datetime  # its end
    released: int  # on-time runs released in it
    finished_per_second: float
    failed: int
    p50_ms: float | None  # None: nothing was released in it
    p99_ms: float | None
    seconds: float = SAMPLE_SECONDS  # how long it is


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of a histogram given as (upper bound, cumulative count), interpolated
    linearly within its bucket; the last finite bound for what lies beyond it; None if empty."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            inside = count - lower_count
            return lower_bound + (bound - lower_bound) * ((rank - lower_count) / inside if inside else 1.0)
        lower_bound, lower_count = bound, count
    return lower_bound


class Activity:
    """Samples the node's metrics and keeps the last hour of them."""

    def __init__(self, metrics: Metrics, *, wall: Callable[[], float] = time.time,
                 sample_seconds: float = SAMPLE_SECONDS) -> None:
        self._metrics = metrics
        self._wall = wall
        self._sample_seconds = sample_seconds
        self._samples: deque[_Sample] = deque(maxlen=int(KEEP_SECONDS / sample_seconds) + 1)

    def sample(self) -> None:
        """Take one sample now."""
        self._samples.append(self._read())

    def _read(self) -> _Sample:
        buckets: list[tuple[float, float]] = []
        for family in self._metrics.trigger_lag.collect():
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    buckets.append((float(sample.labels["le"]), sample.value))
        outcomes: dict[str, float] = {}
        for family in self._metrics.runs.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):  # summed over job types and tenants
                    outcome = sample.labels["outcome"]
                    outcomes[outcome] = outcomes.get(outcome, 0.0) + sample.value
        return _Sample(
            at=self._wall(), buckets=tuple(sorted(buckets)),
            finished=sum(outcomes.get(name, 0.0) for name in FINISHED),
            failed=sum(outcomes.get(name, 0.0) for name in FAILED),
        )

    async def run(self, stopping: asyncio.Event) -> None:
        """Sample every few seconds until ``stopping`` is set."""
        while not stopping.is_set():
            self.sample()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._sample_seconds):
                    await stopping.wait()

    def points(self) -> list[Point]:
        """The chart's points, oldest first: one per interval between samples, and the last
        from the latest sample to now (read now, not kept), so the page is never a sample late."""
        samples = list(self._samples)
        if samples:
            now = self._read()
            if now.at - samples[-1].at >= LIVE_TAIL_MIN_SECONDS:
                samples.append(now)
        points = []
        for before, after in zip(samples, samples[1:], strict=False):
            delta = tuple((bound, count - earlier) for (bound, count), (_, earlier) in
                          zip(after.buckets, before.buckets, strict=True))
            released = int(delta[-1][1]) if delta else 0
            seconds = max(after.at - before.at, 1e-9)
            p50, p99 = quantile(0.5, delta), quantile(0.99, delta)
            points.append(Point(
                at=datetime.fromtimestamp(after.at, UTC), released=released,
                finished_per_second=(after.finished - before.finished) / seconds,
                failed=int(after.failed - before.failed),
                p50_ms=None if p50 is None else p50 * 1000, p99_ms=None if p99 is None else p99 * 1000,
                seconds=seconds,
            ))
        return points
