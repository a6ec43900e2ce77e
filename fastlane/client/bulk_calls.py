"""The calls of a :class:`~fastlane.client.Client` that act on many jobs or runs, part after part:
bulk actions and backfills, each a call that takes a bounded part and a page token to go on."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from fastlane._proto import jobs_pb2, runs_pb2
from fastlane.client.connection import Connection
from fastlane.client.convert import bulk_outcome_from_pb, job_selection_pb, run_selection_pb
from fastlane.domain.backfill import BackfillMode
from fastlane.domain.models import OverlapPolicy
from fastlane.domain.records import BulkOutcome, JobAction, JobFilter, RunAction, RunFilter
from fastlane.rpc import wire
from fastlane.rpc.enums import BACKFILL_MODE, JOB_ACTION, OVERLAP_POLICY, RUN_ACTION


@dataclass(frozen=True, slots=True)
class BackfillProgress:
    """What one call of a backfill did (:meth:`BulkCalls.backfill_job`).

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


class BulkCalls:
    """Bulk actions on jobs and runs, and backfills, for one tenant."""

    tenant: str
    _connection: Connection

    async def act_on_jobs(self, action: JobAction | str, selection: JobFilter = JobFilter(), *, dry_run: bool = False,
                          limit: int = 0, page_token: str = "", reason: str = "") -> BulkOutcome:
        """Pause (with ``reason``), resume or delete (``action``) the jobs ``selection`` takes, ``limit``
        at most (0: the node's default, 1,000); with ``dry_run``, how many it would take. One call:
        go on with the outcome's ``next_page_token``, or use :meth:`act_on_all_jobs`."""
        request = jobs_pb2.ActOnJobsRequest(
            tenant=self.tenant, action=JOB_ACTION.named(action, "action"), dry_run=dry_run, limit=limit,
            page_token=page_token, selection=job_selection_pb(selection), reason=reason)
        return bulk_outcome_from_pb(await self._connection.call(self._connection.stubs.jobs.ActOnJobs, request))

    def act_on_all_jobs(self, action: JobAction | str, selection: JobFilter = JobFilter(), *, limit: int = 0,
                        reason: str = "") -> AsyncIterator[BulkOutcome]:
        """:meth:`act_on_jobs` call after call until the selection is done: each call's outcome
        as it comes, for progress."""
        return _call_after_call(
            lambda token: self.act_on_jobs(action, selection, limit=limit, page_token=token, reason=reason))

    async def act_on_runs(self, action: RunAction | str, selection: RunFilter = RunFilter(), *, dry_run: bool = False,
                          limit: int = 0, page_token: str = "") -> BulkOutcome:
        """Cancel or retry (``action``) the runs ``selection`` takes, ``limit`` at most (0: the node's
        default, 1,000); with ``dry_run``, how many it would take. One call: continue with the
        outcome's ``next_page_token``, or use :meth:`act_on_all_runs`."""
        request = runs_pb2.ActOnRunsRequest(
            tenant=self.tenant, action=RUN_ACTION.named(action, "action"), dry_run=dry_run, limit=limit,
            page_token=page_token, selection=run_selection_pb(selection))
        return bulk_outcome_from_pb(await self._connection.call(self._connection.stubs.runs.ActOnRuns, request))

    def act_on_all_runs(self, action: RunAction | str, selection: RunFilter = RunFilter(), *,
                        limit: int = 0) -> AsyncIterator[BulkOutcome]:
        """:meth:`act_on_runs` call after call until the selection is done (or a call stops short,
        its ``stopped_because`` set): each call's outcome as it comes, for progress."""
        return _call_after_call(lambda token: self.act_on_runs(action, selection, limit=limit, page_token=token))

    async def backfill_job(
        self, job_id: str, start: datetime | None = None, end: datetime | None = None, *,
        mode: BackfillMode | str | None = None, overlap: OverlapPolicy | str | None = None, dry_run: bool = False,
        limit: int = 0, page_token: str = "",
    ) -> BackfillProgress:
        """Run the job's fire times in ``[start, end)`` (``end`` at most now) now: ``mode``
        ``missed`` (the default) those with no run that ran, ``all`` every one; ``overlap``
        ``buffer_all`` (the default: one at a time, oldest first) or ``allow``. One call takes
        ``limit`` fire times at most (0: 1,000); go on with ``page_token`` (the range and the
        policies are the token's), or use :meth:`backfill_all`."""
        request = jobs_pb2.BackfillJobRequest(
            tenant=self.tenant, job_id=job_id, start=wire.timestamp(start), end=wire.timestamp(end),
            mode=BACKFILL_MODE.filter(mode, "mode"), overlap=OVERLAP_POLICY.filter(overlap, "overlap"),
            dry_run=dry_run, limit=limit, page_token=page_token)
        got = await self._connection.call(self._connection.stubs.jobs.BackfillJob, request)
        return BackfillProgress(backfill_id=got.backfill_id, matched=got.matched, written=got.written,
                                already_run=got.already_run, covered_until=got.covered_until.ToDatetime(tzinfo=UTC),
                                next_page_token=got.next_page_token)

    async def backfill_all(
        self, job_id: str, start: datetime, end: datetime, *, mode: BackfillMode | str | None = None,
        overlap: OverlapPolicy | str | None = None, dry_run: bool = False, limit: int = 0,
    ) -> AsyncIterator[BackfillProgress]:
        """:meth:`backfill_job` call after call until the range is done: each call's progress as it comes."""
        progress = await self.backfill_job(job_id, start, end, mode=mode, overlap=overlap, dry_run=dry_run,
                                           limit=limit)
        yield progress
        while progress.next_page_token:
            progress = await self.backfill_job(job_id, dry_run=dry_run, limit=limit,
                                               page_token=progress.next_page_token)
            yield progress


async def _call_after_call(call: Callable[[str], Awaitable[BulkOutcome]]) -> AsyncIterator[BulkOutcome]:
    """A bulk action's calls, each from the token the last one returned, until the selection is
    done or a call stops short."""
    token = ""
    while True:
        outcome = await call(token)
        yield outcome
        token = outcome.next_page_token
        if not token or outcome.stopped_because:
            return
