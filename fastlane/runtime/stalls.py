"""Event-loop stalls: how late the node's loop wakes up, and whether a garbage collection stalled it.

A node fires runs from timers on one event loop, so anything that holds the loop (a long
callback, a large decode, a collection of the old generation) shows up as trigger lag. The probe
sleeps a short, fixed interval again and again and records how much later than asked it woke:
that is the loop's lag, the delay any timer due at that moment suffered too. Collections are
timed through :data:`gc.callbacks`; a stall is put down to the collector when collections took
most of it. It is put down to ``cpu_wait`` when the loop thread was runnable but not running
(another process had the core: :mod:`fastlane.runtime.run_queue`) for half of it or more: the
loop suffered that stall rather than caused it. Otherwise a watchdog thread, which looks at the
loop thread's stack whenever the probe has not ticked for a while, names the function the loop was
in (the innermost fastlane frame): so a stall is counted by cause — ``gc``, ``cpu_wait``,
``busy`` (the loop was running fastlane code, which the watchdog names) or ``other`` (it could
not say) —, a busy one also by the ``module:function`` it was in (a family of its own, for
diagnosis rather than dashboards), and the worst is logged, which says not only that the loop
stalled but where.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from prometheus_client import Counter, Histogram

from fastlane.runtime.run_queue import RunQueueWait

log = logging.getLogger("fastlane.stalls")

PROBE_INTERVAL = 0.005  # 200 wake-ups a second: a few tens of microseconds of work each
STALL = 0.002  # a wake-up later than this is a stall worth attributing
REPORT_EVERY = 60.0  # at most one log line a minute, naming the worst stall since the last
WATCH_EVERY = 0.004  # how often the watchdog thread looks whether the loop is overdue
BUSY = "busy"
CAUSES = frozenset({"gc", "cpu_wait", BUSY, "other"})  # the values of fastlane_event_loop_stalls_total{cause}
MAX_SITES = 24  # distinct stall sites named in the metric; later ones count as "other"
_PACKAGE_DIR = __file__.rsplit("/", 2)[0]  # fastlane/, of which this is runtime/stalls.py


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


class StallWatchdog:
    """A daemon thread that names where the loop thread is while the loop is overdue.

    The probe calls :meth:`tick` on each wake-up. When the last tick is older than the probe's
    interval plus :data:`STALL`, the thread reads the loop thread's current frame
    (:func:`sys._current_frames`) once for that stall and keeps the innermost frame inside
    fastlane (or the innermost frame at all) as ``module:function``. Reading a frame needs the
    GIL, so a stall spent in C code that holds it is seen when that code lets go.
    """

    def __init__(self, interval: float, *, every: float = WATCH_EVERY) -> None:
        self._overdue_after = interval + STALL
        self._every = every
        self._loop_thread = threading.get_ident()
        self._last_tick = time.perf_counter()
        self._site: str | None = None  # where the current stall was seen, until the next tick
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._loop_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._watch, name="fastlane-stall-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def tick(self) -> str | None:
        """The loop woke: return where it was seen stalled since the last tick, if anywhere."""
        site, self._site = self._site, None
        self._last_tick = time.perf_counter()
        return site

    def _watch(self) -> None:
        while not self._stopped.wait(self._every):
            if self._site is None and time.perf_counter() - self._last_tick > self._overdue_after:
                frame = sys._current_frames().get(self._loop_thread)
                if frame is not None:
                    self._site = site_of(frame)


def site_of(frame: FrameType) -> str:
    """``module:function`` of the innermost frame in fastlane's code, else of the innermost frame."""
    current: FrameType | None = frame
    while current is not None:
        filename = current.f_code.co_filename
        if filename.startswith(_PACKAGE_DIR) and not filename.endswith("stalls.py"):
            break
        current = current.f_back
    chosen = current if current is not None else frame
    module = chosen.f_globals.get("__name__", "?")
    return f"{module}:{chosen.f_code.co_name}"


class LoopLagProbe:
    """Measures the running loop's wake-up lag until cancelled; see the module docstring."""

    def __init__(
        self,
        *,
        lag: Histogram | None = None,
        stalls: Counter | None = None,
        sites: Counter | None = None,
        gc_pauses: GcPauses | None = None,
        watchdog: bool = False,
        interval: float = PROBE_INTERVAL,
        now: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._lag = lag
        self._stalls = stalls
        self._stall_sites = sites
        self._gc = gc_pauses
        self._watchdog = StallWatchdog(interval) if watchdog else None
        self._sites: set[str] = set()
        self._interval = interval
        self._now = now
        self.worst: tuple[float, str] = (0.0, "")  # since the last report: seconds, cause
        self._reported_at = now()

    async def run(self) -> None:
        if self._gc is not None:
            self._gc.install()
        if self._watchdog is not None:
            self._watchdog.start()
        waits = RunQueueWait()  # made here: the loop thread's own
        waited_before = waits.total_ns()  # one reading a wake-up: each is the next one's start
        try:
            while True:
                asked = self._now()
                await asyncio.sleep(self._interval)
                woke, waited_after = self._now(), waits.total_ns()
                site = self._watchdog.tick() if self._watchdog is not None else None
                cpu_wait = None if waited_before is None or waited_after is None else (waited_after - waited_before) / 1e9
                self.observe(asked, woke, site, cpu_wait)
                waited_before = waited_after
        finally:
            waits.close()
            if self._gc is not None:
                self._gc.uninstall()
            if self._watchdog is not None:
                self._watchdog.stop()

    def observe(self, asked: float, woke: float, site: str | None = None, cpu_wait: float | None = None) -> float:
        """Record one wake-up: the loop was asked to wake at ``asked + interval`` and woke at ``woke``;
        ``site`` is where the watchdog saw the loop thread meanwhile, if it looked; ``cpu_wait``
        the seconds the loop thread waited for a CPU meanwhile, where the kernel says."""
        lag = max(woke - asked - self._interval, 0.0)
        if self._lag is not None:
            self._lag.observe(lag)
        if lag >= STALL:
            cause = self._cause(asked, woke, lag, site, cpu_wait)
            if self._stalls is not None:
                self._stalls.labels(cause if cause in CAUSES else BUSY).inc()
            if self._stall_sites is not None and cause not in CAUSES:
                self._stall_sites.labels(cause).inc()
            if lag > self.worst[0]:
                self.worst = (lag, cause)
        if woke - self._reported_at >= REPORT_EVERY and self.worst[0] > 0:
            seconds, cause = self.worst
            log.info("event loop stalled up to %.1f ms in the last %.0f s (worst: %s)",
                     seconds * 1000, woke - self._reported_at, cause)
            self.worst, self._reported_at = (0.0, ""), woke
        return lag

    def _cause(self, asked: float, woke: float, lag: float, site: str | None, cpu_wait: float | None) -> str:
        if self._gc is not None and self._gc.within(asked, woke) >= lag / 2:
            return "gc"
        if cpu_wait is not None and cpu_wait >= lag / 2:
            return "cpu_wait"  # preempted: the frame the watchdog saw did not hold the loop
        if site is None:
            return "other"
        if site not in self._sites and len(self._sites) >= MAX_SITES:
            return "other"  # bounded label values: the first sites seen are the ones named
        self._sites.add(site)
        return site
