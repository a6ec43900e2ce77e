"""A backfill walks its range a bounded part per call: where a part starts and stops, what its
token carries on, and what it refuses (the store's writes have their own contract tests)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest

from fastlane.domain.backfill import BackfillMode, Occurrence, fire_times
from fastlane.domain.errors import JobNotFound
from fastlane.domain.jitter import run_instant
from fastlane.domain.models import Job, JobSpec, JobState, OverlapPolicy, Schedule
from fastlane.domain.workflows import WORKFLOW_JOB_TYPE
from fastlane.engine.backfill import BackfillRequest, backfill_part
from fastlane.errors import InvalidArgument
from fastlane.storage import codec
from fastlane.storage.backfills import BackfillWrite

NOW = datetime(2027, 3, 1, 12, 0, tzinfo=UTC)
ANCHOR = NOW - timedelta(days=1)
MINUTE = timedelta(minutes=1)


def _job(schedule: Schedule, next_fire_at: datetime | None = NOW + MINUTE) -> Job:
    return Job(job_id="job-1", shard_id=0, state=JobState.ACTIVE, next_fire_at=next_fire_at, created_at=ANCHOR,
               updated_at=ANCHOR, spec=JobSpec(name="report", job_type="report", schedule=schedule))


@dataclass
class _Store:
    """The two parts of a store a backfill step uses: the job, and a record of what it was asked to write."""

    job: Job
    writes: list[tuple[str, list[Occurrence], bool, bool, bool]] = field(default_factory=list)

    @property
    def jobs(self) -> _Store:
        return self

    @property
    def backfills(self) -> _Store:
        return self

    async def get_job(self, tenant: str, job_id: str) -> Job:
        if tenant != "default" or job_id != self.job.job_id:
            raise JobNotFound(job_id)
        return self.job

    async def write_backfill(self, tenant: str, job_id: str, backfill_id: str, occurrences: Sequence[Occurrence], *,
                             missed_only: bool, buffered: bool, dry_run: bool) -> BackfillWrite:
        self.writes.append((backfill_id, list(occurrences), missed_only, buffered, dry_run))
        return BackfillWrite(written=len(occurrences))


async def _part(store: _Store, **asked: object) -> object:
    return await backfill_part(store, "default", "job-1", BackfillRequest(**asked), NOW)  # type: ignore[arg-type]


async def test_a_range_is_walked_in_parts_that_carry_the_backfill_on_to_its_end():
    store = _Store(_job(Schedule.interval(MINUTE, ANCHOR, jitter=timedelta(seconds=30))))
    start = NOW - timedelta(minutes=25)
    first = await _part(store, start=start, end=NOW - timedelta(minutes=5), limit=8)
    assert first.matched == 8 and first.next_page_token
    assert first.covered_until == start + 7 * MINUTE + timedelta(microseconds=1)
    parts = [first]
    while parts[-1].next_page_token:
        parts.append(await _part(store, limit=8, page_token=parts[-1].next_page_token))
    assert [part.matched for part in parts] == [8, 8, 4]
    assert {part.backfill_id for part in parts} == {first.backfill_id}
    assert parts[-1].covered_until == NOW - timedelta(minutes=5) and not parts[-1].next_page_token
    walked = [occurrence for _, written, *_ in store.writes for occurrence in written]
    assert [o.fire_time for o in walked] == [start + k * MINUTE for k in range(20)]
    assert all(o.instant == run_instant("job-1", store.job.spec.schedule, o.fire_time) for o in walked)
    # The defaults: missed only, buffered one at a time.
    assert {(missed, buffered, dry) for _, _, missed, buffered, dry in store.writes} == {(True, True, False)}


async def test_fire_times_after_now_are_left_to_the_schedule():
    store = _Store(_job(Schedule.cron_expr("*/10 * * * *")))
    done = await _part(store, start=NOW - timedelta(minutes=30), end=NOW + timedelta(days=3), mode=BackfillMode.ALL,
                       overlap=OverlapPolicy.ALLOW)
    assert done.matched == 3 and done.covered_until == NOW and not done.next_page_token
    [(_, written, missed, buffered, _)] = store.writes
    assert [o.fire_time for o in written] == [NOW - timedelta(minutes=m) for m in (30, 20, 10)]
    assert (missed, buffered) == (False, False)


async def test_a_token_keeps_its_backfill_and_refuses_to_be_reused_otherwise():
    store = _Store(_job(Schedule.interval(MINUTE, ANCHOR)))
    first = await _part(store, start=NOW - timedelta(hours=1), end=NOW, limit=5)
    token = first.next_page_token
    with pytest.raises(InvalidArgument, match="mode: differs"):
        await _part(store, page_token=token, mode=BackfillMode.ALL)
    with pytest.raises(InvalidArgument, match="overlap: differs"):
        await _part(store, page_token=token, overlap=OverlapPolicy.ALLOW)
    other = _Store(replace(store.job, job_id="job-2"))
    with pytest.raises(InvalidArgument, match="page_token"):
        await backfill_part(other, "default", "job-2", BackfillRequest(page_token=token), NOW)  # type: ignore[arg-type]
    forged = [
        "zz", codec.encode_page_token("bf", "job-1", 0, 10, "missed", "buffer_all"),
        codec.encode_page_token("bf", "job-1", 10, 0, "missed", "buffer_all", 5),  # cursor outside the range
        codec.encode_page_token("bf", "job-1", 0, 10**18, "missed", "buffer_all", 5),  # past any datetime
        codec.encode_page_token("bf", "job-1", -10, 10, "missed", "buffer_all", 5),  # before 1970
        codec.encode_page_token("bf", "job-1", 0, 10, "sometimes", "buffer_all", 5),
        codec.encode_page_token("bf", "job-1", 0, 10, "missed", "skip", 5),
        codec.encode_page_token("b\x01f", "job-1", 0, 10, "missed", "buffer_all", 5),
    ]
    for bad in forged:
        with pytest.raises(InvalidArgument, match="page_token"):
            await _part(store, page_token=bad)


@pytest.mark.parametrize(("asked", "field", "problem"), [
    ({}, "start", "is required"),
    ({"start": NOW - MINUTE}, "end", "is required"),
    ({"start": NOW - MINUTE, "end": NOW - 2 * MINUTE}, "end", "later than start"),
    ({"start": NOW + MINUTE, "end": NOW + 2 * MINUTE}, "start", "not in the past"),
    ({"start": NOW - MINUTE, "end": NOW, "overlap": OverlapPolicy.SKIP}, "overlap", "buffer_all or allow"),
    ({"start": datetime(1960, 1, 1, tzinfo=UTC), "end": NOW}, "start", "supported range"),
])
async def test_a_new_backfill_refuses_a_range_or_policy_it_cannot_run(asked, field, problem):
    store = _Store(_job(Schedule.interval(MINUTE, ANCHOR)))
    with pytest.raises(InvalidArgument, match=f"{field}: .*{problem}"):
        await _part(store, **asked)
    assert store.writes == []


async def test_a_one_shot_job_a_workflows_job_and_another_tenants_job_have_no_backfill():
    once = _Store(_job(Schedule.at_instant(NOW - MINUTE), next_fire_at=None))
    with pytest.raises(InvalidArgument, match="fires once"):
        await _part(once, start=NOW - timedelta(hours=1), end=NOW)
    workflow = _Store(replace(_job(Schedule.interval(MINUTE, ANCHOR)), spec=JobSpec(
        name="nightly", job_type=WORKFLOW_JOB_TYPE, schedule=Schedule.interval(MINUTE, ANCHOR))))
    with pytest.raises(InvalidArgument, match="workflow's schedule"):
        await _part(workflow, start=NOW - timedelta(hours=1), end=NOW)
    assert workflow.writes == []
    store = _Store(_job(Schedule.interval(MINUTE, ANCHOR)))
    with pytest.raises(JobNotFound):
        await backfill_part(store, "acme", "job-1", BackfillRequest(start=NOW - MINUTE, end=NOW), NOW)  # type: ignore[arg-type]


def test_a_ranges_fire_times_include_its_start_and_exclude_its_end():
    schedule = Schedule.interval(MINUTE, ANCHOR)
    assert list(fire_times(schedule, ANCHOR, ANCHOR + 3 * MINUTE)) == [ANCHOR, ANCHOR + MINUTE, ANCHOR + 2 * MINUTE]
