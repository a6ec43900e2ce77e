"""How far behind its workers a queue may fall before its due jobs are deferred: its backlog limit.

A queue (job type, tenant) whose released runs wait for a free worker credit or for its tenant's
cap is behind the capacity it gets. Once that backlog reaches the queue's limit, the write-ahead
*defers* the queue's due jobs instead of writing their runs (``WriteAhead._look_at_backlogs``). The
limit is the smaller of:

- ``--max-backlog`` runs: a bound on memory, and on what is written only to wait;
- ``--max-backlog-seconds`` of the queue's *pace*, the runs a second it has lately sent to workers
  (at least :data:`MIN_BACKLOG` runs, or ``--max-backlog`` if that is less).

Why a pace as well as a count: to keep its workers busy a queue needs a backlog only as long as it
takes to write a run and hand it over (the write lead, well under a second); anything more can
only wait. A count that suits a queue taking thousands a second is a long wait for one taking a
hundred, and a flood fills it at the flood's own rate: a tenant offering ten times what its
workers take has the node and the database write its runs for seconds before a count of 10,000
is reached, runs that can only wait, and on a small machine those writes take the cores that
other tenants' workers need to start their runs on the instant. Bounded by its pace the flood's
queue stops being written within a second (``fastlane bench fairness`` measures this).

The pace is measured at most once a :data:`PACE_WINDOW`, whenever the write-ahead looks at its
backlogs (all the time under load; after an idle spell the first window spans it, and reads low),
from the running totals of attempts assigned per queue (``InFlight.assigned_totals``); a queue's
pace is the higher of its last two windows, so one slow second (a worker reconnecting) does not
halve its limit. Before a queue has a pace its limit is :data:`MIN_BACKLOG`: as runs are handed
over well within a second of being written, that keeps workers taking thousands of runs a second
busy, and after one window the pace lifts the limit to what they take.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

Queue = tuple[str, str]  # (job type, tenant)

PACE_WINDOW = 1.0  # seconds between two readings of the totals
MIN_BACKLOG = 1_000  # runs: the limit of a queue whose pace is not known yet (or is slow)


class BacklogLimits:
    """Each queue's backlog limit, from ``--max-backlog`` and its measured pace.

    Args:
        max_backlog: The limit of every queue, whatever its pace.
        seconds: The pace a queue's backlog may hold; 0: the limit is ``max_backlog`` alone.
        assigned_totals: Attempts assigned since the node started, by queue (never decreasing).
    """

    def __init__(self, *, max_backlog: int, seconds: float, assigned_totals: Callable[[], Mapping[Queue, int]]) -> None:
        self._max_backlog = max_backlog
        self._seconds = seconds
        self._assigned_totals = assigned_totals
        self._read_at: float | None = None  # time.monotonic() of the last reading
        self._totals: Mapping[Queue, int] = {}  # as read then
        self._last_window: dict[Queue, float] = {}  # runs a second of each queue in the last window
        self._paces: dict[Queue, float] = {}  # the higher of the last two windows

    def measure(self, now_s: float) -> None:
        """Read the totals if a window has passed since the last reading (``now_s``: ``time.monotonic()``)."""
        if self._seconds <= 0 or (self._read_at is not None and now_s - self._read_at < PACE_WINDOW):
            return
        totals = self._assigned_totals()
        if self._read_at is not None:
            elapsed = now_s - self._read_at
            window = {queue: (total - self._totals.get(queue, 0)) / elapsed for queue, total in totals.items()}
            self._paces = {queue: max(rate, self._last_window.get(queue, 0.0)) for queue, rate in window.items()}
            self._last_window = window
        self._read_at, self._totals = now_s, totals

    def pace(self, queue: Queue) -> float:
        """Runs a second the queue has lately sent to workers (0 if not measured yet)."""
        return self._paces.get(queue, 0.0)

    def limit(self, queue: Queue) -> int:
        """Due runs the queue may have waiting before its due jobs are deferred."""
        if self._seconds <= 0:
            return self._max_backlog
        return min(self._max_backlog, max(MIN_BACKLOG, math.ceil(self.pace(queue) * self._seconds)))
