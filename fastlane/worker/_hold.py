"""Holding runs sent ahead until their start instant, and waking them on it.

A node may send a run ahead of its time (``Assignment.start_at``): the worker holds it and starts
the handler on the instant. The event loop's timers cannot do that alone: uvloop's (libuv's) count
whole milliseconds, and asyncio's sleep in ``epoll_wait`` rounded up to one, so a timer fires up
to a millisecond or so late. :class:`StartTimer` sleeps on a timer until ``SPIN_WINDOW_NS`` before
the earliest instant, then yields to the loop (``asyncio.sleep(0)``) and reads the clock after
each loop iteration until the instant has passed, and wakes every run due by then.

The cost, and why this form: while an instant is less than ``SPIN_WINDOW_NS`` (2 ms) ahead the
loop does not block in ``epoll_wait``, so the worker keeps one core busy for at most 2 ms per
distinct instant — and all the time while held runs are due less than 2 ms apart (a steady 1,000
runs/s sent ahead, say), since one task does the waiting for every held run. Other tasks, the
stream's I/O included, run between two readings of the clock, so a run is late by at most one
loop iteration (microseconds when idle) rather than a millisecond. A tight ``while clock() <
instant`` loop would be a few microseconds more precise but block the loop for up to 2 ms per
instant, and with runs due every millisecond nearly all the time. Runs due on the same instant are
woken by the same check, in one loop iteration, never one wait after another. (A ``timerfd`` read
by the loop would wake on the instant without spinning; Python exposes it from 3.13 only.)
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from contextlib import suppress

SPIN_WINDOW_NS = 2_000_000  # beyond the loop timers' granularity (about 1 ms), with a margin


class StartTimer:
    """Wakes waiting tasks at instants of the worker's wall clock, more precisely than a timer.

    Args:
        now_ns: The clock, nanoseconds since the epoch (the tests may inject one).
        spin_window_ns: How long before an instant to stop sleeping on a timer and check the
            clock at every loop iteration.
    """

    def __init__(self, *, now_ns: Callable[[], int] = time.time_ns, spin_window_ns: int = SPIN_WINDOW_NS) -> None:
        self._now_ns = now_ns
        self._spin_window_ns = spin_window_ns
        self._due: list[tuple[int, int, asyncio.Future[None]]] = []  # (instant, order, waiter): a heap
        self._order = itertools.count()
        self._driver: asyncio.Task[None] | None = None
        self._changed: asyncio.Event | None = None  # an earlier instant came, or a waiter gave up

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

    def _gave_up(self, woken: asyncio.Future[None]) -> None:
        if woken.cancelled() and self._changed is not None:
            self._changed.set()  # if it was the earliest, the driver must not spin for it

    async def _drive(self) -> None:
        due, changed = self._due, self._changed
        assert changed is not None
        while due:
            instant, _, woken = due[0]
            if woken.done():  # cancelled
                heapq.heappop(due)
                continue
            ahead = instant - self._now_ns()
            if ahead <= 0:
                heapq.heappop(due)
                woken.set_result(None)
            elif ahead > self._spin_window_ns:
                changed.clear()
                with suppress(TimeoutError):
                    async with asyncio.timeout((ahead - self._spin_window_ns) / 1e9):
                        await changed.wait()
            else:
                await asyncio.sleep(0)
