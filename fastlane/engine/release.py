"""Release on time: runs already durable wait in memory for their instant, and the timer hands
each to the dispatcher then (or offers it a little before, to be sent ahead).

Two heaps keyed by time:

- *releasing*: runs written (or triggered, retried, recovered) and waiting for their instant (or
  their retry time). The timer sleeps until the earliest and releases every due run to the
  dispatcher: no database round trip sits between a run's time and its release.
- *on instant*: runs the dispatcher did not send ahead, and runs that must be confirmed in the
  database first (recovered runs): released on their instant exactly as without sending ahead.

Offering ahead: while a connected worker can hold runs (its clock is known to within the
dispatcher's lead, ``--send-ahead``), the timer wakes a little less than that lead before an
instant (:data:`GATHER_SHARE` of it less) and offers every run due within the lead to the
dispatcher, which sends ahead what it can place, with ``start_at`` set (see
:mod:`.dispatch.send_ahead`): at 1,000 runs a second that is one message per ten runs instead of
one per run, and each message costs the node's loop (and the worker's) more than the runs it
carries. What it cannot place (at-most-once runs, which the dispatcher declines, among them)
moves to *on instant*. Catch-ups are already late, so they are released at once and never offered.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Protocol

from fastlane.domain.models import Run
from fastlane.engine.fencing import Fencing
from fastlane.runtime.alarm import Alarm, open_alarm
from fastlane.runtime.clock import Clock, CorrectedClock, SystemClock, to_micros
from fastlane.runtime.metrics import Metrics

# Runs are offered ahead once the earliest is this share of the lead less than the lead away, with
# every run due within the lead: they go out gathered, held by the worker between 50 % and 100 %
# of the lead (10-20 ms by default). Half the lead halves the messages of a quarter, and held runs
# start on their instant however long they were held.
GATHER_SHARE = 0.5
# A run already this late when the node first has it in memory (a missed occurrence fired by the
# misfire policy, an `at` in the past, a resumed job, a run recovered after a failover) is a
# catch-up: its lag is counted apart, so the trigger-lag SLO measures only what the node could
# fire on time.
CATCH_UP_AFTER = timedelta(seconds=1)


def _gathered(ahead: timedelta) -> timedelta:
    """How far the earliest run is from its instant when runs are offered ahead."""
    return ahead * (1 - GATHER_SHARE)


class LaneDispatcher(Protocol):
    """What the lane needs of the dispatcher."""

    def release(self, runs: Iterable[Run], *, confirm_first: bool = False) -> None: ...

    def offer_ahead(self, runs: Iterable[Run]) -> list[Run]:
        """Send ahead what it can of these runs (before their instant); return the runs not sent."""
        ...

    @property
    def ahead_lead(self) -> timedelta:
        """How long before their instant runs may be offered now (zero: not at all)."""
        ...

    def watch_ahead(self, wake: Callable[[], None]) -> None: ...

    def cancel(self, runs: Iterable[Run]) -> None: ...

    def forget_attempts(self, runs: Iterable[Run]) -> None: ...

    def holds(self, run_id: str) -> bool: ...

    async def journal_written(self, timeout: float) -> None:
        """Wait until what was journalled before this call is written (or the timeout passes)."""
        ...

    @property
    def ready_depth(self) -> int:
        """Released runs waiting for worker credits."""
        ...

    def backlogs(self) -> Mapping[tuple[str, str], int]:
        """Released runs waiting for a free credit (or their tenant's cap) where a connected worker
        serves them, by (job type, tenant)."""
        ...

    def assigned_totals(self) -> Mapping[tuple[str, str], int]:
        """Attempts assigned to workers since the node started, by (job type, tenant)."""
        ...


class ReleaseTimer:
    """The runs waiting in memory for their instant, and the timer that releases them."""

    def __init__(self, *, clock: Clock, metrics: Metrics, fencing: Fencing, dispatch: LaneDispatcher,
                 max_batch: int, stopping: asyncio.Event) -> None:
        self._clock = clock
        self._metrics = metrics
        self._fence = fencing.fence
        self._dispatch = dispatch
        self._max_batch = max_batch
        self._stopping = stopping
        # (available_at, run_id, run): the id breaks ties without a sequence number, which would
        # be one more object per run, and the lane keeps runs by the hundred thousand.
        self._releasing: list[tuple[datetime, str, Run]] = []
        # Entries of the same form past their offer to be sent ahead, waiting for their instant.
        self._on_instant: list[tuple[datetime, str, Run]] = []
        self.run_ids: set[str] = set()  # the runs in either heap (changed in place only: see RunsInMemory)
        # The runs among them that came back from the database rather than from this node's own
        # write: their dispatch is confirmed before sending.
        self._recovered: set[str] = set()
        self._catching_up: set[str] = set()  # the runs among them that were late when scheduled
        self._wake = asyncio.Event()
        dispatch.watch_ahead(self._wake.set)  # a worker able to hold runs: offer them now

    @property
    def size(self) -> int:
        return len(self.run_ids)

    def wake(self) -> None:
        self._wake.set()

    def schedule_run(self, run: Run, *, recovered: bool = False) -> None:
        """Release ``run`` at its ``available_at`` (a trigger, a retry, a rebuilt run)."""
        if run.run_id in self.run_ids or self._fence(run.shard_id) is None:
            return
        if recovered and self._dispatch.holds(run.run_id):
            return
        self.run_ids.add(run.run_id)
        if run.available_at < self._clock.now() - CATCH_UP_AFTER:
            self._catching_up.add(run.run_id)
        if recovered:
            self._recovered.add(run.run_id)
        heapq.heappush(self._releasing, (run.available_at, run.run_id, run))
        if self._releasing[0][2] is run:
            self._wake.set()

    def drop(self, matches: Callable[[Run], bool]) -> None:
        """Forget the waiting runs that match. Rare (cancel, delete, lost shards): a linear rebuild
        of the heaps is fine."""
        self._releasing = [entry for entry in self._releasing if not matches(entry[2])]
        heapq.heapify(self._releasing)
        self._on_instant = [entry for entry in self._on_instant if not matches(entry[2])]
        heapq.heapify(self._on_instant)
        self.run_ids.clear()  # in place: the runs-in-memory view shares this set
        self.run_ids.update(entry[2].run_id for entry in self._releasing)
        self.run_ids.update(entry[2].run_id for entry in self._on_instant)
        self._catching_up &= self.run_ids
        self._recovered &= self.run_ids

    async def run(self) -> None:
        """Release each run at its instant; offer runs due within the lead to be sent ahead.

        It sleeps on an alarm (:mod:`fastlane.runtime.alarm`: a kernel timer on Linux), not on the
        loop's timer: that one runs a wait shorter than half a millisecond at once, so with runs
        due every half millisecond (a tenant's flood held back by its cap) this loop would spin
        between instants, keeping the loop thread busy, and every other thread that needs the GIL
        (SQLite's writer) would wait while the spinning thread gives it up and takes it back."""
        # A clock that follows real time (the wall clock, or the node's corrected to the
        # database's) gets the kernel's timer; a clock a test injects, the loop's.
        if isinstance(self._clock, CorrectedClock):
            now_ns, real_time = self._clock.now_ns, True
        else:
            now_ns, real_time = (time.time_ns, True) if isinstance(self._clock, SystemClock) else (self._now_ns, False)
        alarm = open_alarm(asyncio.get_running_loop(), self._wake.set, now_ns=now_ns, real_time=real_time)
        try:
            await self._release_on_time(alarm)
        finally:
            alarm.close()

    async def _release_on_time(self, alarm: Alarm) -> None:
        while not self._stopping.is_set():
            now = self._clock.now()
            due: list[Run] = []
            recovered: list[Run] = []
            limit = self._max_batch
            while len(due) + len(recovered) < limit:
                if self._releasing and self._releasing[0][0] <= now:
                    run = heapq.heappop(self._releasing)[2]
                elif self._on_instant and self._on_instant[0][0] <= now:
                    run = heapq.heappop(self._on_instant)[2]
                else:
                    break
                self.run_ids.discard(run.run_id)
                from_database = run.run_id in self._recovered
                if from_database:
                    self._recovered.discard(run.run_id)
                if self._fence(run.shard_id) is not None:
                    (recovered if from_database else due).append(run)
                else:
                    self._catching_up.discard(run.run_id)
            if due or recovered:
                if due:
                    self._dispatch.release(due)
                if recovered:
                    self._dispatch.release(recovered, confirm_first=True)
                self._observe_lag(now, due, recovered)
                # A backlog is released a batch at a time, letting the rest of the node run between.
                await asyncio.sleep(0)
                continue
            ahead = self._dispatch.ahead_lead  # zero unless a connected worker can hold runs
            if ahead and self._releasing and self._releasing[0][0] <= now + _gathered(ahead):
                self._offer_ahead(now + ahead, limit)
                await asyncio.sleep(0)
                continue
            self._wake.clear()
            alarm.set(to_micros(self._next_wake(now, ahead)) * 1000)
            await self._wake.wait()  # the alarm, a new earliest run, or stop()

    def _now_ns(self) -> int:
        return to_micros(self._clock.now()) * 1000

    def _next_wake(self, now: datetime, ahead: timedelta) -> datetime:
        """The earliest offer (``ahead``, less the gathering, before an instant) or release."""
        wake = self._releasing[0][0] - _gathered(ahead) if self._releasing else now + timedelta(hours=1)
        if self._on_instant:
            wake = min(wake, self._on_instant[0][0])
        return wake

    def _offer_ahead(self, horizon: datetime, limit: int) -> None:
        """Offer the runs due by ``horizon`` (not yet due: due ones were released first) to be
        sent ahead; the rest, and runs that must be confirmed first, wait *on instant*."""
        offered: list[Run] = []
        for _ in range(limit):
            if not self._releasing or self._releasing[0][0] > horizon:
                break
            entry = heapq.heappop(self._releasing)
            run = entry[2]
            if self._fence(run.shard_id) is None:
                self.run_ids.discard(run.run_id)
                self._catching_up.discard(run.run_id)
                self._recovered.discard(run.run_id)
            elif run.run_id in self._recovered:
                heapq.heappush(self._on_instant, entry)  # confirmed first, on its instant
            else:
                offered.append(run)
        if not offered:
            return
        left = self._dispatch.offer_ahead(offered)
        for run in left:
            heapq.heappush(self._on_instant, (run.available_at, run.run_id, run))
        kept = {run.run_id for run in left}
        trigger_lag = self._metrics.trigger_lag
        for run in offered:
            if run.run_id not in kept:
                # Sent ahead: its lag is zero at the send; the worker starts it on the instant.
                self.run_ids.discard(run.run_id)
                trigger_lag.observe(0.0)

    def _observe_lag(self, now: datetime, *released: list[Run]) -> None:
        """Trigger lag of released runs (after the release: sending comes first); catch-ups apart."""
        on_time, catch_up = self._metrics.trigger_lag, self._metrics.catch_up_lag
        for runs in released:
            for run in runs:
                lag = max((now - run.available_at).total_seconds(), 0.0)
                if self._catching_up and run.run_id in self._catching_up:
                    self._catching_up.discard(run.run_id)
                    catch_up.observe(lag)
                else:
                    on_time.observe(lag)


class RunsInMemory:
    """The runs this node has in memory (waiting for their instant, queued, parked or being
    dispatched): what a rescan of the database need not read again (a ``skip`` for
    ``Store.lane.pending_runs``)."""

    def __init__(self, waiting: set[str], dispatch: LaneDispatcher) -> None:
        self._waiting = waiting
        self._dispatch = dispatch

    def __contains__(self, run_id: object) -> bool:
        return isinstance(run_id, str) and (run_id in self._waiting or self._dispatch.holds(run_id))
