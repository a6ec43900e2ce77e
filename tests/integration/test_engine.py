"""The engine in-process on a real store: fast lane, dispatcher and shard ownership together."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from fastlane.domain.errors import StorageUnavailable
from fastlane.domain.models import Delivery, JobSpec, Run, RunState, Schedule
from fastlane.engine.dispatch import Assign, Dispatcher
from fastlane.engine.lane import FastLane
from fastlane.engine.shards import ShardCallbacks, ShardOwnership
from fastlane.runtime.clock import SystemClock
from fastlane.runtime.metrics import Metrics
from fastlane.server.settings import Settings
from fastlane.storage import open_store
from fastlane.testing import until

SHARDS = 4


class RecordingDispatch:
    """Stands in for the dispatcher: remembers what the lane released."""

    def __init__(self) -> None:
        self.released: list[Run] = []
        self.confirmed_first: set[str] = set()  # runs released to be confirmed in the database first
        self.arrived = asyncio.Event()

    def release(self, runs: Iterable[Run], *, confirm_first: bool = False) -> None:
        runs = list(runs)
        self.released.extend(runs)
        if confirm_first:
            self.confirmed_first.update(run.run_id for run in runs)
        self.arrived.set()

    def cancel(self, runs: Iterable[Run]) -> None:
        pass

    def forget_attempts(self, runs: Iterable[Run]) -> None:
        pass

    def holds(self, run_id: str) -> bool:
        return False

    ready_depth = 0

    def backlogs(self) -> dict[tuple[str, str], int]:
        return {}

    def assigned_totals(self) -> dict[tuple[str, str], int]:
        return {}

    ahead_lead = timedelta(0)  # no worker holds runs sent ahead: every run is released on its instant

    def offer_ahead(self, runs: Iterable[Run]) -> list[Run]:
        return list(runs)

    def watch_ahead(self, wake) -> None:  # type: ignore[no-untyped-def]
        pass

    async def journal_written(self, timeout: float) -> None:
        pass  # no journal: nothing is ever pending

    def times_of(self, job_id: str) -> list[datetime]:
        # A run released again from the database (the full scan's sweep) is confirmed by the real
        # dispatcher before it is sent; here, count each run once.
        unique = {run.run_id: run for run in self.released if run.job_id == job_id}
        return [run.scheduled_for for run in unique.values()]


@pytest.fixture
async def store(db_url):
    store = open_store(db_url, shard_count=SHARDS)
    await store.migrate()
    yield store
    await store.close()


async def start_engine(store, dispatch, **settings):  # type: ignore[no-untyped-def]
    config = Settings(db_url="sqlite:///unused.db", shard_count=SHARDS, scan_interval=timedelta(milliseconds=200),
                      **settings)
    metrics = Metrics()
    lane: FastLane | None = None

    async def acquired(leases):  # type: ignore[no-untyped-def]
        await lane.shards_acquired(leases)

    ownership = ShardOwnership(store, node_id="node-a", ttl=timedelta(seconds=10), metrics=metrics,
                               listener=ShardCallbacks(acquired, lambda ids: lane.shards_lost(ids)))
    lane = FastLane(store, settings=config, clock=SystemClock(), metrics=metrics, shards=ownership,
                    on_stale=ownership.lost, dispatch=dispatch)
    ready = asyncio.Event()
    tasks = [asyncio.create_task(ownership.run(ready)), asyncio.create_task(lane.run())]
    await asyncio.wait_for(ready.wait(), 10)
    return lane, ownership, tasks


async def stop_engine(lane, ownership, tasks) -> None:  # type: ignore[no-untyped-def]
    lane.stop()
    await ownership.stop()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)


async def test_a_job_changed_through_another_node_fires_on_its_new_schedule(store, db_url):
    dispatch = RecordingDispatch()
    engine = await start_engine(store, dispatch, full_scan_interval=timedelta(seconds=2))
    lane = engine[0]
    try:
        job, _ = await store.jobs.create_job(JobSpec(name="j", job_type="t",
                                                schedule=Schedule.interval(timedelta(milliseconds=300))))
        lane.job_changed(job)  # created through this node
        await until(lambda: len(dispatch.times_of(job.job_id)) >= 2)
        # Another node (another connection) changes the schedule; this node hears nothing of it.
        other = open_store(db_url, shard_count=SHARDS)
        try:
            await other.jobs.update_job("default", job.job_id, replace(job.spec, schedule=Schedule.interval(
                timedelta(milliseconds=700), anchor=datetime.now(UTC))))
        finally:
            await other.close()
        changed_at = datetime.now(UTC)
        # The full scan (every 2 s here) finds the change; the stale copy in the heap must not
        # keep the job from firing.
        await until(lambda: len([t for t in dispatch.times_of(job.job_id) if t > changed_at]) >= 3, timeout=20)
        later = sorted(t for t in dispatch.times_of(job.job_id) if t > changed_at + timedelta(seconds=1))
        assert {b - a for a, b in zip(later, later[1:], strict=False)} <= {timedelta(milliseconds=700)}
    finally:
        await stop_engine(*engine)


async def test_the_lane_stops_even_while_the_database_fails(store):
    dispatch = RecordingDispatch()
    lane, ownership, tasks = await start_engine(store, dispatch)
    failing = asyncio.Event()

    async def unavailable(*args, **kwargs):  # type: ignore[no-untyped-def]
        failing.set()
        raise StorageUnavailable("database down (test)")

    store.lane.materialise_runs = unavailable  # type: ignore[method-assign]
    job, _ = await store.jobs.create_job(JobSpec(name="j", job_type="t",
                                            schedule=Schedule.interval(timedelta(milliseconds=100))))
    lane.job_changed(job)
    await asyncio.wait_for(failing.wait(), 10)
    lane.stop()
    done, _ = await asyncio.wait([tasks[1]], timeout=5)
    assert done, "the lane kept running after stop()"
    await ownership.stop()
    tasks[0].cancel()


async def test_a_stale_fence_from_an_old_token_keeps_the_new_lease(store):
    metrics = Metrics()
    lost: list[int] = []

    async def acquired(leases):  # type: ignore[no-untyped-def]
        pass

    ownership = ShardOwnership(store, node_id="node-a", ttl=timedelta(seconds=10), metrics=metrics,
                               listener=ShardCallbacks(acquired, lost.extend))
    ready = asyncio.Event()
    task = asyncio.create_task(ownership.run(ready))
    try:
        await asyncio.wait_for(ready.wait(), 10)
        lease = ownership.fence(0)
        assert lease is not None
        ownership.lost(0, lease.token - 1, "refused write from an earlier lease")
        assert ownership.fence(0) == lease and lost == []
        ownership.lost(0, lease.token, "refused write with the current lease")
        assert ownership.fence(0) is None and lost == [0]
    finally:
        await ownership.stop()
        task.cancel()


async def test_a_run_released_twice_is_sent_once(store):
    job, _ = await store.jobs.create_job(JobSpec(name="j", job_type="t", schedule=Schedule.now()))
    run = await store.runs.create_manual_run("default", job.job_id)
    dispatcher = Dispatcher(store, node_id="n", clock=SystemClock(), metrics=Metrics(), reschedule=lambda run: None)
    journal = asyncio.create_task(dispatcher.run())
    try:
        session = dispatcher.connect("w", ["t"], credits=10, tenant=None)
        dispatcher.release([run])  # written by this node: sent at once
        dispatcher.release([run], confirm_first=True)  # the same run found again in the database
        await dispatcher.flush(5)
        await until(lambda: not dispatcher.holds(run.run_id))  # every send, fast or confirmed, settled
        sent = []
        while not session.outbox.empty():
            message = session.outbox.get_nowait()
            if isinstance(message, Assign):
                sent += [item.run.run_id for item in message.runs]
        assert sent == [run.run_id]
        assert session.credits == 9
    finally:
        dispatcher.stop()
        await asyncio.wait_for(journal, 5)


async def test_runs_recovered_from_the_database_are_released_to_be_confirmed_first(store):
    """Only the runs read back from the database (not this node's own writes) go to the dispatcher
    with confirm_first, also when runs of both kinds fall due at the same instant."""
    dispatch = RecordingDispatch()
    engine = await start_engine(store, dispatch)
    lane = engine[0]
    try:
        instant = datetime.now(UTC) + timedelta(milliseconds=100)
        runs = [Run(run_id=f"run-{index}", job_id=f"job-{index}", tenant="default", job_type="t", shard_id=index % SHARDS,
                    scheduled_for=instant, available_at=instant, state=RunState.SCHEDULED, attempts=0, payload=b"",
                    priority=0, manual=False, delivery=Delivery.AT_LEAST_ONCE, lease_ttl=timedelta(seconds=30),
                    created_at=instant, updated_at=instant) for index in range(6)]
        for index, run in enumerate(runs):
            lane.schedule_run(run, recovered=index % 2 == 1)
        await until(lambda: len(dispatch.released) == len(runs))
        assert {run.run_id for run in dispatch.released} == {run.run_id for run in runs}
        assert dispatch.confirmed_first == {"run-1", "run-3", "run-5"}
        assert lane.size == 0
    finally:
        await stop_engine(*engine)


async def test_a_window_larger_than_one_page_is_loaded_whole(store, monkeypatch):
    from fastlane.engine import window as lane_module

    monkeypatch.setattr(lane_module, "SCAN_PAGE", 3)
    at = datetime.now(UTC) + timedelta(seconds=1)
    jobs = [(await store.jobs.create_job(JobSpec(name=f"j{i}", job_type="t", schedule=Schedule.at_instant(at))))[0]
            for i in range(8)]
    dispatch = RecordingDispatch()
    engine = await start_engine(store, dispatch)  # the rebuild reads the window in pages of 3
    try:
        await until(lambda: all(dispatch.times_of(job.job_id) for job in jobs))
        assert sorted(len(dispatch.times_of(job.job_id)) for job in jobs) == [1] * 8
    finally:
        await stop_engine(*engine)


async def test_a_crowd_due_at_one_instant_is_written_before_it(store):
    # 600 jobs due together and a lead of 10 ms: written only a lead ahead, most of them would
    # still be being written at the instant. The lane sees the crowd and starts early enough.
    dispatch = RecordingDispatch()
    at, engine = await crowd_and_engine(store, dispatch, 600, lead=timedelta(milliseconds=10))
    try:
        await until(lambda: len(crowd_runs(dispatch, at)) >= 600, timeout=20)
        # created_at is when the insert statement that wrote the run began (one time per statement,
        # so that a batch's runs share it in memory): the crowd's writing began before the instant.
        # Judged instead by when the writer saw its commit, the check would also count the event
        # loop resuming the writer, which a busy machine delays without any write being late.
        runs = [await store.runs.get_run("default", run.run_id) for run in crowd_runs(dispatch, at)]
        late = [run.created_at - at for run in runs if run.created_at >= at]
        assert late == [], f"{len(late)} of 600 runs were written after their instant (worst {max(late)})"
    finally:
        await stop_engine(*engine)


async def crowd_and_engine(store, dispatch, count: int, **settings):  # type: ignore[no-untyped-def]
    """Create ``count`` jobs due at one instant, then start an engine that has a second and a
    half left before it.

    Setting up takes about two seconds here and several on a busy machine: a crowd whose instant
    comes before the engine could see it proves nothing, so a new crowd is made further ahead
    (the older one's runs are told apart by their instant).
    """
    ahead = timedelta(seconds=3)
    for attempt in range(4):
        at = (datetime.now(UTC) + ahead).replace(microsecond=0) + timedelta(seconds=1)
        for index in range(count):
            spec = JobSpec(name=f"crowd-{attempt}-{index}", job_type="t", schedule=Schedule.at_instant(at))
            await store.jobs.create_job(spec)
        engine = await start_engine(store, dispatch, **settings)
        if at - datetime.now(UTC) >= timedelta(seconds=1.5):
            return at, engine
        await stop_engine(*engine)
        ahead *= 2
    raise AssertionError(f"setting up a crowd of {count} took more than {ahead / 2}, four times over")


def crowd_runs(dispatch: RecordingDispatch, at: datetime) -> list[Run]:
    return list({run.run_id: run for run in dispatch.released if run.scheduled_for == at}.values())


async def test_ownership_reports_unhealthy_while_the_database_is_unreachable(store):
    async def acquired(leases):  # type: ignore[no-untyped-def]
        pass

    ownership = ShardOwnership(store, node_id="node-a", ttl=timedelta(seconds=1), metrics=Metrics(),
                               listener=ShardCallbacks(acquired, lambda ids: None))
    ready = asyncio.Event()
    task = asyncio.create_task(ownership.run(ready))
    real_db_now = store.db_now

    async def unreachable():  # type: ignore[no-untyped-def]
        raise StorageUnavailable("database down (test)")

    try:
        await asyncio.wait_for(ready.wait(), 10)
        assert ownership.healthy
        store.db_now = unreachable  # type: ignore[method-assign]
        await until(lambda: not ownership.healthy)
        store.db_now = real_db_now  # type: ignore[method-assign]
        await until(lambda: ownership.healthy)
    finally:
        store.db_now = real_db_now  # type: ignore[method-assign]
        await ownership.stop()
        task.cancel()


class SkewedClock:
    """This host's clock, ``skew`` ahead of the database's."""

    def __init__(self, skew: timedelta) -> None:
        self.skew = skew

    def now(self) -> datetime:
        return datetime.now(UTC) + self.skew


class SlowClockReads:
    """A store whose database clock takes ``delay`` to answer, as from a node too busy to read it."""

    def __init__(self, store, delay: float) -> None:  # type: ignore[no-untyped-def]
        self._store = store
        self._delay = delay

    async def db_now(self) -> datetime:
        answer = await self._store.db_now()
        await asyncio.sleep(self._delay)
        return answer

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._store, name)


class FailingOver:
    """A store that can be told it found another database server (as after a failover)."""

    def __init__(self, store) -> None:  # type: ignore[no-untyped-def]
        self._store = store
        self.server_epoch = 0

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._store, name)


async def test_a_node_on_another_database_server_drops_every_shard_and_acquires_it_again(store):
    acquisitions: list[list[int]] = []
    lost: list[int] = []

    async def acquired(leases):  # type: ignore[no-untyped-def]
        acquisitions.append(sorted(lease.token for lease in leases))

    metrics = Metrics()
    failing_over = FailingOver(store)
    ownership = ShardOwnership(failing_over, node_id="node-a", ttl=timedelta(seconds=9),  # type: ignore[arg-type]
                               metrics=metrics, listener=ShardCallbacks(acquired, lost.extend))
    ready = asyncio.Event()
    task = asyncio.create_task(ownership.run(ready))
    try:
        await asyncio.wait_for(ready.wait(), 10)
        before = dict(ownership.leases)
        assert len(before) == SHARDS and not lost
        failing_over.server_epoch = 1
        ownership.wake()
        await until(lambda: len(acquisitions) == 2 and len(ownership.leases) == SHARDS, timeout=10)
        assert sorted(lost) == sorted(before)  # every window dropped, not only some
        # Released on the new server, so taken again at once, with new tokens.
        assert all(ownership.leases[shard].token > before[shard].token for shard in before)
        assert metrics.database_server_changes._value.get() == 1
    finally:
        await ownership.stop()
        await asyncio.wait_for(task, 10)


async def own_shards_with(store, clock) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    """How many shards a node with this store and clock comes to own, and its note."""
    async def acquired(leases):  # type: ignore[no-untyped-def]
        pass

    ownership = ShardOwnership(store, node_id="node-a", ttl=timedelta(seconds=9), metrics=Metrics(),
                               listener=ShardCallbacks(acquired, lambda ids: None), clock=clock,
                               max_clock_offset=timedelta(milliseconds=500))
    ready = asyncio.Event()
    task = asyncio.create_task(ownership.run(ready))
    await until(lambda: ownership.note or ownership.leases, timeout=10)
    owned, note = len(ownership.leases), ownership.note
    await ownership.stop()
    await asyncio.wait_for(task, 10)
    return owned, note


async def test_a_node_whose_clock_is_off_owns_no_shards(store):
    owned, note = await own_shards_with(store, SkewedClock(timedelta(seconds=2)))
    assert owned == 0 and "clock offset" in note


async def test_a_slow_reading_of_the_database_clock_is_not_taken_for_a_skew(store):
    # The answer takes 1.2 s: the measured offset is -0.6 s, but it is only known to within 0.6 s.
    owned, note = await own_shards_with(SlowClockReads(store, 1.2), SkewedClock(timedelta(0)))
    assert owned == SHARDS and note == ""
