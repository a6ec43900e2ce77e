"""The fast lane: the next window of due work in memory, written ahead, released on time.

Two heaps keyed by time:

- *planned*: jobs whose ``next_fire_at`` falls inside the window, as slim :class:`DueJob`
  entries. At least the *lead* before each is due, the materialiser writes its runs in a fenced
  batch and advances the job; when more jobs are due soon than it can write by then at its
  measured rate (a crowd at one instant), it starts early enough to finish.
- *releasing*: runs already durable, waiting for their instant (or their retry time). The timer
  sleeps until the earliest and hands every due run to the dispatcher: no database round trip
  sits between a run's time and its release.

The window is loaded per shard on acquisition; afterwards the loader reads only what *enters*
the window (a watermark, ``horizon``), jobs changed through this node arrive by direct call, and
a slower full scan is the safety net.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol

from fastlane.clock import EPOCH, Clock
from fastlane.config import Settings
from fastlane.domain.limits import FIRST_INSTANT, MAX_ERROR_TEXT
from fastlane.domain.models import DueJob, Job, JobState, Run, ShardLease
from fastlane.domain.policies import plan_occurrence
from fastlane.errors import StaleFence, StorageError, StorageUnavailable, new_error_id
from fastlane.metrics import Metrics
from fastlane.storage import Occurrence, Store

log = logging.getLogger("fastlane.lane")

FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)
SCAN_PAGE = 20_000  # jobs read by one window query
EXPIRY_CHECK_EVERY = timedelta(seconds=1)
RETRY_AFTER_STORAGE_ERROR = timedelta(milliseconds=500)
# Planned jobs are counted per slot of fire time, so the materialiser sees a crowd coming (say
# 100,000 jobs due at one instant) and starts writing it early enough to finish in time. In steady
# load a slot is also the span of fire times one materialisation takes together.
SLOT = timedelta(milliseconds=100)
INITIAL_WRITE_RATE = 5_000.0  # occurrences per second, until measured
RATE_SAMPLE_MIN = 200  # smaller batches are dominated by the round trip: not a rate sample
MAX_WRITTEN_AHEAD = 150_000  # runs written ahead of a crowd and waiting in memory, at most
# A run already this late when the node first holds it (a missed occurrence fired by the misfire
# policy, an `at` in the past, a resumed job, a run recovered after a failover) is a catch-up:
# its lag is counted apart, so the trigger-lag SLO measures only what the node could fire on time.
CATCH_UP_AFTER = timedelta(seconds=1)


class ShardView(Protocol):
    def fence(self, shard_id: int) -> ShardLease | None: ...

    def owned(self) -> list[int]: ...


ShardStale = Callable[[int, int, str], None]  # shard id, the token that was refused, why


class LaneDispatcher(Protocol):
    """What the lane needs of the dispatcher."""

    def release(self, runs: Iterable[Run], *, confirm_first: bool = False) -> None: ...

    def cancel(self, runs: Iterable[Run]) -> None: ...

    def forget_attempts(self, runs: Iterable[Run]) -> None: ...

    def holds(self, run_id: str) -> bool: ...

    @property
    def ready_depth(self) -> int:
        """Released runs waiting for worker credits."""
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
        self._seq = itertools.count()
        self._planned: list[tuple[datetime, int, DueJob]] = []
        self._planned_at: dict[str, datetime] = {}  # the one live heap entry per job
        self._planned_per_slot: Counter[int] = Counter()  # heap entries (live or dead) by fire slot
        self._write_rate = INITIAL_WRITE_RATE  # occurrences materialised per second (moving average)
        # (available_at, sequence, run, recovered): a recovered run came back from the database
        # rather than from this node's own write, so its dispatch is confirmed before sending.
        self._releasing: list[tuple[datetime, int, Run, bool]] = []
        self._releasing_ids: set[str] = set()
        self._catching_up: set[str] = set()  # the runs among them that were late when scheduled
        # Jobs with next_fire_at before the horizon are in memory (or being loaded).
        self._horizon = clock.now() + settings.window
        self._plan_wake = asyncio.Event()
        self._release_wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._held = _HeldRuns(self._releasing_ids, dispatch)
        metrics.heap_size.set_function(lambda: self.size)  # read when scraped, not kept up to date

    # -- what the rest of the node tells the lane -----------------------------------------------

    @property
    def size(self) -> int:
        return len(self._planned_at) + len(self._releasing_ids)

    async def shards_acquired(self, leases: Sequence[ShardLease]) -> None:
        """Rebuild the window of newly owned shards from the database."""
        shard_ids = [lease.shard_id for lease in leases]
        jobs = await self._load_window(shard_ids, self._horizon, at_or_after=None)
        await self._plan_loaded(jobs)
        self._plan_wake.set()  # a crowd among them may need writing before the earliest job
        # Materialised but never delivered (or waiting for a retry): release them again.
        runs = await self._store.pending_runs(shard_ids, FAR_FUTURE, skip=self._held)
        for run in runs:
            self.schedule_run(run, recovered=True)
        log.info("window rebuilt for %d shards: %d jobs due, %d runs pending", len(shard_ids), len(jobs), len(runs))

    def shards_lost(self, shard_ids: Iterable[int]) -> None:
        """Forget everything of these shards at once: another node fires them now."""
        lost = set(shard_ids)
        self._planned = [entry for entry in self._planned if entry[2].shard_id not in lost]
        heapq.heapify(self._planned)
        self._planned_per_slot = Counter(_slot(at) for at, _, _ in self._planned)
        self._planned_at = {job.job_id: at for at, _, job in self._planned if self._planned_at.get(job.job_id) == at}
        self._drop_releasing(lambda run: run.shard_id in lost)

    def job_changed(self, job: Job) -> None:
        """A job was created or changed through this node: take the change into the window now."""
        if self._fence(job.shard_id) is None:
            return
        if job.state is JobState.ACTIVE and job.next_fire_at is not None and job.next_fire_at < self._horizon:
            self._plan(DueJob.of(job))
        else:
            self.job_removed(job.job_id)

    def job_removed(self, job_id: str) -> None:
        # The heap entry stays but is dead: it no longer matches _planned_at when popped.
        self._planned_at.pop(job_id, None)

    def schedule_run(self, run: Run, *, recovered: bool = False) -> None:
        """Release ``run`` at its ``available_at`` (a trigger, a retry, a rebuilt run)."""
        if run.run_id in self._releasing_ids or self._fence(run.shard_id) is None:
            return
        if recovered and self._dispatch.holds(run.run_id):
            return
        self._releasing_ids.add(run.run_id)
        if run.available_at < self._clock.now() - CATCH_UP_AFTER:
            self._catching_up.add(run.run_id)
        heapq.heappush(self._releasing, (run.available_at, next(self._seq), run, recovered))
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
        # Rare (cancel, delete, lost shards): a linear rebuild of the heap is fine.
        self._releasing = [entry for entry in self._releasing if not matches(entry[2])]
        heapq.heapify(self._releasing)
        self._releasing_ids.clear()  # in place: the held-runs view shares this set
        self._releasing_ids.update(entry[2].run_id for entry in self._releasing)
        self._catching_up &= self._releasing_ids

    async def _plan_loaded(self, jobs: Iterable[DueJob]) -> None:
        """Plan jobs read from the database; one the window cannot hold is set aside."""
        refused: list[tuple[DueJob, Exception]] = []
        for job in jobs:
            if self._fence(job.shard_id) is None:
                continue
            try:
                self._plan(job)  # a no-op when the heap already holds this fire time
            except Exception as error:  # a value no check caught (stored by an older version)
                refused.append((job, error))
        for job, error in refused:
            await self._set_aside(job, "loading it into the window", error)

    def _plan(self, job: DueJob) -> None:
        fire_at = job.next_fire_at
        if self._planned_at.get(job.job_id) == fire_at:
            return
        slot = _slot(fire_at)  # first: a fire time the heap cannot order raises before any change
        self._planned_at[job.job_id] = fire_at
        heapq.heappush(self._planned, (fire_at, next(self._seq), job))
        self._planned_per_slot[slot] += 1
        if self._planned[0][2] is job:
            self._plan_wake.set()

    # -- loops ----------------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._timer_loop(), name="lane-timer")
            group.create_task(self._materialise_loop(), name="lane-materialise")
            group.create_task(self._load_loop(), name="lane-load")
            group.create_task(self._expiry_loop(), name="lane-lease-expiry")

    def stop(self) -> None:
        self._stopping.set()
        self._plan_wake.set()
        self._release_wake.set()

    async def _sleep(self, wake: asyncio.Event, seconds: float) -> None:
        """Sleep until ``wake`` is set (it is cleared first) or ``seconds`` pass."""
        wake.clear()
        if seconds <= 0 or self._stopping.is_set():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await wake.wait()

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds`` unless stopping (which is never cleared)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stopping.wait()

    async def _timer_loop(self) -> None:
        """Release each run at its instant."""
        while not self._stopping.is_set():
            now = self._clock.now()
            due: list[Run] = []
            recovered: list[Run] = []
            limit = self._settings.max_batch
            while self._releasing and self._releasing[0][0] <= now and len(due) + len(recovered) < limit:
                _, _, run, from_database = heapq.heappop(self._releasing)
                self._releasing_ids.discard(run.run_id)
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
            delay = (self._releasing[0][0] - now).total_seconds() if self._releasing else 3600.0
            await self._sleep(self._release_wake, delay)

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

    async def _materialise_loop(self) -> None:
        """Write runs a short lead before they are due (earlier for a crowd), in fenced batches."""
        while not self._stopping.is_set():
            now = self._clock.now()
            start, through = write_start(self._planned_per_slot, self._settings.lead, self._write_rate)
            if self._planned and len(self._releasing_ids) + self._dispatch.ready_depth >= MAX_WRITTEN_AHEAD:
                # Enough runs are written and waiting already, for their time or for workers (a
                # node behind its load): writing further ahead would only take time from sending
                # and fill memory, so write no further ahead than the lead.
                head = self._planned[0][0]
                start, through = max(start, head - self._settings.lead), head + SLOT
            if start <= now:
                batch = self._pop_planned(through)
                if batch:
                    await self._timed_materialise(batch, now)
                    continue
            delay = (start - now).total_seconds() if self._planned else 3600.0
            await self._sleep(self._plan_wake, delay)

    def _pop_planned(self, cutoff: datetime) -> list[DueJob]:
        batch: list[DueJob] = []
        while self._planned and self._planned[0][0] <= cutoff and len(batch) < self._settings.max_batch:
            fire_at, _, job = heapq.heappop(self._planned)
            self._uncount(fire_at)
            if self._planned_at.get(job.job_id) == fire_at:
                del self._planned_at[job.job_id]
                batch.append(job)
        return batch

    def _uncount(self, fire_at: datetime) -> None:
        slot = _slot(fire_at)
        left = self._planned_per_slot[slot] - 1
        if left > 0:
            self._planned_per_slot[slot] = left
        else:
            del self._planned_per_slot[slot]

    async def _timed_materialise(self, jobs: list[DueJob], now: datetime) -> None:
        started = time.perf_counter()
        await self._materialise(jobs, now)
        if len(jobs) >= RATE_SAMPLE_MIN:
            rate = len(jobs) / max(time.perf_counter() - started, 1e-6)
            self._write_rate = 0.7 * self._write_rate + 0.3 * rate

    async def _materialise(self, jobs: list[DueJob], now: datetime) -> None:
        by_shard: dict[int, list[DueJob]] = defaultdict(list)
        for job in jobs:
            by_shard[job.shard_id].append(job)
        fences = {fence.shard_id: fence for shard_id in by_shard if (fence := self._fence(shard_id)) is not None}
        # Occurrences up to the lead are written now; a job taken earlier than that (with its
        # slot, or ahead of a crowd) gets at least its own occurrence.
        horizon = now + self._settings.lead
        planned: list[tuple[DueJob, Occurrence]] = []
        for shard_id in fences:
            for job in by_shard[shard_id]:
                try:
                    planned.append((job, plan_occurrence(job, now, max(horizon, job.next_fire_at))))
                except Exception as error:  # one job's bad timing must not stop the others
                    await self._set_aside(job, "planning its occurrences", error)
        await self._write(planned, fences)

    async def _write(self, planned: list[tuple[DueJob, Occurrence]], fences: Mapping[int, ShardLease]) -> None:
        """Write planned occurrences in one fenced batch. A batch that fails for a reason other
        than the database being unreachable is split in halves until the job that makes it fail
        is found and set aside; the rest is written."""
        if not planned:
            return
        jobs = [job for job, _ in planned]
        occurrences = [occurrence for _, occurrence in planned]
        batch_fences = [fences[shard_id] for shard_id in sorted({job.shard_id for job in jobs})]
        try:
            written = await self._store.materialise_runs(batch_fences, occurrences)
        except StaleFence as stale:
            # Lost that shard; the others in the batch are still ours: try them again at once.
            self._on_stale(stale.shard_id, stale.token, str(stale))
            for job in jobs:
                if job.shard_id != stale.shard_id:
                    self._plan(job)
            return
        except StorageUnavailable as error:
            # The transaction may or may not have committed: planning the same occurrences again
            # is safe, since the write only applies to a job still at the expected fire time.
            log.warning("materialisation of %d jobs failed, retrying: %s", len(jobs), error)
            await self._pause(RETRY_AFTER_STORAGE_ERROR.total_seconds())
            for job in jobs:
                self._plan(job)
            return
        except Exception as error:
            if len(planned) == 1:
                await self._set_aside(jobs[0], "writing its runs", error)
                return
            log.warning("materialisation of %d jobs failed (%s): splitting the batch to find the job", len(jobs), error)
            middle = len(planned) // 2
            await self._write(planned[:middle], fences)
            await self._write(planned[middle:], fences)
            return
        self._metrics.materialised.inc(len(written.runs))
        for run in written.runs:
            self.schedule_run(run)
        for run in written.cancelling:
            self.forget_run(run.run_id)
        if written.cancelling:
            self._dispatch.cancel(written.cancelling)
        self._plan_next(jobs, occurrences, written.advanced)
        for job in written.changed:
            # Our copy was stale (changed through another node, or read before our own write
            # committed): continue from the job as it is now.
            self.job_changed(job)

    async def _set_aside(self, job: DueJob, step: str, error: Exception) -> None:
        """Take a job whose processing raised out of the due set, with the reason, so that it
        neither stops the node nor delays the other jobs. ``fastlane jobs resume`` takes it back."""
        error_id = new_error_id()
        reason = f"{step} raised {type(error).__name__}: {error} (error id {error_id})"[:MAX_ERROR_TEXT]
        log.error("job %s set aside (state errored): %s", job.job_id, reason, exc_info=error)
        self._metrics.set_aside.labels(kind="job").inc()
        try:
            await self._store.set_job_aside(job.job_id, reason)
        except StorageError as store_error:
            # Still active in the database: the next full scan brings it back to try again.
            log.warning("could not set job %s aside: %s", job.job_id, store_error)
            return
        self._metrics.jobs_errored.inc()

    def _plan_next(self, jobs: list[DueJob], occurrences: list[Occurrence], advanced: frozenset[str]) -> None:
        """Keep a recurring job in the window when its next occurrence falls inside it."""
        for job, occurrence in zip(jobs, occurrences, strict=True):
            upcoming = occurrence.next_fire_at
            if job.job_id not in advanced or upcoming is None or upcoming >= self._horizon:
                continue
            planned = self._planned_at.get(job.job_id)
            # A plan at or before the occurrence just written is stale (the database has moved
            # past it); a later one came from a newer change and wins.
            if planned is None or planned <= occurrence.expected_next_fire_at:
                self._plan(DueJob(job.job_id, job.shard_id, upcoming, job.timing))

    async def _load_loop(self) -> None:
        """Read what enters the window; now and then rescan all of it as a safety net."""
        interval = self._settings.scan_interval.total_seconds()
        last_full_scan = self._clock.now()
        while not self._stopping.is_set():
            await self._pause(interval)
            owned = self._owned_shards()
            if not owned or self._stopping.is_set():
                continue
            now = self._clock.now()
            lower, upper = self._horizon, now + self._settings.window
            full = now - last_full_scan >= self._settings.full_scan_interval
            # Claim the new horizon first: a materialisation that commits while this query runs
            # plans its next occurrence itself when it falls before the claimed horizon.
            self._horizon = max(upper, lower)
            try:
                jobs = await self._load_window(owned, self._horizon, at_or_after=None if full else lower)
                pending = await self._store.pending_runs(owned, self._horizon, skip=self._held) if full else []
            except StorageError as error:
                log.warning("window scan failed: %s", error)
                self._horizon = lower
                continue
            if full:
                last_full_scan = now
                await self._count_errored_jobs()
            await self._plan_loaded(jobs)
            if jobs:
                self._plan_wake.set()  # a crowd among them may need writing before the earliest job
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
        """Attempts whose worker stopped heartbeating go back to the queue (or die)."""
        while not self._stopping.is_set():
            await self._pause(EXPIRY_CHECK_EVERY.total_seconds())
            owned = self._owned_shards()
            if not owned or self._stopping.is_set():
                continue
            try:
                for shard_id in await self._store.shards_with_expired_leases(owned):
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


def write_start(planned_per_slot: Mapping[int, int], lead: timedelta, write_rate: float) -> tuple[datetime, datetime]:
    """When to start writing planned jobs, and up to which fire time to take them.

    ``planned_per_slot``: jobs planned per slot of fire time; ``write_rate``: occurrences written
    per second. Every job of a slot must be written ``lead`` before the slot begins, and writing
    the jobs of that slot and of all earlier ones takes their number over the write rate: the slot
    whose deadline comes first decides. In steady load that is the first slot (one batch per
    slot); when a crowd is due (100,000 jobs at one instant) it is the crowd's slot, seconds before
    its time, and batches follow one another until the crowd is written.
    """
    start = through = FAR_FUTURE
    written_by = 0
    for slot in sorted(planned_per_slot):
        written_by += planned_per_slot[slot]
        # A job due before the supported range (stored by an older version) is simply overdue:
        # its deadline is taken as the range's start, so the arithmetic below cannot underflow.
        slot_begins = max(_instant_of_slot(slot), FIRST_INSTANT)
        slot_start = slot_begins - lead - timedelta(seconds=written_by / write_rate)
        if slot_start < start:
            start, through = slot_start, slot_begins + SLOT
    return start, through


def _slot(instant: datetime) -> int:
    return (instant - EPOCH) // SLOT


def _instant_of_slot(slot: int) -> datetime:
    return EPOCH + slot * SLOT
