"""Write-ahead: the jobs of the window due soon, and their runs written a lead before they are due.

The *planned* heap holds jobs whose ``next_fire_at`` falls inside the window (before the
``horizon``), as slim :class:`DueJob` entries, in the order they are due (a fire time, or later by
the schedule's jitter). At least the *lead* (plus the send-ahead lead)
before each is due, their runs are materialised in a fenced batch and the job advanced; when more
jobs are due soon than can be written by then at the measured rate (a crowd at one instant),
writing starts early enough to finish. A batch that fails for a reason other than the database
being unreachable is split until the job that makes it fail is found; that job is set aside (state
``errored``) with its reason. Written runs go to the lane's release queue (:mod:`.lane`).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol

from fastlane.domain.errors import StaleFence, StorageError, StorageUnavailable, new_error_id
from fastlane.domain.jitter import due_instant
from fastlane.domain.limits import FIRST_INSTANT, MAX_ERROR_TEXT
from fastlane.domain.models import DueJob, Job, JobState, Run, ShardLease
from fastlane.domain.policies import plan_occurrence
from fastlane.engine.backlog import BacklogLimits
from fastlane.engine.fencing import Fencing
from fastlane.engine.lane_settings import LaneSettings
from fastlane.engine.waits import pause, sleep_until_woken
from fastlane.runtime.clock import EPOCH, Clock
from fastlane.runtime.metrics import Metrics
from fastlane.storage import Occurrence, Store

log = logging.getLogger("fastlane.lane")

FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)
RETRY_AFTER_STORAGE_ERROR = timedelta(milliseconds=500)
# Planned jobs are counted per slot of fire time, so the materialiser sees a crowd coming (say
# 100,000 jobs due at one instant) and starts writing it early enough to finish in time. In steady
# load a slot is also the span of fire times one materialisation takes together.
SLOT = timedelta(milliseconds=100)
INITIAL_WRITE_RATE = 5_000.0  # occurrences per second, until measured
RATE_SAMPLE_MIN = 200  # smaller batches are dominated by the round trip: not a rate sample
MAX_WRITTEN_AHEAD = 150_000  # runs written ahead of a crowd and waiting in memory, at most
# While jobs are deferred (their queue over its backlog limit), how often its backlog is looked at
# again. Short against the time a backlog at its limit takes to drain (2 s of its pace by default).
BACKLOG_RECHECK = timedelta(milliseconds=50)
# Jobs planned in one go when a scan reads many: every 30 s it reads the whole window, and with it
# the jobs deferred (a flooding tenant's tens of thousands). Planned at once they would stall the
# loop for as long as planning them all takes, and other tenants' runs would wait it out; a slice
# of 500 keeps each step short, with the loop free between slices.
PLAN_SLICE = 500
# The lead follows the writes: at least this many times the slowest of the recent batch writes
# (waiting for the database's writer included), so a write that slows down (an SQLite checkpoint,
# a busy disk, a slow machine) eats into slack rather than into the runs' instants. Capped well
# inside the window; the configured lead is the floor.
LEAD_PER_WRITE_TIME = 3
RECENT_WRITES = 32
MAX_ADAPTIVE_LEAD = timedelta(seconds=2)

class ReleaseQueue(Protocol):
    """Where written runs go: the lane's release on time (:class:`~fastlane.engine.release.ReleaseTimer`)."""

    def schedule_run(self, run: Run) -> None:
        """Release ``run`` on its instant."""
        ...

    def cancel_runs(self, runs: Sequence[Run]) -> None:
        """These runs were cancelled by the write (overlap ``cancel_previous``): drop them from
        memory and stop them at the dispatcher."""
        ...

    def written_ahead(self) -> int:
        """Runs written and waiting, for their instant or for a worker."""
        ...


class DispatchLoad(Protocol):
    """How far each queue is behind its workers, as the dispatcher counts it (:mod:`fastlane.engine.backlog`)."""

    def backlogs(self) -> Mapping[tuple[str, str], int]:
        """Released runs waiting for a free worker credit or their tenant's cap, by (job type, tenant)."""
        ...

    def assigned_totals(self) -> Mapping[tuple[str, str], int]:
        """Attempts assigned to workers since the node started, by (job type, tenant)."""
        ...


class WriteAhead:
    """The planned jobs of the window, and the loop that writes their runs ahead of time."""

    def __init__(
        self,
        store: Store,
        *,
        settings: LaneSettings,
        clock: Clock,
        metrics: Metrics,
        fencing: Fencing,
        release: ReleaseQueue,
        load: DispatchLoad,
        stopping: asyncio.Event,
    ) -> None:
        """``fencing``: the fence each write is conditioned on; ``release``: takes the runs
        written; ``load``: each queue's backlog and pace, from which its backlog limit follows
        (:mod:`fastlane.engine.backlog`) and so whether its due jobs are deferred."""
        self._store = store
        self._settings = settings
        # Runs are needed the send-ahead lead earlier than their instant (offered to workers then).
        self._send_ahead = settings.send_ahead
        self._lead = settings.lead + settings.send_ahead
        self._write_times: deque[float] = deque(maxlen=RECENT_WRITES)  # seconds per batch write
        metrics.write_lead.set(self._lead.total_seconds())
        self._clock = clock
        self._metrics = metrics
        # Bound once: called per job on the plan and write paths.
        self._fence = fencing.fence
        self._stale = fencing.stale
        self._release = release
        self._backlogs = load.backlogs
        self._limits = BacklogLimits(max_backlog=settings.max_backlog, seconds=settings.max_backlog_seconds,
                                     assigned_totals=load.assigned_totals)
        # Runs of this priority or more take credits kept for them (--priority-reserve): they do
        # not wait behind a backlog, so their jobs are deferred only while their queue is over
        # --max-backlog itself (a priority is the client's to choose: no tenant evades the bound).
        reserve = settings.priority_reserve
        self._urgent_priority = reserve.priority if reserve is not None else math.inf
        self._over_max_backlog: frozenset[tuple[str, str]] = frozenset()
        self._stopping = stopping
        # (fire time, job id, job): no sequence number to break ties, which would be one more
        # object per job, and the window holds jobs by the hundred thousand. A job's entry is live
        # while it is the job's entry in _planned_at; the others are dead and skipped when popped.
        self._planned: list[tuple[datetime, str, DueJob]] = []
        self._planned_at: dict[str, DueJob] = {}  # the one live heap entry per job
        self._planned_per_slot: Counter[int] = Counter()  # heap entries (live or dead) by fire slot
        # Due jobs taken from the heap while their queue was over its backlog, by queue and job id
        # in the order they fell due: unwritten (unchanged in the database) until the queue has
        # room again (see _pop_planned and _look_at_backlogs).
        self._deferred: dict[tuple[str, str], OrderedDict[str, DueJob]] = {}
        self._given_back: dict[str, tuple[str, str]] = {}  # deferred jobs planned again, not yet written: their queues
        self._backlogs_looked_at = -math.inf  # time.monotonic() of the last give-back
        self._write_rate = INITIAL_WRITE_RATE  # occurrences materialised per second (moving average)
        # Jobs with next_fire_at before the horizon are in memory (or being loaded); the lane's
        # loader moves it.
        self.horizon = clock.now() + settings.window
        self._plan_wake = asyncio.Event()

    @property
    def size(self) -> int:
        """Jobs planned (deferred ones included)."""
        return len(self._planned_at) + self.deferred

    @property
    def deferred(self) -> int:
        """Due jobs deferred because their queue is over its backlog. Also read by the metrics
        thread (through ``size``): list() takes the values in one step under the GIL."""
        return sum(map(len, list(self._deferred.values())))

    def wake(self) -> None:
        """Look at the planned jobs again now (a crowd among new ones may need writing early)."""
        self._plan_wake.set()

    def job_changed(self, job: Job) -> None:
        """A job was created or changed through this node: take the change into the window now."""
        if self._fence(job.shard_id) is None:
            return
        if job.state is JobState.ACTIVE and job.next_fire_at is not None and job.next_fire_at < self.horizon:
            self._undefer(job.job_id)  # its queue may have changed with it
            self._plan(DueJob.of(job))
        else:
            self.job_removed(job.job_id)

    def job_removed(self, job_id: str) -> None:
        # The heap entry stays but is dead: it no longer matches _planned_at when popped.
        self._planned_at.pop(job_id, None)
        self._undefer(job_id)

    def _undefer(self, job_id: str) -> None:
        self._given_back.pop(job_id, None)
        for jobs in self._deferred.values():
            jobs.pop(job_id, None)

    def drop_shards(self, lost: set[int]) -> None:
        """Forget the planned jobs of these shards at once."""
        self._planned = [entry for entry in self._planned if entry[2].shard_id not in lost]
        heapq.heapify(self._planned)
        self._planned_per_slot = Counter(_slot(at) for at, _, _ in self._planned)
        self._planned_at = {job.job_id: job for _, _, job in self._planned if self._planned_at.get(job.job_id) is job}
        for jobs in self._deferred.values():
            for job_id in [job_id for job_id, job in jobs.items() if job.shard_id in lost]:
                del jobs[job_id]

    async def plan_loaded(self, jobs: Iterable[DueJob]) -> None:
        """Plan jobs read from the database, :data:`PLAN_SLICE` at a time between which the loop
        runs what else is due; one the window cannot hold is set aside."""
        refused: list[tuple[DueJob, Exception]] = []
        for count, job in enumerate(jobs, start=1):
            if count % PLAN_SLICE == 0:
                await asyncio.sleep(0)
            if self._fence(job.shard_id) is None:
                continue
            deferred = self._deferred.get(job.queue)
            if deferred is not None and (deferred_copy := deferred.get(job.job_id)) is not None:
                if job.priority < self._urgent_priority:
                    if job.next_fire_at >= deferred_copy.next_fire_at:
                        deferred[job.job_id] = job  # the copy read, in the same place in line
                    continue
                del deferred[job.job_id]  # urgent now: planned, as any urgent job
            try:
                self._plan(job)  # a no-op when the heap already holds this fire time
            except Exception as error:  # a value no check caught (stored by an older version)
                refused.append((job, error))
        for job, raised in refused:
            await self._set_aside(job, "loading it into the window", raised)

    def _plan(self, job: DueJob) -> None:
        live = self._planned_at.get(job.job_id)
        if live is not None and live.next_fire_at == job.next_fire_at:
            return
        fire_at = due_instant(job)  # its fire time, or later by its schedule's jitter
        slot = _slot(fire_at)  # first: a fire time the heap cannot order raises before any change
        self._planned_at[job.job_id] = job
        heapq.heappush(self._planned, (fire_at, job.job_id, job))
        self._planned_per_slot[slot] += 1
        if self._planned[0][2] is job:
            self._plan_wake.set()

    # -- writing -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Write runs a short lead before they are due (earlier for a crowd), in fenced batches."""
        while not self._stopping.is_set():
            deferring = self._look_at_backlogs(time.monotonic())
            now = self._clock.now()
            start, through = write_start(self._planned_per_slot, self._lead, self._write_rate)
            if self._planned and self._release.written_ahead() >= MAX_WRITTEN_AHEAD:
                # Enough runs are written and waiting already, for their time or for workers (a
                # node behind its load): writing further ahead would only take time from sending
                # and fill memory, so write no further ahead than the lead.
                head = self._planned[0][0]
                start, through = max(start, head - self._lead), head + SLOT
            if start <= now:
                batch = self._pop_planned(catch_up_through(through, now, self._lead), deferring)
                if batch:
                    await self._timed_materialise(batch, now)
                    if self._deferred:
                        await asyncio.sleep(0)  # the lane releases what was written: the backlog counts it
                    continue
            delay = (start - now).total_seconds() if self._planned else 3600.0
            if self._deferred:
                next_look = self._backlogs_looked_at + BACKLOG_RECHECK.total_seconds() - time.monotonic()
                delay = min(delay, max(next_look, 0.001))
            await sleep_until_woken(self._plan_wake, self._stopping, delay)

    def _look_at_backlogs(self, now_s: float) -> frozenset[tuple[str, str]]:
        """The (job type, tenant) queues whose due jobs are to be deferred rather than written: those
        with at least their limit (:class:`~fastlane.engine.backlog.BacklogLimits`: ``--max-backlog``
        runs, or less by their pace) of due runs waiting for a worker credit or their tenant's cap
        (the capacity they get is less than is due), and those with deferred jobs still waiting, so
        that jobs falling due later line up behind them. Every :data:`BACKLOG_RECHECK` at most
        (``now_s``: ``time.monotonic()``), each queue below its limit gets back as many of its deferred
        jobs, oldest first, as it has room for: the limit, less its backlog, less the jobs it got
        back before that are not written yet. Room is counted in jobs; a job given back writes
        one run per occurrence its misfire policy keeps (one for ``fire_once``, the default).

        Written on, runs of a queue over its backlog could only wait, and writing them takes the
        node's time and the database's from runs that can start: offered more than it can take,
        a node writing every due run succeeds fewer runs a second than at its capacity. Its due
        jobs are deferred instead (unchanged in the database), and when they are planned again
        their misfire policy decides what of the missed occurrences runs. Giving back only the
        room keeps the queue near its limit: given back all at once, a flood's thousands would be
        written in one go, a burst that holds up other tenants' runs and sends the queue over its
        limit again. Other queues are written as usual.
        """
        self._limits.measure(now_s)
        limit = self._limits.limit
        backlogs = self._backlogs()
        over = {queue for queue, waiting in backlogs.items() if waiting >= limit(queue)}
        self._over_max_backlog = frozenset(q for q, waiting in backlogs.items() if waiting >= self._settings.max_backlog)
        if self._deferred and now_s - self._backlogs_looked_at >= BACKLOG_RECHECK.total_seconds():
            # Paced: runs given back count in the backlog only once written and released.
            self._backlogs_looked_at = now_s
            self._given_back = {job_id: queue for job_id, queue in self._given_back.items() if job_id in self._planned_at}
            unwritten = Counter(self._given_back.values())
            for queue in [queue for queue in self._deferred if queue not in over]:
                jobs = self._deferred[queue]
                for _ in range(min(len(jobs), limit(queue) - backlogs.get(queue, 0) - unwritten[queue])):
                    _, job = jobs.popitem(last=False)
                    self._given_back[job.job_id] = queue
                    if job.job_id not in self._planned_at:  # a newer plan (the job changed) wins
                        self._plan(job)
                if not jobs:
                    del self._deferred[queue]
        self._metrics.write_ahead_deferred.set(self.deferred)  # fastlane_write_ahead_held_jobs
        return frozenset(over.union(self._deferred))

    def _pop_planned(self, cutoff: datetime, deferring: frozenset[tuple[str, str]]) -> list[DueJob]:
        """Take the jobs due by ``cutoff``, at most a batch of them; those of a queue in
        ``deferring`` are deferred rather than taken, unless they were given back or are urgent (and
        their queue is within ``--max-backlog``)."""
        batch: list[DueJob] = []
        while self._planned and self._planned[0][0] <= cutoff and len(batch) < self._settings.max_batch:
            fire_at, _, job = heapq.heappop(self._planned)
            self._uncount(fire_at)
            if self._planned_at.get(job.job_id) is job:
                del self._planned_at[job.job_id]
                if (self._given_back.pop(job.job_id, None) is None and job.queue in deferring
                        and (job.priority < self._urgent_priority or job.queue in self._over_max_backlog)):
                    self._deferred.setdefault(job.queue, OrderedDict())[job.job_id] = job
                else:
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
        took = time.perf_counter() - started
        if len(jobs) >= RATE_SAMPLE_MIN:
            rate = len(jobs) / max(took, 1e-6)
            self._write_rate = 0.7 * self._write_rate + 0.3 * rate
        self._write_times.append(took)
        cap = min(MAX_ADAPTIVE_LEAD, self._settings.window / 2)
        self._lead = adaptive_lead(self._settings.lead, self._write_times, cap) + self._send_ahead
        self._metrics.write_lead.set(self._lead.total_seconds())

    async def _materialise(self, jobs: list[DueJob], now: datetime) -> None:
        by_shard: dict[int, list[DueJob]] = defaultdict(list)
        for job in jobs:
            by_shard[job.shard_id].append(job)
        fences = {fence.shard_id: fence for shard_id in by_shard if (fence := self._fence(shard_id)) is not None}
        # Occurrences up to the lead are written now; a job taken earlier than that (with its
        # slot, or ahead of a crowd) gets its own occurrence (plan_occurrence writes the first always).
        horizon = now + self._lead
        planned: list[tuple[DueJob, Occurrence]] = []
        for shard_id in fences:
            for job in by_shard[shard_id]:
                try:
                    planned.append((job, plan_occurrence(job, now, horizon)))
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
            written = await self._store.lane.materialise_runs(batch_fences, occurrences)
        except StaleFence as stale:
            # Lost that shard; the others in the batch are still ours: try them again at once.
            self._stale(stale.shard_id, stale.token, str(stale))
            for job in jobs:
                if job.shard_id != stale.shard_id:
                    self._plan(job)
            return
        except StorageUnavailable as error:
            # The transaction may or may not have committed: planning the same occurrences again
            # is safe, since the write only applies to a job still at the expected fire time.
            log.warning("materialisation of %d jobs failed, retrying: %s", len(jobs), error)
            await pause(self._stopping, RETRY_AFTER_STORAGE_ERROR.total_seconds())
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
        for policy, count in written.skipped.items():
            self._metrics.skipped.labels(policy=policy).inc(count)
        schedule_run = self._release.schedule_run
        for run in written.runs:
            schedule_run(run)
        if written.cancelling:
            self._release.cancel_runs(written.cancelling)
        self._plan_next(jobs, occurrences, written.advanced)
        for changed in written.changed:
            # Our copy was stale (changed through another node, or read before our own write
            # committed): continue from the job as it is now.
            self.job_changed(changed)

    async def _set_aside(self, job: DueJob, step: str, error: Exception) -> None:
        """Take a job whose processing raised out of the due set, with the reason, so that it
        neither stops the node nor delays the other jobs. ``fastlane jobs resume`` takes it back."""
        error_id = new_error_id()
        reason = f"{step} raised {type(error).__name__}: {error} (error id {error_id})"[:MAX_ERROR_TEXT]
        log.error("job %s set aside (state errored): %s", job.job_id, reason, exc_info=error)
        self._metrics.set_aside.labels(kind="job").inc()
        try:
            await self._store.jobs.set_job_aside(job.job_id, reason)
        except StorageError as store_error:
            # Still active in the database: the next full scan brings it back to try again.
            log.warning("could not set job %s aside: %s", job.job_id, store_error)
            return
        self._metrics.jobs_errored.inc()

    def _plan_next(self, jobs: list[DueJob], occurrences: list[Occurrence], advanced: frozenset[str]) -> None:
        """Keep a recurring job in the window when its next occurrence falls inside it."""
        for job, occurrence in zip(jobs, occurrences, strict=True):
            upcoming = occurrence.next_fire_at
            if job.job_id not in advanced or upcoming is None or upcoming >= self.horizon:
                continue
            planned = self._planned_at.get(job.job_id)
            # A plan at or before the occurrence just written is stale (the database has moved
            # past it); a later one came from a newer change and wins.
            if planned is None or planned.next_fire_at <= occurrence.expected_next_fire_at:
                self._plan(DueJob(job.job_id, job.shard_id, upcoming, job.timing, job.queue, job.priority))


def adaptive_lead(floor: timedelta, write_times: Iterable[float], cap: timedelta) -> timedelta:
    """How long before their instant to write runs, given recent batch write times in seconds:
    :data:`LEAD_PER_WRITE_TIME` times the slowest, within ``floor`` (the configured lead) and ``cap``."""
    slowest = timedelta(seconds=LEAD_PER_WRITE_TIME * max(write_times, default=0.0))
    return max(floor, min(slowest, cap))


def catch_up_through(through: datetime, now: datetime, lead: timedelta) -> datetime:
    """The last fire time a batch starting ``now`` takes: the slots :func:`write_start` chose,
    and every job that should be written by now (due within the lead). On time the two agree;
    behind (a slow write, a busy disk) the batch catches up at once. A batch costs mostly its
    round trips and its turn at the database's writer, so catching up one slot per batch would
    fall further behind at every slow write, and the runs of the slots left behind would be
    released late."""
    return max(through, now + lead)


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
