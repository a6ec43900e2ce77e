"""Event-loop stalls: how late the node's loop wakes up, and whether a garbage collection held it.

A node fires runs from timers on one event loop, so anything that holds the loop (a long
callback, a large decode, a collection of the old generation) shows up as trigger lag. The probe
sleeps a short, fixed interval again and again and records how much later than asked it woke:
that is the loop's lag, the delay any timer due at that moment suffered too. Collections are
timed through :data:`gc.callbacks`; a stall is put down to the collector when collections took
most of it, so the histogram says not only that the loop stalled but, where it can, why.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Histogram

log = logging.getLogger("fastlane.stalls")

PROBE_INTERVAL = 0.005  # 200 wake-ups a second: a few tens of microseconds of work each
STALL = 0.002  # a wake-up later than this is a stall worth attributing
REPORT_EVERY = 60.0  # at most one log line a minute, naming the worst stall since the last


@dataclass(frozen=True, slots=True)
class Pause:
    ended: float  # perf_counter
    seconds: float
    generation: int


class GcPauses:
    """Times every collection via :data:`gc.callbacks`; remembers the recent ones for attribution."""

    def __init__(self, histogram: Histogram | None = None, *, keep: int = 256) -> None:
        self._histogram = histogram
        self._recent: deque[Pause] = deque(maxlen=keep)
        self._started = 0.0
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._on_gc)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._on_gc)
            self._installed = False

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # Runs inside the collector: nothing here may allocate much or raise.
        now = time.perf_counter()
        if phase == "start":
            self._started = now
            return
        pause = Pause(now, now - self._started, int(info.get("generation", -1)))
        self._recent.append(pause)
        if self._histogram is not None:
            self._histogram.labels(str(pause.generation)).observe(pause.seconds)

    def within(self, start: float, end: float) -> float:
        """Seconds of collection that ended inside ``(start, end]``."""
        return sum(p.seconds for p in self._recent if start < p.ended <= end)


class LoopLagProbe:
    """Measures the running loop's wake-up lag until cancelled; see the module docstring."""

    def __init__(
        self,
        *,
        lag: Histogram | None = None,
        stalls: Counter | None = None,
        gc_pauses: GcPauses | None = None,
        interval: float = PROBE_INTERVAL,
        now: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._lag = lag
        self._stalls = stalls
        self._gc = gc_pauses
        self._interval = interval
        self._now = now
        self.worst: tuple[float, str] = (0.0, "")  # since the last report: seconds, cause
        self._reported_at = now()

    async def run(self) -> None:
        if self._gc is not None:
            self._gc.install()
        try:
            while True:
                asked = self._now()
                await asyncio.sleep(self._interval)
                woke = self._now()
                self.observe(asked, woke)
        finally:
            if self._gc is not None:
                self._gc.uninstall()

    def observe(self, asked: float, woke: float) -> float:
        """Record one wake-up: the loop was asked to wake at ``asked + interval`` and woke at ``woke``."""
        lag = max(woke - asked - self._interval, 0.0)
        if self._lag is not None:
            self._lag.observe(lag)
        if lag >= STALL:
            cause = self._cause(asked, woke, lag)
            if self._stalls is not None:
                self._stalls.labels(cause).inc()
            if lag > self.worst[0]:
                self.worst = (lag, cause)
        if woke - self._reported_at >= REPORT_EVERY and self.worst[0] > 0:
            seconds, cause = self.worst
            log.info("event loop stalled up to %.1f ms in the last %.0f s (worst: %s)",
                     seconds * 1000, woke - self._reported_at, cause)
            self.worst, self._reported_at = (0.0, ""), woke
        return lag

    def _cause(self, asked: float, woke: float, lag: float) -> str:
        if self._gc is not None and self._gc.within(asked, woke) >= lag / 2:
            return "gc"
        return "other"
