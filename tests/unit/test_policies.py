"""Misfire planning and retry backoff: pure decisions, exact expectations."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from fastlane.domain.models import (
    DueJob,
    Job,
    JobSpec,
    JobState,
    MisfireKind,
    MisfirePolicy,
    RetryPolicy,
    Schedule,
)
from fastlane.domain.policies import backoff_delay, next_retry_at, plan_occurrence

T0 = datetime(2027, 1, 1, 12, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)


def interval_job(kind: MisfireKind = MisfireKind.FIRE_ONCE, *, grace: float = 5, cap: int = 100,
                 next_fire_at: datetime = T0) -> DueJob:
    spec = JobSpec(
        name="j", job_type="t", schedule=Schedule.interval(10 * SECOND, anchor=T0),
        misfire=MisfirePolicy(kind=kind, grace=grace * SECOND, fire_all_cap=cap),
    )
    return DueJob.of(Job(job_id="job-1", shard_id=0, spec=spec, state=JobState.ACTIVE, next_fire_at=next_fire_at,
                         created_at=T0, updated_at=T0))


def test_an_on_time_occurrence_fires_alone_and_advances_the_job():
    occurrence = plan_occurrence(interval_job(), now=T0 - 0.2 * SECOND, horizon=T0 + 0.1 * SECOND)
    assert occurrence.fire_times == (T0,)
    assert occurrence.skipped_times == ()
    assert occurrence.next_fire_at == T0 + 10 * SECOND
    assert occurrence.expected_next_fire_at == T0


def test_lateness_within_the_grace_period_still_fires_every_occurrence():
    now = T0 + 24 * SECOND  # every occurrence is late, none by more than the 30 s grace
    occurrence = plan_occurrence(interval_job(grace=30), now=now, horizon=now)
    assert occurrence.fire_times == (T0, T0 + 10 * SECOND, T0 + 20 * SECOND)
    assert occurrence.next_fire_at == T0 + 30 * SECOND


@pytest.mark.parametrize(
    ("kind", "fired", "skipped"),
    [
        (MisfireKind.FIRE_ONCE, [30], [0, 10, 20]),
        (MisfireKind.FIRE_ALL, [0, 10, 20, 30], []),
        (MisfireKind.SKIP, [], [0, 10, 20, 30]),
    ],
)
def test_missed_occurrences_follow_the_misfire_policy(kind, fired, skipped):
    now = T0 + 36 * SECOND  # occurrences at 0, 10, 20, 30 are all more than 5 s late
    occurrence = plan_occurrence(interval_job(kind), now=now, horizon=now)
    assert occurrence.fire_times == tuple(T0 + s * SECOND for s in fired)
    assert occurrence.skipped_times == tuple(T0 + s * SECOND for s in skipped)
    assert occurrence.next_fire_at == T0 + 40 * SECOND


def test_fire_once_fires_the_latest_missed_occurrence_besides_the_on_time_ones():
    now = T0 + 31 * SECOND  # 0, 10, 20 missed; 30 is within the grace
    occurrence = plan_occurrence(interval_job(MisfireKind.FIRE_ONCE), now=now, horizon=now)
    assert occurrence.fire_times == (T0 + 20 * SECOND, T0 + 30 * SECOND)
    assert occurrence.skipped_times == (T0, T0 + 10 * SECOND)


def test_fire_all_is_capped_to_the_latest_occurrences():
    now = T0 + 56 * SECOND
    occurrence = plan_occurrence(interval_job(MisfireKind.FIRE_ALL, cap=2), now=now, horizon=now)
    assert occurrence.fire_times == (T0 + 40 * SECOND, T0 + 50 * SECOND)
    assert occurrence.skipped_times == (T0, T0 + 10 * SECOND, T0 + 20 * SECOND, T0 + 30 * SECOND)


def test_a_missed_one_shot_is_fired_once_or_skipped():
    spec = JobSpec(name="j", job_type="t", schedule=Schedule.at_instant(T0))
    job = Job(job_id="j", shard_id=0, spec=spec, state=JobState.ACTIVE, next_fire_at=T0, created_at=T0, updated_at=T0)
    late = T0 + timedelta(hours=1)
    assert plan_occurrence(DueJob.of(job), now=late, horizon=late).fire_times == (T0,)
    skip = Job(job_id="j", shard_id=0, spec=JobSpec(name="j", job_type="t", schedule=Schedule.at_instant(T0),
               misfire=MisfirePolicy(kind=MisfireKind.SKIP)), state=JobState.ACTIVE, next_fire_at=T0,
               created_at=T0, updated_at=T0)
    planned = plan_occurrence(DueJob.of(skip), now=late, horizon=late)
    assert planned.fire_times == () and planned.skipped_times == (T0,) and planned.next_fire_at is None


def test_backoff_has_full_jitter_below_an_exponential_ceiling():
    policy = RetryPolicy(backoff_base=SECOND, backoff_cap=8 * SECOND)
    rng = random.Random(7)
    for failures, ceiling in [(1, 1), (2, 2), (3, 4), (4, 8), (5, 8), (9, 8)]:
        delays = [backoff_delay(policy, failures, rng) for _ in range(200)]
        assert all(timedelta(0) <= d <= ceiling * SECOND for d in delays)
        # Full jitter: spread over the whole range, not clustered at the ceiling.
        assert min(delays) < ceiling * SECOND * 0.2 and max(delays) > ceiling * SECOND * 0.8


def test_retries_stop_when_attempts_or_time_are_spent():
    rng = random.Random(1)
    policy = RetryPolicy(max_attempts=3, max_retry_time=10 * SECOND, backoff_base=SECOND, backoff_cap=SECOND)
    assert next_retry_at(policy, attempts_made=2, first_attempt_at=T0, now=T0, rng=rng) is not None
    assert next_retry_at(policy, attempts_made=3, first_attempt_at=T0, now=T0, rng=rng) is None
    assert next_retry_at(policy, attempts_made=1, first_attempt_at=T0, now=T0 + 10 * SECOND, rng=rng) is None
