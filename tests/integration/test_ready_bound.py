"""Memory held for runs no worker takes is bounded: the ready queue of a job type stops at its
bound, the rest wait in the database, and once a worker comes every run fires exactly once.

The real fast lane, dispatcher and shard ownership on a real store (as in test_engine.py), with a
scripted worker session on the dispatcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from datetime import timedelta

import pytest

from fastlane.domain.models import AttemptOutcome, JobSpec, MisfirePolicy, RunState, Schedule
from fastlane.engine.dispatch import Assign, Dispatcher, WorkerSession
from fastlane.engine.lane import FastLane
from fastlane.engine.shards import ShardCallbacks, ShardOwnership
from fastlane.runtime.clock import SystemClock
from fastlane.runtime.metrics import Metrics
from fastlane.server.settings import Settings
from fastlane.storage import AttemptResult, open_store
from fastlane.testing import until

SHARDS = 4
BOUND = 5
PAYLOAD = b"x" * 4096


@pytest.fixture
async def store(db_url):  # type: ignore[no-untyped-def]
    store = open_store(db_url, shard_count=SHARDS)
    await store.migrate()
    yield store
    await store.close()


async def work(dispatcher: Dispatcher, session: WorkerSession, assigned: Counter[str]) -> None:
    """A worker that succeeds at once with every run it gets and gives the credit back."""
    while True:
        message = await session.outbox.get()
        if isinstance(message, Assign):
            assigned.update(item.run.run_id for item in message.runs)
            dispatcher.results(session, [
                AttemptResult(run_id=item.run.run_id, lease_token=item.lease_token, outcome=AttemptOutcome.SUCCEEDED)
                for item in message.runs
            ])
            dispatcher.grant(session, len(message.runs))


class Node:
    """The real fast lane, dispatcher and shard ownership of one node, with its tasks."""

    def __init__(self, store, settings: Settings, **dispatcher_args) -> None:  # type: ignore[no-untyped-def]
        self.metrics, clock = Metrics(), SystemClock()
        self.dispatcher = Dispatcher(store, node_id="node-a", clock=clock, metrics=self.metrics,
                                     reschedule=lambda run: self.lane.schedule_run(run), **dispatcher_args)
        self.ownership = ShardOwnership(store, node_id="node-a", ttl=timedelta(seconds=10), metrics=self.metrics,
                                        listener=ShardCallbacks(self._acquired, self._lost))
        self.lane = FastLane(store, settings=settings, clock=clock, metrics=self.metrics, shards=self.ownership,
                             on_stale=self.ownership.lost, dispatch=self.dispatcher)
        self.tasks: list[asyncio.Task[None]] = []

    async def _acquired(self, leases) -> None:  # type: ignore[no-untyped-def]
        await self.lane.shards_acquired(leases)

    def _lost(self, shard_ids) -> None:  # type: ignore[no-untyped-def]
        self.lane.shards_lost(shard_ids)
        self.dispatcher.drop_shards(shard_ids)


@contextlib.asynccontextmanager
async def running_node(store, settings: Settings, **dispatcher_args):  # type: ignore[no-untyped-def]
    """A node that owns every shard, stopped (and its extra ``tasks`` cancelled) on the way out."""
    node = Node(store, settings, **dispatcher_args)
    ready = asyncio.Event()
    node.tasks += [asyncio.create_task(node.ownership.run(ready)), asyncio.create_task(node.lane.run()),
                   asyncio.create_task(node.dispatcher.run())]
    core = len(node.tasks)
    try:
        await asyncio.wait_for(ready.wait(), 10)
        yield node
    finally:
        node.lane.stop()
        node.dispatcher.stop_assigning()
        await node.ownership.stop()
        node.dispatcher.stop()
        for task in node.tasks[core:]:
            task.cancel()
        await asyncio.wait_for(asyncio.gather(*node.tasks, return_exceptions=True), 10)


@pytest.mark.parametrize(
    "bound",
    [
        pytest.param({"max_ready_per_type": BOUND}, id="runs"),
        pytest.param({"max_ready_bytes_per_type": BOUND * len(PAYLOAD)}, id="bytes"),
    ],
)
async def test_the_ready_queue_stays_at_its_bound_without_workers_and_every_run_fires_once_after(store, bound):
    # A full scan every second: parked runs must not be read back (and sent) by it as well.
    settings = Settings(db_url="sqlite:///unused.db", shard_count=SHARDS, scan_interval=timedelta(milliseconds=200),
                        full_scan_interval=timedelta(seconds=1))
    assigned: Counter[str] = Counter()
    async with running_node(store, settings, **bound) as node:
        job, _ = await store.jobs.create_job(JobSpec(name="j", job_type="t", payload=PAYLOAD,
                                                schedule=Schedule.interval(timedelta(milliseconds=100))))
        node.lane.job_changed(job)

        # No worker: runs keep being released; memory holds at most BOUND of them.
        deepest = 0
        started = time.monotonic()
        while time.monotonic() - started < 3.0:
            deepest = max(deepest, node.dispatcher.ready_depth)
            await asyncio.sleep(0.02)
        assert node.dispatcher.ready_depth == BOUND and deepest == BOUND
        assert node.dispatcher.parked_count >= 10

        node.lane.job_changed(await store.jobs.pause_job("default", job.job_id))
        await asyncio.sleep(0.5)  # what was written ahead is released too

        session = node.dispatcher.connect("w", ["t"], 3, None)
        node.tasks.append(asyncio.create_task(work(node.dispatcher, session, assigned)))

        async def all_succeeded() -> bool:
            await node.dispatcher.flush(5)
            runs = (await store.runs.list_runs("default", job_id=job.job_id, limit=1000)).items
            return bool(runs) and all(run.state is RunState.SUCCEEDED for run in runs)

        await until(all_succeeded, 20.0)
        await asyncio.sleep(1.5)  # a full scan more: nothing is sent again
        runs = (await store.runs.list_runs("default", job_id=job.job_id, limit=1000)).items
        assert len(runs) >= 30
        assert {run.run_id for run in runs} == set(assigned)
        assert set(assigned.values()) == {1}, "a run was sent twice"
        assert {run.attempts for run in runs} == {1}
        assert node.dispatcher.ready_depth == 0 and node.dispatcher.parked_count == 0


async def test_a_queue_behind_its_workers_gets_no_new_runs_others_do_and_its_misfire_policy_decides_after(store):
    """Over --max-backlog runs of one job type and tenant waiting for a free credit, none of
    its runs are written while another job type's keep firing; once its workers catch up, the
    held job's missed occurrences are skipped by its misfire policy and every run written fires
    once."""
    settings = Settings(db_url="sqlite:///unused.db", shard_count=SHARDS, scan_interval=timedelta(milliseconds=200),
                        max_backlog=BOUND)
    assigned: Counter[str] = Counter()
    other_assigned: Counter[str] = Counter()
    every_100_ms = Schedule.interval(timedelta(milliseconds=100))
    async with running_node(store, settings) as node:
        busy = node.dispatcher.connect("w", ["t"], 0, None)  # connected, serving "t", no credit free
        free = node.dispatcher.connect("v", ["u"], 3, None)
        node.tasks.append(asyncio.create_task(work(node.dispatcher, free, other_assigned)))
        job, _ = await store.jobs.create_job(JobSpec(name="j", job_type="t", schedule=every_100_ms,
                                                misfire=MisfirePolicy(grace=timedelta(milliseconds=300))))
        other, _ = await store.jobs.create_job(JobSpec(name="k", job_type="u", schedule=every_100_ms))
        node.lane.job_changed(job)
        node.lane.job_changed(other)

        async def runs_of(job_id: str) -> int:
            return len((await store.runs.list_runs("default", job_id=job_id, limit=1000)).items)

        async def held() -> bool:
            return node.metrics.registry.get_sample_value("fastlane_write_ahead_held_jobs") == 1

        await until(held, 20.0)
        backlogs = node.dispatcher.backlogs()
        assert list(backlogs) == [("t", "default")] and backlogs["t", "default"] >= BOUND
        written, other_written = await runs_of(job.job_id), len(other_assigned)
        await asyncio.sleep(1.0)  # ten occurrences of each come due meanwhile
        assert await runs_of(job.job_id) == written
        assert len(other_assigned) >= other_written + 5, "another job type was held back too"
        assert await held()

        node.dispatcher.grant(busy, 3)
        node.tasks.append(asyncio.create_task(work(node.dispatcher, busy, assigned)))

        async def caught_up() -> bool:
            await node.dispatcher.flush(5)
            runs = (await store.runs.list_runs("default", job_id=job.job_id, limit=1000)).items
            return any(run.state is RunState.SKIPPED for run in runs) and len(assigned) > written

        await until(caught_up, 20.0)
        node.lane.job_changed(await store.jobs.pause_job("default", job.job_id))

        async def all_ended() -> bool:
            await node.dispatcher.flush(5)
            runs = (await store.runs.list_runs("default", job_id=job.job_id, limit=1000)).items
            return all(run.state in (RunState.SUCCEEDED, RunState.SKIPPED) for run in runs)

        await until(all_ended, 20.0)
        runs = (await store.runs.list_runs("default", job_id=job.job_id, limit=1000)).items
        assert {run.run_id for run in runs if run.state is RunState.SUCCEEDED} == set(assigned)
        assert set(assigned.values()) == {1}, "a run was sent twice"

        async def nothing_held() -> bool:
            return not await held()

        await until(nothing_held, 20.0)
