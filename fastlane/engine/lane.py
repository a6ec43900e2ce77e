"""The fast lane: the next window of due work in memory, written ahead, released on time.

:class:`FastLane` composes the stages of the fire path that run in the node (the package
docstring of :mod:`fastlane.engine` names them all, in order):

- :class:`~fastlane.engine.window.WindowLoader` loads the window of owned shards (whole on
  acquisition, then what enters it) into the plan;
- :class:`~fastlane.engine.write_ahead.WriteAhead` plans the loaded jobs and writes their runs in
  fenced batches a lead before they are due;
- :class:`~fastlane.engine.release.ReleaseTimer` keeps the written runs until their instant and
  releases them to the dispatcher then, or offers them a little before to be sent ahead.

Beside them, the lane sends attempts whose lease expired (their worker stopped heartbeating) back
to the release queue. The lane is each stage's collaborator where a stage needs another: it is
the write-ahead's :class:`~fastlane.engine.write_ahead.ReleaseQueue` and the loader's
:class:`~fastlane.engine.window.Recovery`; :class:`~fastlane.engine.fencing.ShardFencing` is
their :class:`~fastlane.engine.fencing.Fencing`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from datetime import timedelta

from fastlane.domain.errors import StaleFence, StorageError
from fastlane.domain.models import Job, Run, ShardLease
from fastlane.engine.fencing import ShardFencing, ShardStale, ShardView
from fastlane.engine.lane_settings import LaneSettings
from fastlane.engine.release import LaneDispatcher, ReleaseTimer, RunsInMemory
from fastlane.engine.waits import pause
from fastlane.engine.window import WindowLoader
from fastlane.engine.write_ahead import WriteAhead
from fastlane.runtime.clock import Clock
from fastlane.runtime.metrics import Metrics
from fastlane.storage import Store

log = logging.getLogger("fastlane.lane")

EXPIRY_CHECK_EVERY = timedelta(seconds=1)
EXPIRY_SLACK = timedelta(milliseconds=50)  # after an attempt lease ends, before looking again


class FastLane:
    """Owns the in-memory window of the shards this node owns."""

    def __init__(
        self,
        store: Store,
        *,
        settings: LaneSettings,
        clock: Clock,
        metrics: Metrics,
        shards: ShardView,
        on_stale: ShardStale,
        dispatch: LaneDispatcher,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._dispatch = dispatch
        self._stopping = asyncio.Event()
        self._fencing = fencing = ShardFencing(shards, on_stale)
        self._release = ReleaseTimer(clock=clock, metrics=metrics, fencing=fencing, dispatch=dispatch,
                                     max_batch=settings.max_batch, stopping=self._stopping)
        self._write_ahead = WriteAhead(store, settings=settings, clock=clock, metrics=metrics, fencing=fencing,
                                       release=self, load=dispatch, stopping=self._stopping)
        self._in_memory = RunsInMemory(self._release.run_ids, dispatch)
        self._window = WindowLoader(store, settings=settings, clock=clock, metrics=metrics, shards=fencing,
                                    planner=self._write_ahead, recovery=self, in_memory=self._in_memory,
                                    stopping=self._stopping)
        metrics.heap_size.set_function(lambda: self.size)  # read when scraped, not kept up to date

    # -- what the rest of the node tells the lane -----------------------------------------------

    @property
    def size(self) -> int:
        return self._write_ahead.size + self._release.size

    def written_ahead(self) -> int:
        """Runs written and waiting, for their instant or for workers."""
        return self._release.size + self._dispatch.ready_depth

    async def shards_acquired(self, leases: Sequence[ShardLease]) -> None:
        """Rebuild the window of newly owned shards from the database."""
        await self._window.shards_acquired(leases)

    def shards_lost(self, shard_ids: Iterable[int]) -> None:
        """Forget everything of these shards at once: another node fires them now."""
        lost = set(shard_ids)
        self._write_ahead.drop_shards(lost)
        self._release.drop(lambda run: run.shard_id in lost)

    def job_changed(self, job: Job) -> None:
        """A job was created or changed through this node: take the change into the window now."""
        self._write_ahead.job_changed(job)

    def job_removed(self, job_id: str) -> None:
        self._write_ahead.job_removed(job_id)

    def schedule_run(self, run: Run, *, recovered: bool = False) -> None:
        """Release ``run`` at its ``available_at`` (a trigger, a retry, a rebuilt run).

        ``recovered``: read back from the database, so confirmed there before it is sent."""
        self._release.schedule_run(run, recovered=recovered)

    def cancel_runs(self, runs: Sequence[Run]) -> None:
        """Runs a write cancelled: forget them here, stop them at the dispatcher."""
        cancelled = {run.run_id for run in runs}
        if not cancelled.isdisjoint(self._release.run_ids):
            self._release.drop(lambda run: run.run_id in cancelled)
        self._dispatch.cancel(runs)

    def forget_run(self, run_id: str) -> None:
        """Drop a run waiting for its time (it was cancelled)."""
        if run_id in self._release.run_ids:
            self._release.drop(lambda run: run.run_id == run_id)

    def forget_job(self, job_id: str) -> None:
        """The job was deleted: drop it and its runs waiting for their time."""
        self.job_removed(job_id)
        self._release.drop(lambda run: run.job_id == job_id)

    # -- loops ----------------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._release.run(), name="lane-timer")
            group.create_task(self._write_ahead.run(), name="lane-materialise")
            group.create_task(self._window.run(), name="lane-load")
            group.create_task(self._expiry_loop(), name="lane-lease-expiry")

    def stop(self) -> None:
        self._stopping.set()
        self._write_ahead.wake()
        self._release.wake()

    async def _expiry_loop(self) -> None:
        """Attempts whose worker stopped heartbeating go back to the queue (or die): looked for
        every EXPIRY_CHECK_EVERY, and sooner when the earliest lease out ends before that."""
        wait = EXPIRY_CHECK_EVERY
        while not self._stopping.is_set():
            await pause(self._stopping, wait.total_seconds())
            wait = EXPIRY_CHECK_EVERY
            owned = self._fencing.owned()
            if not owned or self._stopping.is_set():
                continue
            try:
                expired = await self._store.lane.shards_with_expired_leases(owned)
                if expired:
                    # Results workers reported may still be in this node's journal (the database
                    # was away a while): landed first, they finish their runs instead of the
                    # expiry sending those runs out again.
                    await self._dispatch.journal_written(EXPIRY_CHECK_EVERY.total_seconds())
                for shard_id in expired:
                    fence = self._fencing.fence(shard_id)
                    if fence is None:
                        continue
                    try:
                        requeued = await self._store.lane.requeue_expired(fence)
                    except StaleFence as stale:
                        self._fencing.stale(stale.shard_id, stale.token, str(stale))
                        continue
                    self._metrics.lease_expiries.inc(len(requeued))
                    self._dispatch.forget_attempts(requeued)
                    for run in requeued:
                        self.schedule_run(run, recovered=True)
                next_expiry = await self._store.lane.next_lease_expiry(owned)
                if next_expiry is not None:
                    # Just after it ends (the database judges it): no sooner than EXPIRY_SLACK, so
                    # a lease the loop could not requeue (a stale fence) does not spin it.
                    wait = min(max(next_expiry + EXPIRY_SLACK, EXPIRY_SLACK), EXPIRY_CHECK_EVERY)
            except StorageError as error:
                log.warning("lease expiry check failed: %s", error)
