"""What a :class:`~fastlane.client.Client` call that takes a bounded part of a larger whole (a bulk
action, a backfill) sends and is told, and the loop of such calls, each from the last one's token."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from fastlane._proto import jobs_pb2
from fastlane.domain.backfill import BackfillMode
from fastlane.domain.models import OverlapPolicy
from fastlane.domain.records import BulkOutcome
from fastlane.rpc import wire
from fastlane.rpc.enums import BACKFILL_MODE, OVERLAP_POLICY


@dataclass(frozen=True, slots=True)
class BackfillProgress:
    """What one call of a backfill did (:meth:`fastlane.client.Client.backfill_job`).

    Attributes:
        backfill_id: Names the backfill's runs (``list_runs(backfill_id=...)``,
            ``RunFilter(backfill_id=...)`` to cancel them); the same for every call of one backfill.
        matched: Fire times this call took.
        written: Runs it wrote (a dry run: would write).
        already_run: Fire times taken that have a run already (missed mode): none written.
        covered_until: Every fire time of the range before this instant is done.
        next_page_token: Empty when the range is done; else the token of the next call.
    """

    backfill_id: str
    matched: int
    written: int
    already_run: int
    covered_until: datetime
    next_page_token: str


def backfill_request(tenant: str, job_id: str, start: datetime | None, end: datetime | None, *,
                     mode: BackfillMode | str | None, overlap: OverlapPolicy | str | None, dry_run: bool, limit: int,
                     page_token: str) -> jobs_pb2.BackfillJobRequest:
    return jobs_pb2.BackfillJobRequest(
        tenant=tenant, job_id=job_id, start=wire.timestamp(start), end=wire.timestamp(end),
        mode=BACKFILL_MODE.filter(mode, "mode"), overlap=OVERLAP_POLICY.filter(overlap, "overlap"),
        dry_run=dry_run, limit=limit, page_token=page_token)


def backfill_progress(got: jobs_pb2.BackfillJobResponse) -> BackfillProgress:
    return BackfillProgress(backfill_id=got.backfill_id, matched=got.matched, written=got.written,
                            already_run=got.already_run, covered_until=got.covered_until.ToDatetime(tzinfo=UTC),
                            next_page_token=got.next_page_token)


async def call_after_call(call: Callable[[str], Awaitable[BulkOutcome]]) -> AsyncIterator[BulkOutcome]:
    """A bulk action's calls, each from the token the last one returned, until the selection is
    done or a call stops short."""
    token = ""
    while True:
        outcome = await call(token)
        yield outcome
        token = outcome.next_page_token
        if not token or outcome.stopped_because:
            return
