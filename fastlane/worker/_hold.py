"""Holding runs sent ahead until their start instant, and waking them on it.

A node may send a run ahead of its time (``Assignment.start_at``): the worker holds it and starts
the handler on the instant. :class:`StartTimer` keeps the waiting runs in a heap by instant and
one alarm (:mod:`fastlane.runtime.alarm`: a kernel timer the loop polls, on Linux) set for the
earliest; when it rings, every run due by then is woken in that very callback, so they all start
in the next loop iteration, never one wait after another. There is no task and no thread: a run
that comes with an earlier instant just sets the alarm again.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable

from fastlane.runtime.alarm import Alarm, open_alarm


class StartTimer:
    """Wakes waiting tasks at instants of the worker's wall clock, more precisely than a timer.

    Args:
        now_ns: The clock, nanoseconds since the epoch (the wall clock unless a test injects one).
        precise: Use the kernel's alarm where there is one (else the loop's timer).
    """

    def __init__(self, *, now_ns: Callable[[], int] = time.time_ns, precise: bool = True) -> None:
        self._now_ns = now_ns
        self._precise = precise
        self._due: list[tuple[int, int, asyncio.Future[None]]] = []  # (instant, order, waiter): a heap
        self._order = itertools.count()
        self._alarm: Alarm | None = None  # made on the first wait, on its loop
        self._set_for: int | None = None  # the instant the alarm is set for

    @property
    def waiting(self) -> int:
        """How many waits are pending."""
        return sum(1 for _, _, woken in self._due if not woken.done())

    @property
    def alarm_set_for(self) -> int | None:
        """The instant the alarm will ring at, or None when nothing waits."""
        return self._set_for

    async def wait_until(self, instant_ns: int, *, behind: bool = False) -> None:
        """Return once the clock reads ``instant_ns`` or later; at once if it already does, unless
        ``behind``: then, while the alarm is set for that instant or earlier, return only after the
        waits already queued for it are woken (the alarm may be overdue and not rung yet).

        Cancelling the caller ends its wait only.
        """
        if self._now_ns() >= instant_ns and not (behind and self._set_for is not None and self._set_for <= instant_ns):
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._due, (instant_ns, next(self._order), woken))
        woken.add_done_callback(self._gave_up)
        if self._due[0][2] is woken:
            self._set_alarm()
        await woken

    async def close(self) -> None:
        """Stop waking anyone: cancel every pending wait and release the alarm."""
        due, self._due = self._due, []
        for _, _, woken in due:
            woken.cancel()
        alarm, self._alarm = self._alarm, None
        self._set_for = None
        if alarm is not None:
            alarm.close()

    def _gave_up(self, woken: asyncio.Future[None]) -> None:
        if woken.cancelled() and self._due and self._due[0][2] is woken:
            self._set_alarm()  # it was the earliest: the alarm need not ring for it

    def _set_alarm(self) -> None:
        """Set the alarm for the earliest pending instant (dropping waits given up on top), or
        clear it when nothing waits."""
        due = self._due
        while due and due[0][2].done():
            heapq.heappop(due)
        instant = due[0][0] if due else None
        if instant == self._set_for:
            return
        if self._alarm is None:
            if instant is None:
                return
            self._alarm = open_alarm(asyncio.get_running_loop(), self._ring, now_ns=self._now_ns,
                                     precise=self._precise)
        self._set_for = instant
        if instant is None:
            self._alarm.clear()
        else:
            self._alarm.set(instant)

    def _ring(self) -> None:
        """On the loop, when the alarm rings: wake every waiter due by now, set it for the next."""
        self._set_for = None
        due, now = self._due, self._now_ns()
        while due and (due[0][2].done() or due[0][0] <= now):
            _, _, woken = heapq.heappop(due)
            if not woken.done():
                woken.set_result(None)
        self._set_alarm()
