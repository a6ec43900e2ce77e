"""Holding runs sent ahead until their start instant, and waking them on it.

A node may send a run ahead of its time (``Assignment.start_at``): the worker holds it and starts
the handler on the instant. The event loop's timers cannot do that alone: uvloop's (libuv's) count
whole milliseconds, so a timer fires up to a millisecond or so late. :class:`StartTimer` sleeps on
a loop timer until ``FINAL_WAIT_NS`` before the earliest instant, then hands the last stretch to
one dedicated thread that sleeps exactly that long (``time.sleep``: a nanosleep, precise to tens of
microseconds, with the GIL released) and has the loop call back at once; that callback wakes every
run due by then, so they start in the next loop iteration, never one wait after another.

Why a thread rather than spinning: checking the clock at every loop iteration for the last
milliseconds keeps a core busy — all the time when held runs are due less than that apart (a
steady 1,000 runs/s) — and on a small machine that core is the one the node needs to release
the next runs on time. The thread costs one wake-up per distinct instant and no CPU while it
sleeps. What it adds is the hop back to the loop (a write to the loop's self-pipe: tens of
microseconds when the loop is idle). An instant that arrives while the thread sleeps towards a
later one is at most ``FINAL_WAIT_NS`` late, and only when it is also that close to its time. (A
``timerfd`` read by the loop would do without the thread; Python exposes it from 3.13 only.)
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress

FINAL_WAIT_NS = 2_000_000  # beyond the loop timers' granularity (about 1 ms), with a margin


class StartTimer:
    """Wakes waiting tasks at instants of the worker's wall clock, more precisely than a timer.

    Args:
        now_ns: The clock, nanoseconds since the epoch.
        final_wait_ns: How long before an instant to stop sleeping on a loop timer and sleep
            the rest on the timer thread.
    """

    def __init__(self, *, now_ns: Callable[[], int] = time.time_ns, final_wait_ns: int = FINAL_WAIT_NS) -> None:
        self._now_ns = now_ns
        self._final_wait_ns = final_wait_ns
        self._thread: ThreadPoolExecutor | None = None  # made on the first final wait
        self._due: list[tuple[int, int, asyncio.Future[None]]] = []  # (instant, order, waiter): a heap
        self._order = itertools.count()
        self._driver: asyncio.Task[None] | None = None
        self._changed: asyncio.Event | None = None  # an earlier instant came, or a waiter gave up
        self._thread_sleeping = False  # a final wait is under way on the timer thread

    @property
    def waiting(self) -> int:
        """How many waits are pending."""
        return sum(1 for _, _, woken in self._due if not woken.done())

    async def wait_until(self, instant_ns: int) -> None:
        """Return once the clock reads ``instant_ns`` or later; at once if it already does.

        Cancelling the caller ends its wait only.
        """
        if self._now_ns() >= instant_ns:
            return
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._due, (instant_ns, next(self._order), woken))
        woken.add_done_callback(self._gave_up)
        if self._driver is None or self._driver.done():
            self._changed = asyncio.Event()
            self._driver = loop.create_task(self._drive(), name="worker-start-timer")
        elif self._due[0][2] is woken and self._changed is not None:
            self._changed.set()  # the driver sleeps towards a later instant
        await woken

    async def close(self) -> None:
        """Stop waking anyone: cancel every pending wait and the task that does the waking."""
        for _, _, woken in self._due:
            woken.cancel()
        self._due.clear()
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.cancel()
            await asyncio.gather(driver, return_exceptions=True)
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.shutdown(wait=False)  # its sleep is at most a final wait long

    def _gave_up(self, woken: asyncio.Future[None]) -> None:
        if woken.cancelled() and self._changed is not None:
            self._changed.set()  # if it was the earliest, the driver need not wait for it

    async def _drive(self) -> None:
        due, changed = self._due, self._changed
        assert changed is not None
        loop = asyncio.get_running_loop()
        while due:
            instant, _, woken = due[0]
            if woken.done():  # cancelled
                heapq.heappop(due)
                continue
            ahead = instant - self._now_ns()
            if ahead <= 0:
                self._wake_due()
                continue
            changed.clear()
            if ahead > self._final_wait_ns:
                with suppress(TimeoutError):
                    async with asyncio.timeout((ahead - self._final_wait_ns) / 1e9):
                        await changed.wait()
                continue
            if not self._thread_sleeping:
                if self._thread is None:
                    self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastlane-start-timer")
                self._thread_sleeping = True
                self._thread.submit(_sleep_then_call, ahead / 1e9, loop, self._thread_woke)
            await changed.wait()  # the thread woke the due waiters, or an earlier instant came

    def _thread_woke(self) -> None:
        """On the loop, straight from the timer thread: wake every waiter due by now in this very
        callback (not one task step later), then let the driver look at the next instant."""
        self._thread_sleeping = False
        self._wake_due()
        if self._changed is not None:
            self._changed.set()

    def _wake_due(self) -> None:
        due, now = self._due, self._now_ns()
        while due and (due[0][2].done() or due[0][0] <= now):
            _, _, woken = heapq.heappop(due)
            if not woken.done():
                woken.set_result(None)


def _sleep_then_call(seconds: float, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """On the timer thread: sleep (``time.sleep`` is a nanosleep, GIL released), then have the
    loop call ``callback`` as its next ready callback."""
    time.sleep(seconds)
    with suppress(RuntimeError):  # the loop closed meanwhile: nobody is waiting any more
        loop.call_soon_threadsafe(callback)
