"""Jitter: each run of a recurring schedule starts a fixed offset after its fire time, within the
jitter and before the next fire time, the same on every node; never earlier than its fire time."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastlane.domain.jitter import due_instant, jitter_offset, run_instant
from fastlane.domain.limits import MAX_JITTER
from fastlane.domain.models import DueJob, MisfireKind, MisfirePolicy, Schedule, Timing, queue_of
from fastlane.domain.policies import plan_occurrence
from fastlane.domain.schedules import next_fire_after, preview
from fastlane.domain.validation import validate_schedule
from fastlane.engine.write_ahead import WriteAhead
from fastlane.errors import InvalidArgument
from fastlane.rpc import wire
from fastlane.runtime.metrics import Metrics
from fastlane.server.settings import Settings
from fastlane.storage import codec
from fastlane.testing import ManualClock

T = datetime(2027, 3, 1, 9, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def test_an_offset_is_fixed_per_job_and_fire_time_and_differs_between_them():
    jitter = timedelta(minutes=10)
    offsets = {job: jitter_offset(job, T, T + HOUR, jitter) for job in (f"job-{n}" for n in range(200))}
    assert offsets == {job: jitter_offset(job, T, T + HOUR, jitter) for job in offsets}  # deterministic
    assert all(timedelta(0) <= offset < jitter for offset in offsets.values())
    assert len(set(offsets.values())) == 200  # a thousand jobs at :00 do not start together
    # Spread over the span: each tenth of it is hit.
    assert {int(offset / jitter * 10) for offset in offsets.values()} == set(range(10))
    assert jitter_offset("job-1", T, T + HOUR, jitter) != jitter_offset("job-1", T + HOUR, T + 2 * HOUR, jitter)


@settings(max_examples=300, deadline=None)
@given(job=st.text(min_size=1, max_size=40), gap_us=st.integers(1, 10**10), jitter_us=st.integers(1, 86_400 * 10**6))
def test_an_offset_is_never_negative_never_past_the_jitter_and_never_reaches_the_next_fire_time(job, gap_us, jitter_us):
    gap, jitter = timedelta(microseconds=gap_us), timedelta(microseconds=jitter_us)
    offset = jitter_offset(job, T, T + gap, jitter)
    assert timedelta(0) <= offset < max(jitter, timedelta(microseconds=1))
    assert T + offset < T + gap  # runs stay in the order of their fire times


def test_a_jitter_longer_than_a_gap_spreads_each_run_over_its_gap_only():
    every_minute = Schedule.cron_expr("* * * * *", jitter=timedelta(minutes=5))
    fires = preview(every_minute, T, 50)
    instants = [run_instant("job", every_minute, fire) for fire in fires]
    assert instants == sorted(instants) and len(set(instants)) == len(instants)
    assert all(fire <= at < next_fire_after(every_minute, fire) for fire, at in zip(fires, instants, strict=True))


def test_without_a_jitter_a_run_starts_on_its_fire_time():
    assert run_instant("job", Schedule.interval(HOUR), T) == T


def test_a_jitter_is_bounded_and_refused_on_a_one_shot_schedule():
    validate_schedule(Schedule.interval(HOUR, jitter=MAX_JITTER))
    with pytest.raises(InvalidArgument, match=r"spec\.schedule\.jitter"):
        validate_schedule(Schedule.interval(HOUR, jitter=MAX_JITTER + timedelta(microseconds=1)))
    with pytest.raises(InvalidArgument, match=r"spec\.schedule\.jitter"):
        validate_schedule(Schedule.cron_expr("0 * * * *", jitter=timedelta(seconds=-1)))
    with pytest.raises(InvalidArgument, match="a at schedule takes none"):
        validate_schedule(replace(Schedule.at_instant(T), jitter=timedelta(seconds=5)))
    with pytest.raises(InvalidArgument, match="a now schedule takes none"):
        validate_schedule(replace(Schedule.now(), jitter=timedelta(seconds=5)))


def test_a_jitter_travels_the_wire_and_the_store_and_a_zero_one_is_none():
    schedule = Schedule.cron_expr("0 9 * * *", "Europe/Paris", jitter=timedelta(seconds=90, microseconds=5))
    assert wire.schedule_from_pb(wire.schedule_to_pb(schedule)) == schedule
    assert codec.schedule_from_dict(codec.schedule_to_dict(schedule)) == schedule
    plain = Schedule.interval(HOUR, T)
    assert "jitter" not in codec.schedule_to_dict(plain)  # stored as before jitter existed
    zero = wire.schedule_to_pb(plain)
    zero.jitter.seconds = 0
    assert wire.schedule_from_pb(zero).jitter is None
    forged = wire.schedule_to_pb(plain)
    forged.jitter.seconds, forged.jitter.nanos = 5, -1
    with pytest.raises(InvalidArgument, match="jitter"):
        wire.schedule_from_pb(forged)


def _due(schedule: Schedule, job_id: str = "job-7", misfire: MisfirePolicy | None = None) -> DueJob:
    return DueJob(job_id, 0, T, Timing(schedule, misfire or MisfirePolicy()), queue_of("report", "default"), 0)


def test_occurrences_are_planned_at_their_instants_while_the_job_advances_by_fire_times():
    schedule = Schedule.interval(timedelta(minutes=1), T, jitter=timedelta(seconds=20))
    job = _due(schedule)
    expected = [run_instant(job.job_id, schedule, T + k * timedelta(minutes=1)) for k in range(3)]
    occurrence = plan_occurrence(job, T, expected[2])
    assert list(occurrence.fire_times) == expected
    assert occurrence.expected_next_fire_at == T and occurrence.next_fire_at == T + timedelta(minutes=3)
    assert due_instant(job) == expected[0]
    # A job taken before its instant (ahead of a crowd) gets its own occurrence, and only that.
    assert plan_occurrence(job, T, T).fire_times == (expected[0],)


def test_a_run_is_missed_by_its_instant_not_by_its_fire_time():
    # Written a lead before its instant, a run whose offset is longer than the grace is on time.
    schedule = Schedule.interval(HOUR, T, jitter=timedelta(minutes=30))
    job = _due(schedule, misfire=MisfirePolicy(kind=MisfireKind.SKIP, grace=timedelta(seconds=10)))
    instant = due_instant(job)
    assert instant - T > timedelta(seconds=10)  # this job id's offset is past the grace
    occurrence = plan_occurrence(job, instant - timedelta(seconds=1), instant)
    assert occurrence.fire_times == (instant,) and occurrence.skipped_times == ()


class _Nothing:
    """Fencing, release and load of a window that writes nothing."""

    def fence(self, shard_id: int) -> None:
        return None

    def stale(self, shard_id: int, fence_token: int, why: str) -> None:
        pass

    def backlogs(self) -> dict[tuple[str, str], int]:
        return {}

    def assigned_totals(self) -> dict[tuple[str, str], int]:
        return {}


def test_the_window_holds_a_jittered_job_at_its_instant():
    nothing = _Nothing()
    write_ahead = WriteAhead(
        None,  # type: ignore[arg-type]  # nothing here writes
        settings=Settings(db_url="sqlite:///unused.db"), clock=ManualClock(T), metrics=Metrics(),
        fencing=nothing, release=nothing, load=nothing, stopping=asyncio.Event(),  # type: ignore[arg-type]
    )
    jittered = _due(Schedule.interval(HOUR, T, jitter=timedelta(minutes=30)), "late-job")
    plain = _due(Schedule.interval(HOUR, T), "plain-job")
    write_ahead._plan(jittered)
    write_ahead._plan(plain)
    assert [(at, job.job_id) for at, _, job in sorted(write_ahead._planned)] == [
        (T, "plain-job"), (due_instant(jittered), "late-job")]
