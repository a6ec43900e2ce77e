"""The fast lane: the next window of due work in memory, written ahead, released on time.

Two heaps keyed by time:

- *planned*: jobs whose ``next_fire_at`` falls inside the window, as slim :class:`DueJob`
  entries. At least the *lead* before each is due, the materialiser writes its runs in a fenced
  batch and advances the job; when more jobs are due soon than it can write by then at its
  measured rate (a crowd at one instant), it starts early enough to finish. That heap and its
  writing live in :mod:`.write_ahead`.
- *releasing*: runs already durable, waiting for their instant (or their retry time). The timer
  sleeps until the earliest and hands every due run to the dispatcher: no database round trip
  sits between a run's time and its release.

Sending ahead: while a connected worker can hold runs (its clock is known to within the
dispatcher's lead, ``--send-ahead``), the timer wakes a little less than that lead before an
instant (:data:`GATHER_SHARE` of it less) and offers every run due within the lead to the
dispatcher, which sends what it can place with ``start_at`` set (see :mod:`.dispatch.ahead`):
at 1,000 runs a second that is one message per five runs instead of one per run, and each
message costs the node's loop more than the runs it carries. What it cannot place, and what
must be confirmed in the database first (recovered runs; at-most-once runs, which the
dispatcher declines), moves to a second heap, *holding*, and is released on its instant exactly
as without sending ahead. Catch-ups
are already late, so they are released at once and never offered.

The window is loaded per shard on acquisition; afterwards the loader reads only what *enters*
the window (a watermark, ``horizon``), jobs changed through this node arrive by direct call, and
a slower full scan is the safety net.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from fastlane.domain.errors import StaleFence, StorageError
from fastlane.domain.models import DueJob, Job, JobState, Run, ShardLease
from fastlane.engine.waits import pause
from fastlane.engine.write_ahead import FAR_FUTURE, ShardStale, WriteAhead
from fastlane.runtime.alarm import Alarm, open_alarm
from fastlane.runtime.clock import Clock, CorrectedClock, SystemClock, to_micros
from fastlane.runtime.metrics import Metrics
from fastlane.server.settings import Settings
from fastlane.storage import Store

# Runs are offered ahead once the earliest is this share of the lead less than the lead away, with
# every run due within the lead: they go out gathered, held by the worker between 75 % and 100 %
# of the lead (15-20 ms by default).
GATHER_SHARE = 0.25


def _gathered(ahead: timedelta) -> timedelta:
    """How far the earliest run is from its instant when runs are offered ahead."""
    return ahead * (1 - GATHER_SHARE)

log = logging.getLogger("fastlane.lane")

SCAN_PAGE = 20_000  # jobs read by one window query
EXPIRY_CHECK_EVERY = timedelta(seconds=1)
EXPIRY_SLACK = timedelta(milliseconds=50)  # after an attempt lease ends, before looking again
# A run already this late when the node first holds it (a missed occurrence fired by the misfire
# policy, an `at` in the past, a resumed job, a run recovered after a failover) is a catch-up:
# its lag is counted apart, so the trigger-lag SLO measures only what the node could fire on time.
CATCH_UP_AFTER = timedelta(seconds=1)


class ShardView(Protocol):
    def fence(self, shard_id: int) -> ShardLease | None: ...

    def owned(self) -> list[int]: ...


class LaneDispatcher(Protocol):
    """What the lane needs of the dispatcher."""

    def release(self, runs: Iterable[Run], *, confirm_first: bool = False) -> None: ...

    def offer_ahead(self, runs: Iterable[Run]) -> list[Run]:
        """Send what it can of these runs ahead of their instant; the runs not sent."""
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
        """Attempts sent to workers since the node started, by (job type, tenant)."""
        ...


class FastLane:
    """Owns the in-memory window of the shards this node holds."""

    def __init__(
        self,
        store: Store,
        *,
        settings: Settings,
        clock: Clock,
        metrics: Metrics,
        shards: ShardView,
        on_stale: ShardStale,
        dispatch: LaneDispatcher,
    ) -> None:
        self._store = store
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self._fence = shards.fence
        self._owned_shards = shards.owned
        self._on_stale = on_stale
        self._dispatch = dispatch
        # (available_at, run_id, run): the id breaks ties without a sequence number, which would
        # be one more object per run, and the lane holds runs by the hundred thousand.
        self._releasing: list[tuple[datetime, str, Run]] = []
        # Entries of the same form past their offer to be sent ahead, waiting for their instant.
        self._holding: list[tuple[datetime, str, Run]] = []
        self._releasing_ids: set[str] = set()  # the runs in either heap
        # The runs among them that came back from the database rather than from this node's own
        # write: their dispatch is confirmed before sending.
        self._recovered: set[str] = set()
        self._catching_up: set[str] = set()  # the runs among them that were late when scheduled
        self._release_wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._write_ahead = WriteAhead(
            store, settings=settings, clock=clock, metrics=metrics, fence=shards.fence, on_stale=on_stale,
            schedule_run=self.schedule_run, forget_run=self.forget_run, cancel=dispatch.cancel,
            written_ahead=self._written_ahead, backlogs=dispatch.backlogs, assigned_totals=dispatch.assigned_totals,
            stopping=self._stopping,
        )
        self._held = _HeldRuns(self._releasing_ids, dispatch)
        dispatch.watch_ahead(self._release_wake.set)  # a worker able to hold runs: offer them now
        metrics.heap_size.set_function(lambda: self.size)  # read when scraped, not kept up to date

    # -- what the rest of the node tells the lane -----------------------------------------------

    @property
    def size(self) -> int:
        return self._write_ahead.size + len(self._releasing_ids)

    def _written_ahead(self) -> int:
        """Runs written and waiting, for their time or for workers."""
        return len(self._releasing_ids) + self._dispatch.ready_depth

    async def shards_acquired(self, leases: Sequence[ShardLease]) -> None:
        """Rebuild the window of newly owned shards from the database."""
        shard_ids = [lease.shard_id for lease in leases]
        jobs = await self._load_window(shard_ids, self._write_ahead.horizon, at_or_after=None)
        await self._write_ahead.plan_loaded(jobs)
        self._write_ahead.wake()  # a crowd among them may need writing before the earliest job
        # Materialised but never delivered (or waiting for a retry): release them again.
        runs = await self._store.pending_runs(shard_ids, FAR_FUTURE, skip=self._held)
        for run in runs:
            self.schedule_run(run, recovered=True)
        log.info("window rebuilt for %d shards: %d jobs due, %d runs pending", len(shard_ids), len(jobs), len(runs))

    def shards_lost(self, shard_ids: Iterable[int]) -> None:
        """Forget everything of these shards at once: another node fires them now."""
        lost = set(shard_ids)
        self._write_ahead.drop_shards(lost)
        self._drop_releasing(lambda run: run.shard_id in lost)

    def job_changed(self, job: Job) -> None:
        """A job was created or changed through this node: take the change into the window now."""
        self._write_ahead.job_changed(job)

    def job_removed(self, job_id: str) -> None:
        self._write_ahead.job_removed(job_id)

    def schedule_run(self, run: Run, *, recovered: bool = False) -> None:
        """Release ``run`` at its ``available_at`` (a trigger, a retry, a rebuilt run)."""
        if run.run_id in self._releasing_ids or self._fence(run.shard_id) is None:
            return
        if recovered and self._dispatch.holds(run.run_id):
            return
        self._releasing_ids.add(run.run_id)
        if run.available_at < self._clock.now() - CATCH_UP_AFTER:
            self._catching_up.add(run.run_id)
        if recovered:
            self._recovered.add(run.run_id)
        heapq.heappush(self._releasing, (run.available_at, run.run_id, run))
        if self._releasing[0][2] is run:
            self._release_wake.set()

    def forget_run(self, run_id: str) -> None:
        """Drop a run waiting for its time (it was cancelled)."""
        if run_id in self._releasing_ids:
            self._drop_releasing(lambda run: run.run_id == run_id)

    def forget_job(self, job_id: str) -> None:
        """The job was deleted: drop it and its runs waiting for their time."""
        self.job_removed(job_id)
        self._drop_releasing(lambda run: run.job_id == job_id)

    def _drop_releasing(self, matches: Callable[[Run], bool]) -> None:
        # Rare (cancel, delete, lost shards): a linear rebuild of the heaps is fine.
        self._releasing = [entry for entry in self._releasing if not matches(entry[2])]
        heapq.heapify(self._releasing)
        self._holding = [entry for entry in self._holding if not matches(entry[2])]
        heapq.heapify(self._holding)
        self._releasing_ids.clear()  # in place: the held-runs view shares this set
        self._releasing_ids.update(entry[2].run_id for entry in self._releasing)
        self._releasing_ids.update(entry[2].run_id for entry in self._holding)
        self._catching_up &= self._releasing_ids
        self._recovered &= self._releasing_ids

    # -- loops ----------------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._timer_loop(), name="lane-timer")
            group.create_task(self._write_ahead.run(), name="lane-materialise")
            group.create_task(self._load_loop(), name="lane-load")
            group.create_task(self._expiry_loop(), name="lane-lease-expiry")

    def stop(self) -> None:
        self._stopping.set()
        self._write_ahead.wake()
        self._release_wake.set()

    async def _timer_loop(self) -> None:
        """Release each run at its instant; offer runs due within the lead to be sent ahead.

        It sleeps on an alarm (:mod:`fastlane.runtime.alarm`: a kernel timer on Linux), not on the loop's
        timer: that one runs a wait shorter than half a millisecond at once, so with runs due every
        half millisecond (a tenant's flood of 2,000 a second, held behind its cap in `fastlane
        bench fairness`) this loop spun between instants: the loop thread was 90 % busy for the
        flood's first 1.2 s, about half of it here, and every other thread that needs the GIL
        (SQLite's writer) waited for it while the spinning thread gave it up and took it back."""
        # A clock that follows real time (the wall clock, or the node's corrected to the
        # database's) gets the kernel's timer; a clock a test injects, the loop's.
        if isinstance(self._clock, CorrectedClock):
            now_ns, real_time = self._clock.now_ns, True
        else:
            now_ns, real_time = (time.time_ns, True) if isinstance(self._clock, SystemClock) else (self._now_ns, False)
        alarm = open_alarm(asyncio.get_running_loop(), self._release_wake.set, now_ns=now_ns, real_time=real_time)
        try:
            await self._release_on_time(alarm)
        finally:
            alarm.close()

    async def _release_on_time(self, alarm: Alarm) -> None:
        while not self._stopping.is_set():
            now = self._clock.now()
            due: list[Run] = []
            recovered: list[Run] = []
            limit = self._settings.max_batch
            while len(due) + len(recovered) < limit:
                if self._releasing and self._releasing[0][0] <= now:
                    run = heapq.heappop(self._releasing)[2]
                elif self._holding and self._holding[0][0] <= now:
                    run = heapq.heappop(self._holding)[2]
                else:
                    break
                self._releasing_ids.discard(run.run_id)
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
            self._release_wake.clear()
            alarm.set(to_micros(self._next_wake(now, ahead)) * 1000)
            await self._release_wake.wait()  # the alarm, a new earliest run, or stop()

    def _now_ns(self) -> int:
        return to_micros(self._clock.now()) * 1000

    def _next_wake(self, now: datetime, ahead: timedelta) -> datetime:
        """The earliest offer (``ahead``, less the gathering, before an instant) or release."""
        wake = self._releasing[0][0] - _gathered(ahead) if self._releasing else now + timedelta(hours=1)
        if self._holding:
            wake = min(wake, self._holding[0][0])
        return wake

    def _offer_ahead(self, horizon: datetime, limit: int) -> None:
        """Offer the runs due by ``horizon`` (not yet due: due ones were released first) to be
        sent ahead; the rest, and runs that must be confirmed first, wait in *holding*."""
        offered: list[Run] = []
        for _ in range(limit):
            if not self._releasing or self._releasing[0][0] > horizon:
                break
            entry = heapq.heappop(self._releasing)
            run = entry[2]
            if self._fence(run.shard_id) is None:
                self._releasing_ids.discard(run.run_id)
                self._catching_up.discard(run.run_id)
                self._recovered.discard(run.run_id)
            elif run.run_id in self._recovered:
                heapq.heappush(self._holding, entry)  # confirmed first, on its instant
            else:
                offered.append(run)
        if not offered:
            return
        left = self._dispatch.offer_ahead(offered)
        for run in left:
            heapq.heappush(self._holding, (run.available_at, run.run_id, run))
        kept = {run.run_id for run in left}
        trigger_lag = self._metrics.trigger_lag
        for run in offered:
            if run.run_id not in kept:
                # Sent: its lag is zero at the send; the worker starts it on the instant.
                self._releasing_ids.discard(run.run_id)
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

    async def _load_loop(self) -> None:
        """Read what enters the window; now and then rescan all of it as a safety net."""
        interval = self._settings.scan_interval.total_seconds()
        last_full_scan = self._clock.now()
        while not self._stopping.is_set():
            await pause(self._stopping, interval)
            owned = self._owned_shards()
            if not owned or self._stopping.is_set():
                continue
            now = self._clock.now()
            write_ahead = self._write_ahead
            lower, upper = write_ahead.horizon, now + self._settings.window
            full = now - last_full_scan >= self._settings.full_scan_interval
            # Claim the new horizon first: a materialisation that commits while this query runs
            # plans its next occurrence itself when it falls before the claimed horizon.
            write_ahead.horizon = max(upper, lower)
            try:
                jobs = await self._load_window(owned, write_ahead.horizon, at_or_after=None if full else lower)
                pending = await self._store.pending_runs(owned, write_ahead.horizon, skip=self._held) if full else []
            except StorageError as error:
                log.warning("window scan failed: %s", error)
                write_ahead.horizon = lower
                continue
            if full:
                last_full_scan = now
                await self._count_errored_jobs()
            await write_ahead.plan_loaded(jobs)
            if jobs:
                write_ahead.wake()  # a crowd among them may need writing before the earliest job
            for run in pending:
                # Runs nobody holds in memory (a failed send, a retry decided elsewhere): the
                # dispatcher confirms each in the database before sending, so one held elsewhere
                # in this node is not sent twice.
                self.schedule_run(run, recovered=True)

    async def _count_errored_jobs(self) -> None:
        try:
            self._metrics.jobs_errored.set(await self._store.count_jobs(JobState.ERRORED))
        except StorageError as error:
            log.warning("could not count errored jobs: %s", error)

    async def _load_window(
        self, shard_ids: list[int], before: datetime, *, at_or_after: datetime | None
    ) -> list[DueJob]:
        """Every due job of these shards in the range, read in pages so no query is unbounded."""
        jobs: list[DueJob] = []
        after: tuple[datetime, str] | None = None
        while True:
            page = await self._store.load_due_jobs(
                shard_ids, before, at_or_after=at_or_after, after_job=after, limit=SCAN_PAGE
            )
            jobs += page
            if len(page) < SCAN_PAGE:
                return jobs
            after = (page[-1].next_fire_at, page[-1].job_id)

    async def _expiry_loop(self) -> None:
        """Attempts whose worker stopped heartbeating go back to the queue (or die): looked for
        every EXPIRY_CHECK_EVERY, and sooner when the earliest lease out ends before that."""
        wait = EXPIRY_CHECK_EVERY
        while not self._stopping.is_set():
            await pause(self._stopping, wait.total_seconds())
            wait = EXPIRY_CHECK_EVERY
            owned = self._owned_shards()
            if not owned or self._stopping.is_set():
                continue
            try:
                expired = await self._store.shards_with_expired_leases(owned)
                if expired:
                    # Results workers reported may still be in this node's journal (the database
                    # was away a while): landed first, they finish their runs instead of the
                    # expiry sending those runs out again.
                    await self._dispatch.journal_written(EXPIRY_CHECK_EVERY.total_seconds())
                for shard_id in expired:
                    fence = self._fence(shard_id)
                    if fence is None:
                        continue
                    try:
                        requeued = await self._store.requeue_expired(fence)
                    except StaleFence as stale:
                        self._on_stale(stale.shard_id, stale.token, str(stale))
                        continue
                    self._metrics.lease_expiries.inc(len(requeued))
                    self._dispatch.forget_attempts(requeued)
                    for run in requeued:
                        self.schedule_run(run, recovered=True)
                next_expiry = await self._store.next_lease_expiry(owned)
                if next_expiry is not None:
                    # Just after it ends (the database judges it): no sooner than EXPIRY_SLACK, so
                    # a lease the loop could not requeue (a stale fence) does not spin it.
                    wait = min(max(next_expiry + EXPIRY_SLACK, EXPIRY_SLACK), EXPIRY_CHECK_EVERY)
            except StorageError as error:
                log.warning("lease expiry check failed: %s", error)


class _HeldRuns:
    """The runs this node holds in memory (waiting for their time, queued or being dispatched):
    what a rescan of the database need not read again."""

    def __init__(self, releasing: set[str], dispatch: LaneDispatcher) -> None:
        self._releasing = releasing
        self._dispatch = dispatch

    def __contains__(self, run_id: object) -> bool:
        return isinstance(run_id, str) and (run_id in self._releasing or self._dispatch.holds(run_id))
