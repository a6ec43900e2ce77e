"""The backfill step: one bounded part of a backfill of a job (:mod:`fastlane.domain.backfill`).

A part walks at most ``limit`` fire times of the range from where the last part stopped, and
writes their runs in one transaction (the job locked); its page token carries the backfill on, with
everything that defines it (its id, range, mode and overlap), so no part depends on a node's
memory and any node may answer the next. The walk yields to the loop every :data:`WALK_SLICE`
fire times: a cron expression's fire times cost tens of microseconds each, and the node's loop
also releases runs on their instants.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timedelta

from fastlane.domain import validation
from fastlane.domain.backfill import BACKFILL_OVERLAPS, BackfillMode, Occurrence, occurrences
from fastlane.domain.models import Job, OverlapPolicy, new_id
from fastlane.domain.schedules import next_fire_after
from fastlane.domain.workflows import WORKFLOW_JOB_TYPE
from fastlane.errors import InvalidArgument
from fastlane.runtime.clock import from_micros, to_micros
from fastlane.storage import Store, codec
from fastlane.storage.backfills import BackfillWrite

WALK_SLICE = 500
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class BackfillRequest:
    """One call of a backfill: a new one (``page_token`` empty: ``start`` and ``end`` required)
    or the next part of one (its token; the other fields, if given, must agree with it)."""

    start: datetime | None = None
    end: datetime | None = None
    mode: BackfillMode | None = None  # None: missed
    overlap: OverlapPolicy | None = None  # None: buffer_all
    dry_run: bool = False
    limit: int = 1_000
    page_token: str = ""


@dataclass(frozen=True, slots=True)
class BackfillPart:
    """What defines a backfill, and where its next part starts."""

    backfill_id: str
    job_id: str
    start: datetime
    end: datetime
    mode: BackfillMode
    overlap: OverlapPolicy
    cursor: datetime  # the next part's fire times are at or after it

    def token(self, cursor: datetime) -> str:
        return codec.encode_page_token(self.backfill_id, self.job_id, to_micros(self.start), to_micros(self.end),
                                       self.mode.value, self.overlap.value, to_micros(cursor))


@dataclass(frozen=True, slots=True)
class BackfillOutcome:
    """What one call did: see ``BackfillJobResponse``."""

    backfill_id: str
    matched: int
    written: BackfillWrite
    covered_until: datetime
    next_page_token: str


async def backfill_part(store: Store, tenant: str, job_id: str, request: BackfillRequest, now: datetime) -> BackfillOutcome:
    """Walk and write the next part of a backfill of the tenant's job ``job_id``."""
    job = await store.jobs.get_job(tenant, job_id)  # the tenant's own, or JobNotFound
    schedule = job.spec.schedule
    if schedule.is_one_shot:
        raise InvalidArgument("job_id", f"job {job_id} fires once ({schedule.kind}): a backfill runs the past fire "
                                        "times of a cron or interval job")
    if job.spec.job_type == WORKFLOW_JOB_TYPE:  # its runs start workflow runs, which a backfill does not make
        raise InvalidArgument("job_id", f"job {job_id} is a workflow's schedule, which has no backfill: trigger the "
                                        "workflow (`fastlane workflows trigger`) for the past fire times it needs")
    part = _resumed(job_id, request) if request.page_token else _begun(job_id, request, now)
    found: list[Occurrence] = []
    cursor = part.cursor
    while len(found) < request.limit:
        chunk = occurrences(job_id, schedule, cursor, part.end, min(WALK_SLICE, request.limit - len(found)))
        if not chunk:
            break
        found += chunk
        cursor = chunk[-1].fire_time + _MICROSECOND
        await asyncio.sleep(0)
    written = await store.backfills.write_backfill(
        tenant, job_id, part.backfill_id, found, missed_only=part.mode is BackfillMode.MISSED,
        buffered=part.overlap is OverlapPolicy.BUFFER_ALL, dry_run=request.dry_run)
    more = bool(found) and not written.beyond and _fires_before(job, found[-1].fire_time, part.end)
    return BackfillOutcome(backfill_id=part.backfill_id, matched=len(found), written=written,
                           covered_until=cursor if more else part.end, next_page_token=part.token(cursor) if more else "")


def _fires_before(job: Job, after: datetime, end: datetime) -> bool:
    following = next_fire_after(job.spec.schedule, after)
    return following is not None and following < end


def _begun(job_id: str, request: BackfillRequest, now: datetime) -> BackfillPart:
    if request.start is None:
        raise InvalidArgument("start", "is required: the first instant of the range")
    if request.end is None:
        raise InvalidArgument("end", "is required: the range ends before it (at most now)")
    start, end = validation.instant("start", request.start), validation.instant("end", request.end)
    if end <= start:
        raise InvalidArgument("end", "must be later than start")
    if start >= now:
        raise InvalidArgument("start", "is not in the past: a backfill runs past fire times (the schedule runs "
                                       "what is ahead)")
    overlap = request.overlap or BACKFILL_OVERLAPS[0]
    if overlap not in BACKFILL_OVERLAPS:
        raise InvalidArgument("overlap", f"a backfill's runs take {' or '.join(p.value for p in BACKFILL_OVERLAPS)}, "
                                         f"not {overlap.value}")
    # Fire times after now are the schedule's: the range is cut there (and at the job's next fire time).
    return BackfillPart(backfill_id=new_id(), job_id=job_id, start=start, end=min(end, now),
                        mode=request.mode or BackfillMode.MISSED, overlap=overlap, cursor=start)


def _resumed(job_id: str, request: BackfillRequest) -> BackfillPart:
    refused = InvalidArgument("page_token", "is not a token this job's backfill returned")
    backfill_id, token_job, start_us, end_us, mode, overlap, cursor_us = codec.decode_page_token(
        request.page_token, str, str, int, int, str, str, int)
    try:
        start, end, cursor = (validation.instant("page_token", from_micros(us)) for us in (start_us, end_us, cursor_us))
        part = BackfillPart(backfill_id=validation.identifier("page_token", backfill_id), job_id=token_job,
                            start=start, end=end, mode=BackfillMode(mode), overlap=OverlapPolicy(overlap),
                            cursor=cursor)
    except (ValueError, OverflowError, InvalidArgument):
        raise refused from None
    if token_job != job_id or not part.start <= part.cursor <= part.end or part.overlap not in BACKFILL_OVERLAPS:
        raise refused
    given = (("start", request.start, part.start), ("mode", request.mode, part.mode),
             ("overlap", request.overlap, part.overlap))
    for name, value, kept in given:
        if value is not None and value != kept:
            raise InvalidArgument(name, f"differs from the backfill's ({kept}): its page token carries it on as begun")
    return part
