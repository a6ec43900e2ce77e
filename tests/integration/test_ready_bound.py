"""Memory held for runs no worker takes is bounded: the ready queue of a job type stops at its
bound, the rest wait in the database, and once a worker comes every run fires exactly once.

The real fast lane, dispatcher and shard ownership on a real store (as in test_engine.py), with a
scripted worker session on the dispatcher.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import timedelta

import pytest

from fastlane.clock import SystemClock
from fastlane.config import Settings
from fastlane.domain.models import AttemptOutcome, JobSpec, RunState, Schedule
from fastlane.engine.dispatch import Assign, Dispatcher, WorkerSession
from fastlane.engine.lane import FastLane
from fastlane.engine.shards import ShardOwnership
from fastlane.metrics import Metrics
from fastlane.storage import AttemptResult, open_store

SHARDS = 4
BOUND = 5
PAYLOAD = b"x" * 4096


@pytest.fixture
async def store(db_url):  # type: ignore[no-untyped-def]
    store = open_store(db_url, shard_count=SHARDS)
    await store.migrate()
    yield store
    await store.close()


async def until(condition, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


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


@pytest.mark.parametrize(
    "bound",
    [
        pytest.param({"max_ready_per_type": BOUND}, id="runs"),
        pytest.param({"max_ready_bytes_per_type": BOUND * len(PAYLOAD)}, id="bytes"),
    ],
)
async def test_the_ready_queue_stays_at_its_bound_without_workers_and_every_run_fires_once_after(store, bound):
    metrics, clock = Metrics(), SystemClock()
    lane: FastLane | None = None
    dispatcher = Dispatcher(store, node_id="node-a", clock=clock, metrics=metrics,
                            reschedule=lambda run: lane.schedule_run(run), **bound)

    async def acquired(leases):  # type: ignore[no-untyped-def]
        await lane.shards_acquired(leases)

    # A full scan every second: parked runs must not be read back (and sent) by it as well.
    settings = Settings(db_url="sqlite:///unused.db", shard_count=SHARDS, scan_interval=timedelta(milliseconds=200),
                        full_scan_interval=timedelta(seconds=1))
    ownership = ShardOwnership(store, node_id="node-a", ttl=timedelta(seconds=10), metrics=metrics,
                               on_acquired=acquired, on_lost=lambda ids: (lane.shards_lost(ids), dispatcher.drop_shards(ids)))
    lane = FastLane(store, settings=settings, clock=clock, metrics=metrics, shards=ownership,
                    on_stale=ownership.lost, dispatch=dispatcher)
    ready = asyncio.Event()
    tasks = [asyncio.create_task(ownership.run(ready)), asyncio.create_task(lane.run()),
             asyncio.create_task(dispatcher.run())]
    assigned: Counter[str] = Counter()
    try:
        await asyncio.wait_for(ready.wait(), 10)
        job, _ = await store.create_job(JobSpec(name="j", job_type="t", payload=PAYLOAD,
                                                schedule=Schedule.interval(timedelta(milliseconds=100))))
        lane.job_changed(job)

        # No worker: runs keep being released; memory holds at most BOUND of them.
        deepest = 0
        started = time.monotonic()
        while time.monotonic() - started < 3.0:
            deepest = max(deepest, dispatcher.ready_depth)
            await asyncio.sleep(0.02)
        assert dispatcher.ready_depth == BOUND and deepest == BOUND
        assert dispatcher.parked_count >= 10

        lane.job_changed(await store.pause_job("default", job.job_id))
        await asyncio.sleep(0.5)  # what was written ahead is released too

        session = dispatcher.connect("w", ["t"], 3, None)
        tasks.append(asyncio.create_task(work(dispatcher, session, assigned)))

        async def all_succeeded() -> bool:
            await dispatcher.flush(5)
            runs = (await store.list_runs("default", job_id=job.job_id, limit=1000)).items
            return bool(runs) and all(run.state is RunState.SUCCEEDED for run in runs)

        await until(all_succeeded)
        await asyncio.sleep(1.5)  # a full scan more: nothing is sent again
        runs = (await store.list_runs("default", job_id=job.job_id, limit=1000)).items
        assert len(runs) >= 30
        assert {run.run_id for run in runs} == set(assigned)
        assert set(assigned.values()) == {1}, "a run was sent twice"
        assert {run.attempts for run in runs} == {1}
        assert dispatcher.ready_depth == 0 and dispatcher.parked_count == 0
    finally:
        lane.stop()
        dispatcher.stop_assigning()
        await ownership.stop()
        dispatcher.stop()
        for task in tasks[3:]:
            task.cancel()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
