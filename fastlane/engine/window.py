"""Load the window: the jobs due within the window (a lane setting, 10 s) of the shards this node owns, read into memory.

The window is loaded whole per shard on acquisition (with the runs written but never sent, which
are released again); afterwards the loader reads only what *enters* the window (a watermark, the
write-ahead's ``horizon``), jobs changed through this node arrive by direct call (``FastLane.job_changed``),
and a slower full scan (every ``full_scan_interval`` of the lane settings) is the safety net. What is read goes to the plan
(:class:`Planner`, the write-ahead); pending runs found go to the release queue (:class:`Recovery`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Container, Iterable, Sequence
from datetime import datetime
from typing import Protocol

from fastlane.domain.errors import StorageError
from fastlane.domain.models import DueJob, JobState, Run, ShardLease
from fastlane.engine.fencing import OwnedShards
from fastlane.engine.lane_settings import LaneSettings
from fastlane.engine.waits import pause
from fastlane.engine.write_ahead import FAR_FUTURE
from fastlane.runtime.clock import Clock
from fastlane.runtime.metrics import Metrics
from fastlane.storage import Store

log = logging.getLogger("fastlane.lane")

SCAN_PAGE = 20_000  # jobs read by one window query


class Planner(Protocol):
    """Where loaded jobs go (:class:`~fastlane.engine.write_ahead.WriteAhead`)."""

    horizon: datetime  # jobs due before it are in memory; the loader moves it

    async def plan_loaded(self, jobs: Iterable[DueJob]) -> None: ...

    def wake(self) -> None:
        """Look at the planned jobs again now (a crowd among new ones may need writing early)."""
        ...


class Recovery(Protocol):
    """Where runs read back from the database go: the lane's release queue, confirmed first."""

    def schedule_run(self, run: Run, *, recovered: bool = False) -> None: ...


class WindowLoader:
    """Reads the window of owned shards into the plan: whole on acquisition, then what enters it."""

    def __init__(self, store: Store, *, settings: LaneSettings, clock: Clock, metrics: Metrics, shards: OwnedShards,
                 planner: Planner, recovery: Recovery, in_memory: Container[str], stopping: asyncio.Event) -> None:
        self._store = store
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self._shards = shards
        self._planner = planner
        self._recovery = recovery
        self._in_memory = in_memory  # runs a scan of pending runs need not read again
        self._stopping = stopping

    async def shards_acquired(self, leases: Sequence[ShardLease]) -> None:
        """Load the whole window of newly owned shards, and release again their runs written but
        never sent (or waiting for a retry)."""
        shard_ids = [lease.shard_id for lease in leases]
        jobs = await self._load(shard_ids, self._planner.horizon, at_or_after=None)
        await self._planner.plan_loaded(jobs)
        self._planner.wake()  # a crowd among them may need writing before the earliest job
        runs = await self._store.lane.pending_runs(shard_ids, FAR_FUTURE, skip=self._in_memory)
        for run in runs:
            self._recovery.schedule_run(run, recovered=True)
        log.info("window rebuilt for %d shards: %d jobs due, %d runs pending", len(shard_ids), len(jobs), len(runs))

    async def run(self) -> None:
        """Read what enters the window; now and then rescan all of it as a safety net."""
        interval = self._settings.scan_interval.total_seconds()
        last_full_scan = self._clock.now()
        while not self._stopping.is_set():
            await pause(self._stopping, interval)
            owned = self._shards.owned()
            if not owned or self._stopping.is_set():
                continue
            now = self._clock.now()
            planner = self._planner
            lower, upper = planner.horizon, now + self._settings.window
            full = now - last_full_scan >= self._settings.full_scan_interval
            # Claim the new horizon first: a materialisation that commits while this query runs
            # plans its next occurrence itself when it falls before the claimed horizon.
            planner.horizon = max(upper, lower)
            try:
                jobs = await self._load(owned, planner.horizon, at_or_after=None if full else lower)
                pending = (await self._store.lane.pending_runs(owned, planner.horizon, skip=self._in_memory)
                           if full else [])
            except StorageError as error:
                log.warning("window scan failed: %s", error)
                planner.horizon = lower
                continue
            if full:
                last_full_scan = now
                await self._count_errored_jobs()
            await planner.plan_loaded(jobs)
            if jobs:
                planner.wake()  # a crowd among them may need writing before the earliest job
            for run in pending:
                # Runs this node does not have in memory (a failed send, a retry decided
                # elsewhere): the dispatcher confirms each in the database before sending, so one
                # queued elsewhere in this node is not sent twice.
                self._recovery.schedule_run(run, recovered=True)

    async def _count_errored_jobs(self) -> None:
        try:
            self._metrics.jobs_errored.set(await self._store.jobs.count_jobs(JobState.ERRORED))
        except StorageError as error:
            log.warning("could not count errored jobs: %s", error)

    async def _load(self, shard_ids: list[int], before: datetime, *, at_or_after: datetime | None) -> list[DueJob]:
        """Every due job of these shards in the range, read in pages so no query is unbounded."""
        jobs: list[DueJob] = []
        after: tuple[datetime, str] | None = None
        while True:
            page = await self._store.lane.load_due_jobs(
                shard_ids, before, at_or_after=at_or_after, after_job=after, limit=SCAN_PAGE
            )
            jobs += page
            if len(page) < SCAN_PAGE:
                return jobs
            after = (page[-1].next_fire_at, page[-1].job_id)
