"""Bounded input and arithmetic that cannot overflow: each case once stopped a node."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from fastlane._proto import common_pb2 as pb
from fastlane.domain import validation
from fastlane.domain.limits import LAST_INSTANT, MAX_ATTEMPTS
from fastlane.domain.models import DueJob, JobSpec, MisfirePolicy, RetryPolicy, Schedule, Timing
from fastlane.domain.policies import backoff_delay, next_retry_at, plan_occurrence
from fastlane.domain.schedules import first_fire, next_fire_after
from fastlane.engine.write_ahead import write_start
from fastlane.errors import InvalidArgument
from fastlane.rpc import wire
from fastlane.storage import codec

NOW = datetime(2027, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("base", [timedelta(microseconds=1), timedelta(seconds=1)])
def test_backoff_of_the_last_allowed_attempt_is_capped_not_overflowed(base: timedelta) -> None:
    policy = RetryPolicy(max_attempts=MAX_ATTEMPTS, backoff_base=base, backoff_cap=timedelta(minutes=5))
    rng = random.Random(3)
    for failed in (48, 68, 100, MAX_ATTEMPTS):
        assert timedelta(0) <= backoff_delay(policy, failed, rng) <= timedelta(minutes=5)
    assert next_retry_at(policy, attempts_made=MAX_ATTEMPTS - 1, first_attempt_at=NOW, now=NOW, rng=rng) is not None


def test_an_interval_whose_next_occurrence_is_past_the_range_ends_instead_of_raising() -> None:
    schedule = Schedule.interval(timedelta(days=8000 * 366), anchor=NOW + timedelta(seconds=3))
    assert next_fire_after(schedule, NOW) == NOW + timedelta(seconds=3)
    assert next_fire_after(schedule, NOW + timedelta(seconds=3)) is None
    due = DueJob("j", 0, NOW + timedelta(seconds=3), Timing(schedule, MisfirePolicy()), ("t", "default"), 0)
    occurrence = plan_occurrence(due, NOW + timedelta(seconds=3), NOW + timedelta(seconds=4))
    assert occurrence.fire_times == (NOW + timedelta(seconds=3),) and occurrence.next_fire_at is None


def test_schedules_end_at_the_last_supported_instant() -> None:
    near_end = LAST_INSTANT - timedelta(seconds=1)
    assert next_fire_after(Schedule.cron_expr("* * * * * *"), near_end) is None
    assert next_fire_after(Schedule.interval(timedelta(seconds=1), anchor=NOW), near_end) is None
    assert first_fire(Schedule.interval(timedelta(days=1), anchor=LAST_INSTANT), NOW) is None


def test_write_ahead_of_a_job_due_before_the_supported_range_does_not_overflow() -> None:
    year_one = datetime(1, 1, 1, tzinfo=UTC)
    slot = (year_one - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=100)
    start, through = write_start({slot: 1}, timedelta(milliseconds=250), 5_000.0)
    assert start < datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=1) and through > start


@pytest.mark.parametrize(
    ("seconds", "nanos"), [(10**18, 0), (-(10**18), 0), (5, -1), (-5, 1), (1, 1_000_000_000)]
)
def test_a_duration_outside_protobufs_range_is_an_invalid_argument(seconds: int, nanos: int) -> None:
    with pytest.raises(InvalidArgument, match="spec.lease_ttl"):
        wire.spec_from_pb(pb.JobSpec(name="j", job_type="t", schedule=pb.Schedule(now=pb.Now()),
                                     lease_ttl=Duration(seconds=seconds, nanos=nanos)))


@pytest.mark.parametrize("seconds", [-62_135_596_800, 253_402_300_799, 2**62, -(2**62), -1])
def test_an_instant_outside_the_supported_range_is_an_invalid_argument(seconds: int) -> None:
    with pytest.raises(InvalidArgument, match="spec.schedule.at"):
        wire.spec_from_pb(pb.JobSpec(name="j", job_type="t", schedule=pb.Schedule(at=Timestamp(seconds=seconds))))


@pytest.mark.parametrize(
    ("spec_change", "field"),
    [
        ({"lease_ttl": timedelta(days=9000 * 366)}, "spec.lease_ttl"),
        ({"retry": RetryPolicy(max_attempts=MAX_ATTEMPTS + 1)}, "spec.retry.max_attempts"),
        ({"retry": RetryPolicy(backoff_base=timedelta(days=30), backoff_cap=timedelta(days=30))}, "spec.retry.backoff_base"),
        ({"misfire": MisfirePolicy(grace=timedelta(days=10_000))}, "spec.misfire.grace"),
        ({"misfire": MisfirePolicy(fire_all_cap=10**9)}, "spec.misfire.fire_all_cap"),
        ({"timeout": timedelta(days=3650)}, "spec.timeout"),
        ({"schedule": Schedule.interval(timedelta(days=8000 * 366))}, "spec.schedule.interval.every"),
        ({"schedule": Schedule.at_instant(datetime(1, 1, 1, tzinfo=UTC))}, "spec.schedule.at"),
        ({"name": "nul\x00byte"}, "spec.name"),
        ({"job_type": "x" * 201}, "spec.job_type"),
        ({"payload": b"x" * 11}, "spec.payload"),
    ],
)
def test_every_bounded_field_is_refused_naming_it(spec_change: dict, field: str) -> None:
    spec = JobSpec(name="j", job_type="t", schedule=Schedule.now())
    fields = {**{name: getattr(spec, name) for name in ("name", "job_type", "schedule")}, **spec_change}
    with pytest.raises(InvalidArgument, match=field.replace(".", r"\.")):
        validation.validate_spec(JobSpec(**fields), max_payload=10)


@pytest.mark.parametrize("value", ["", "x" * 201, "a\x00b", "tab\there", "\x7f"])
def test_identifiers_are_bounded_and_have_no_control_characters(value: str) -> None:
    with pytest.raises(InvalidArgument, match="job_id"):
        validation.identifier("job_id", value)


@pytest.mark.parametrize("token", ["5b5d", "zz", "7b7d", "5b315d", "5b2261225d" + "00" * 600, "5b747275655d"])
def test_page_tokens_are_opaque_and_checked(token: str) -> None:
    with pytest.raises(InvalidArgument, match="page_token"):
        codec.decode_page_token(token, int, str)


def test_a_page_token_made_by_the_store_is_accepted() -> None:
    assert codec.decode_page_token(codec.encode_page_token(12, "run-1"), int, str) == [12, "run-1"]
