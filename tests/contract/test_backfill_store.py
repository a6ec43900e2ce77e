"""Jitter and backfills in the store, on each backend: a jittered schedule is stored and planned
as it was given, and a backfill writes the runs of past fire times once, in the job's lock."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from fastlane.domain.backfill import Occurrence as FireTime
from fastlane.domain.backfill import occurrences
from fastlane.domain.errors import JobNotFound
from fastlane.domain.jitter import run_instant
from fastlane.domain.models import DueJob, JobSpec, RunState, Schedule
from fastlane.domain.policies import plan_occurrence
from fastlane.domain.records import RunFilter
from fastlane.storage import Occurrence

SHARDS = 2
TTL = timedelta(seconds=30)
MINUTE = timedelta(minutes=1)


@pytest.fixture
async def store(make_store):
    store = make_store(shard_count=SHARDS)
    await store.migrate()
    yield store
    await store.close()


def interval_job(name: str = "hourly-report", *, every: timedelta = MINUTE, jitter: timedelta | None = None,
                 anchor: datetime | None = None, tenant: str = "default") -> JobSpec:
    return JobSpec(name=name, job_type="report", tenant=tenant, payload=b'{"n":1}',
                   schedule=Schedule.interval(every, anchor, jitter=jitter))


async def own_all(store):
    return {lease.shard_id: lease for lease in await store.shards.acquire_shards("node-a", TTL, limit=SHARDS)}


async def test_a_jittered_schedule_is_stored_and_its_runs_are_written_at_their_jittered_instants(store):
    leases = await own_all(store)
    job, _ = await store.jobs.create_job(interval_job(every=timedelta(seconds=10), jitter=timedelta(seconds=4)))
    job = await store.jobs.get_job("default", job.job_id)
    assert job.spec.schedule.jitter == timedelta(seconds=4)
    [due] = [d for d in await store.lane.load_due_jobs(set(leases), datetime.max.replace(tzinfo=UTC))
             if d.job_id == job.job_id]
    assert due.timing.recurrence is not None and due.timing.recurrence.jitter == timedelta(seconds=4)
    fire = job.next_fire_at
    assert fire is not None
    horizon = fire + timedelta(seconds=35)
    occurrence = plan_occurrence(due, fire, horizon)
    expected = [run_instant(job.job_id, job.spec.schedule, fire + timedelta(seconds=10 * k)) for k in range(4)]
    assert list(occurrence.fire_times) == expected
    assert all(timedelta(0) <= at - (fire + timedelta(seconds=10 * k)) < timedelta(seconds=4)
               for k, at in enumerate(expected))
    assert len(set(at - (fire + timedelta(seconds=10 * k)) for k, at in enumerate(expected))) > 1  # spread
    assert occurrence.next_fire_at == fire + timedelta(seconds=40)  # a fire time, not an instant
    written = await store.lane.materialise_runs([leases[job.shard_id]], [occurrence])
    assert sorted(run.scheduled_for for run in written.runs) == expected
    # Planned again after a restart (another node, the same rows): the same instants, no new run.
    again = plan_occurrence(DueJob.of(job), fire, horizon)
    assert list(again.fire_times) == expected
    assert (await store.lane.materialise_runs([leases[job.shard_id]], [again])).runs == []


async def test_a_backfill_writes_missed_fire_times_once_and_every_one_with_all(store):
    anchor = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)
    job, _ = await store.jobs.create_job(interval_job(anchor=anchor))
    past = occurrences(job.job_id, job.spec.schedule, anchor, anchor + timedelta(minutes=10), 100)
    assert len(past) == 10
    first = await store.backfills.write_backfill("default", job.job_id, "bf-1", past, missed_only=True,
                                                 buffered=True, dry_run=False)
    assert (first.written, first.already_run, first.beyond) == (10, 0, 0)
    # buffer_all: the oldest is free to start, the others wait their turn.
    [released] = first.scheduled
    assert released.scheduled_for == anchor and released.backfill_id == "bf-1" and released.manual
    page = await store.runs.list_runs("default", backfill_id="bf-1", limit=100)
    assert sorted(run.scheduled_for for run in page.items) == [o.instant for o in past]
    assert {run.state for run in page.items} == {RunState.SCHEDULED, RunState.BUFFERED}
    assert all(run.payload == b'{"n":1}' and run.job_type == "report" for run in page.items)
    # The same range again: nothing is missed any more.
    again = await store.backfills.write_backfill("default", job.job_id, "bf-2", past, missed_only=True,
                                                 buffered=True, dry_run=False)
    assert (again.written, again.already_run) == (0, 10)
    # A dry run counts and writes nothing; with all, every fire time gets a run beside its own.
    counted = await store.backfills.write_backfill("default", job.job_id, "bf-3", past, missed_only=False,
                                                   buffered=False, dry_run=True)
    assert counted.written == 10 and counted.scheduled == []
    assert (await store.runs.list_runs("default", backfill_id="bf-3")).items == []
    every = await store.backfills.write_backfill("default", job.job_id, "bf-3", past, missed_only=False,
                                                 buffered=False, dry_run=False)
    assert every.written == 10 and len(every.scheduled) == 10  # allow: all free to start
    assert await store.runs.count_runs("default", RunFilter(backfill_id="bf-3",
                                                            states=frozenset({RunState.SCHEDULED}))) == 10


async def test_a_backfill_takes_skipped_fire_times_and_leaves_the_schedules_own_to_it(store):
    leases = await own_all(store)
    job, _ = await store.jobs.create_job(interval_job(every=timedelta(seconds=1)))
    job = await store.jobs.get_job("default", job.job_id)
    start = job.next_fire_at
    assert start is not None
    second = timedelta(seconds=1)
    await store.lane.materialise_runs([leases[job.shard_id]], [Occurrence(
        job_id=job.job_id, expected_next_fire_at=start, fire_times=(start + 2 * second,),
        skipped_times=(start, start + second), next_fire_at=start + 3 * second)])
    fires = [FireTime(start + k * second, start + k * second) for k in range(5)]
    written = await store.backfills.write_backfill("default", job.job_id, "bf", fires, missed_only=True,
                                                   buffered=False, dry_run=False)
    # Skipped ones are missed; the one that has its run is not; start+3s on is the schedule's.
    assert (written.written, written.already_run, written.beyond) == (2, 1, 2)
    assert sorted(run.scheduled_for for run in written.scheduled) == [start, start + second]


async def test_a_backfill_never_reaches_another_tenants_job(store):
    job, _ = await store.jobs.create_job(interval_job(tenant="acme"))
    past = [FireTime(job.created_at - MINUTE, job.created_at - MINUTE)]
    with pytest.raises(JobNotFound):
        await store.backfills.write_backfill("globex", job.job_id, "bf", past, missed_only=True, buffered=True,
                                             dry_run=False)
    with pytest.raises(JobNotFound):
        await store.backfills.write_backfill("globex", job.job_id, "bf", past, missed_only=True, buffered=True,
                                             dry_run=True)
    written = await store.backfills.write_backfill("acme", job.job_id, "bf", past, missed_only=True,
                                                   buffered=True, dry_run=False)
    assert written.written == 1
    assert (await store.runs.list_runs("globex", backfill_id="bf")).items == []
    assert await store.runs.count_runs("globex", replace(RunFilter(backfill_id="bf"),
                                                         states=frozenset(RunState))) == 0
