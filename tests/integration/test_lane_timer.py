"""The fast lane's timer on the wall clock: runs due a fraction of a millisecond apart are released
on their instants, never early, and the timer sleeps between them instead of spinning.

On uvloop, the node's event loop (and so this test's), the loop's own timer runs a wait of less
than half a millisecond at once, so a timer built on it passed through its loop many times for
every run of a flood due 0.25 ms apart, and kept the loop thread busy between instants
(``fastlane.engine.release``, ``ReleaseTimer.run``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import uvloop

from fastlane.domain.models import Delivery, Run, RunState
from fastlane.engine.dispatch import Dispatcher
from fastlane.engine.lane import FastLane
from fastlane.runtime.clock import SystemClock
from fastlane.runtime.metrics import Metrics
from fastlane.server.settings import Settings
from fastlane.storage import open_store

RUNS = 200
APART = timedelta(microseconds=250)
WAIT = 10.0  # seconds, at most, for the runs (due within 70 ms) to be released


class OwnedShards:
    """Every shard is owned (fenced); the load and expiry loops have nothing to scan."""

    def fence(self, shard_id: int) -> object:
        return True

    def owned(self) -> list[int]:
        return []


def run_due_at(index: int, instant: datetime) -> Run:
    return Run(run_id=f"r{index:03}", job_id=f"job-{index:03}", tenant="default", job_type="t", shard_id=0,
               scheduled_for=instant, available_at=instant, state=RunState.SCHEDULED, attempts=0, payload=b"{}",
               priority=0, manual=False, delivery=Delivery.AT_LEAST_ONCE, lease_ttl=timedelta(seconds=30),
               created_at=instant, updated_at=instant)


def test_runs_due_a_quarter_millisecond_apart_are_released_on_time_without_spinning(sqlite_url: str) -> None:
    released, sleeps = uvloop.run(release_runs_due_apart(sqlite_url))
    early = [(run.run_id, (run.available_at - at).total_seconds() * 1e6) for at, run in released if at < run.available_at]
    assert early == [], f"released before their instant (µs early): {early}"
    assert sorted(run.run_id for _, run in released) == [f"r{index:03}" for index in range(RUNS)]
    # One sleep per instant at most, and a few for the wakes that scheduling runs sets off.
    assert sleeps <= RUNS + 20, f"{sleeps} sleeps for {RUNS} runs: the timer spun between instants"


async def release_runs_due_apart(sqlite_url: str) -> tuple[list[tuple[datetime, Run]], int]:
    """Schedule :data:`RUNS` runs :data:`APART` in a lane; return each release (when, which run) and
    how many times the timer slept."""
    store = open_store(sqlite_url, shard_count=4)  # never opened: no worker, so nothing is written
    clock, metrics = SystemClock(), Metrics()
    dispatcher = Dispatcher(store, node_id="node-a", clock=clock, metrics=metrics, reschedule=lambda run: None)
    lane = FastLane(store, settings=Settings(db_url=sqlite_url, shard_count=4), clock=clock, metrics=metrics,
                    shards=OwnedShards(), on_stale=lambda *args: None, dispatch=dispatcher)
    released: list[tuple[datetime, Run]] = []
    release = dispatcher.release

    def recording_release(runs: Sequence[Run], **options: bool) -> None:
        now = datetime.now(UTC)
        released.extend((now, run) for run in runs)
        release(runs, **options)

    sleeps = 0
    next_wake = lane._release._next_wake

    def counting_next_wake(now: datetime, ahead: timedelta) -> datetime:
        nonlocal sleeps
        sleeps += 1  # called once for every sleep of the timer
        return next_wake(now, ahead)

    dispatcher.release = recording_release  # type: ignore[method-assign]
    lane._release._next_wake = counting_next_wake  # type: ignore[method-assign]
    task = asyncio.create_task(lane.run(), name="test-lane")
    try:
        first = datetime.now(UTC) + timedelta(milliseconds=20)
        for index in range(RUNS):
            lane.schedule_run(run_due_at(index, first + index * APART))
        deadline = asyncio.get_running_loop().time() + WAIT
        while len(released) < RUNS:
            assert asyncio.get_running_loop().time() < deadline, f"{len(released)} of {RUNS} released"
            await asyncio.sleep(0.01)
    finally:
        lane.stop()
        await asyncio.wait_for(task, WAIT)
    return released, sleeps
