"""One job that makes the engine raise is set aside as ``errored``; every other job goes on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from test_engine import RecordingDispatch, start_engine, stop_engine, until

from fastlane.domain import policies
from fastlane.domain.errors import InvalidState, StorageError
from fastlane.domain.models import JobSpec, JobState, Schedule
from fastlane.engine import write_ahead as lane_module


def interval_job(name: str) -> JobSpec:
    return JobSpec(name=name, job_type="t", schedule=Schedule.interval(timedelta(milliseconds=200)))


async def test_a_job_whose_write_fails_is_set_aside_and_the_rest_of_its_batch_lands(store):
    poisoned, _ = await store.jobs.create_job(interval_job("poisoned"))
    healthy = [(await store.jobs.create_job(interval_job(f"healthy-{n}")))[0] for n in range(5)]
    real_materialise = store.lane.materialise_runs

    async def materialise_refusing_one_record(fences, occurrences):  # type: ignore[no-untyped-def]
        if any(occurrence.job_id == poisoned.job_id for occurrence in occurrences):
            raise StorageError("invalid byte sequence (test): the row cannot be written")
        return await real_materialise(fences, occurrences)

    store.lane.materialise_runs = materialise_refusing_one_record  # type: ignore[method-assign]
    dispatch = RecordingDispatch()
    engine = await start_engine(store, dispatch)
    try:
        await until(lambda: all(len(dispatch.times_of(job.job_id)) >= 3 for job in healthy))
        stored = await store.jobs.get_job("default", poisoned.job_id)
        assert stored.state is JobState.ERRORED
        assert stored.error is not None and "writing its runs raised StorageError" in stored.error
        assert "error id" in stored.error
        assert dispatch.times_of(poisoned.job_id) == []
        errored = await store.jobs.list_jobs("default", states=[JobState.ERRORED])
        assert [job.job_id for job in errored.items] == [poisoned.job_id]
        assert await store.jobs.count_jobs(JobState.ERRORED) == 1
    finally:
        await stop_engine(*engine)


async def test_a_job_whose_planning_raises_is_set_aside_and_resume_takes_it_back(store, monkeypatch):
    poisoned, _ = await store.jobs.create_job(interval_job("poisoned"))
    healthy, _ = await store.jobs.create_job(interval_job("healthy"))
    real_plan = policies.plan_occurrence

    def plan_raising_for_one(job, now, horizon):  # type: ignore[no-untyped-def]
        if job.job_id == poisoned.job_id:
            raise OverflowError("date value out of range (test)")
        return real_plan(job, now, horizon)

    monkeypatch.setattr(lane_module, "plan_occurrence", plan_raising_for_one)
    dispatch = RecordingDispatch()
    lane, ownership, tasks = await start_engine(store, dispatch)
    try:
        await until(lambda: len(dispatch.times_of(healthy.job_id)) >= 3)
        stored = await store.jobs.get_job("default", poisoned.job_id)
        assert stored.state is JobState.ERRORED
        assert "planning its occurrences raised OverflowError" in (stored.error or "")
        with pytest.raises(InvalidState):
            await store.jobs.pause_job("default", poisoned.job_id)  # only active jobs pause
        # The operator fixes the cause (here: the planner) and resumes the job.
        monkeypatch.setattr(lane_module, "plan_occurrence", real_plan)
        resumed = await store.jobs.resume_job("default", poisoned.job_id)
        assert resumed.state is JobState.ACTIVE and resumed.error is None
        lane.job_changed(resumed)
        resumed_at = datetime.now(UTC)
        await until(lambda: any(t > resumed_at for t in dispatch.times_of(poisoned.job_id)))
    finally:
        await stop_engine(lane, ownership, tasks)


async def test_a_job_stored_before_the_supported_range_does_not_stop_the_lane(store):
    """A job at year 1 (stored by a version that did not bound input) once made the write-ahead
    arithmetic overflow and the node exit, again on every restart."""
    ancient, _ = await store.jobs.create_job(interval_job("ancient"))
    healthy, _ = await store.jobs.create_job(interval_job("healthy"))
    year_one = datetime(1, 1, 2, tzinfo=UTC)  # (1-01-01 itself is -infinity to asyncpg: set aside)
    await store.jobs.update_job("default", ancient.job_id, JobSpec(
        name="ancient", job_type="t", schedule=Schedule.at_instant(datetime(2000, 1, 1, tzinfo=UTC))))
    await _force_next_fire_at(store, ancient.job_id, year_one)
    dispatch = RecordingDispatch()
    lane, ownership, tasks = await start_engine(store, dispatch)
    try:
        await until(lambda: len(dispatch.times_of(healthy.job_id)) >= 3)
        await until(lambda: dispatch.times_of(ancient.job_id) == [year_one])  # fired once, late: misfire policy
        assert not any(task.done() for task in tasks), "an engine loop stopped"
    finally:
        await stop_engine(lane, ownership, tasks)


async def _force_next_fire_at(store, job_id: str, when: datetime) -> None:  # type: ignore[no-untyped-def]
    """Write a value the API would refuse, as an older version could have stored it."""
    if type(store).__name__ == "PostgresStore":
        async with store.database._connection() as db:
            await db.execute("UPDATE jobs SET next_fire_at = $2 WHERE job_id = $1", job_id, when)
    else:
        from fastlane.runtime.clock import to_micros

        async with store.database._transaction() as db:
            await db.execute("UPDATE jobs SET next_fire_at = ? WHERE job_id = ?", (to_micros(when), job_id))
