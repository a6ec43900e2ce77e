"""Bulk actions: the verb of one run (a cancel, a retry) or of one job (a pause, a resume, a
delete) applied to everything a selection takes.

A call takes at most ``limit`` items, read a page at a time (runs newest scheduled first, jobs in
id order), and acts on each in its own transaction through the same step as the one-item RPC (so
the same rules, the same audit line per item, the same reactions of the node): no call holds the
database longer than one item's verb, and a selection of a million runs is a series of calls,
each answered within seconds. An item that changed between the read and the verb (a run ended, a
job was paused or deleted by someone else) is counted as skipped. The token a call returns
resumes after the last item it took. A retry the tenant's waiting-runs quota refuses stops the
call there, with what it did and why; if it had done nothing yet, the call is refused with the
quota's error, as a one-run retry would be.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

from fastlane.domain import lifecycle
from fastlane.domain.errors import InvalidState, JobNotFound, QuotaExceeded, RunNotFound
from fastlane.domain.models import Job, Run
from fastlane.domain.records import BulkOutcome, JobAction, JobFilter, Page, RunAction, RunFilter
from fastlane.storage import Store

PAGE = 200  # items read per page of the selection

T = TypeVar("T")

# The verb of one item: True when it changed the item, False when there was nothing left to do.
Verb = Callable[[str, str], Awaitable[bool]]  # (tenant, run_id)
JobVerb = Callable[[str, Job], Awaitable[bool]]  # (tenant, the job as the page read it)
Admit = Callable[[str], Awaitable[None]]  # raises QuotaExceeded when the tenant may add no run now


async def act_on_runs(
    store: Store, tenant: str, action: RunAction, selection: RunFilter, *, verb: Verb, dry_run: bool, limit: int,
    page_token: str = "", admit: Admit | None = None,
) -> BulkOutcome:
    taken = replace(selection, states=lifecycle.taken_by(action, selection.states))
    if not taken.states:
        return BulkOutcome(matched=0)
    if dry_run:
        return BulkOutcome(matched=await store.runs.count_runs(tenant, taken))

    async def page(token: str, most: int) -> Page[Run]:
        return await store.runs.list_runs(
            tenant, job_id=taken.job_id, job_type=taken.job_type, states=taken.states, limit=most, page_token=token,
            scheduled_from=taken.scheduled_from, scheduled_before=taken.scheduled_before, backfill_id=taken.backfill_id)

    async def act(run: Run) -> bool:
        return await verb(tenant, run.run_id)

    return await _act_on_pages(page, act, limit=limit, page_token=page_token, token_after=store.runs.page_token_after,
                               admit=None if admit is None else lambda: admit(tenant))


async def act_on_jobs(
    store: Store, tenant: str, action: JobAction, selection: JobFilter, *, verb: JobVerb, dry_run: bool, limit: int,
    page_token: str = "",
) -> BulkOutcome:
    taken = replace(selection, states=lifecycle.taken_by(action, selection.states))
    if not taken.states:
        return BulkOutcome(matched=0)
    if dry_run:
        return BulkOutcome(matched=await store.jobs.count_selected_jobs(tenant, taken))

    async def page(token: str, most: int) -> Page[Job]:
        return await store.jobs.list_jobs(tenant, states=taken.states, job_type=taken.job_type, limit=most,
                                          page_token=token)

    async def act(job: Job) -> bool:
        return await verb(tenant, job)

    return await _act_on_pages(page, act, limit=limit, page_token=page_token, token_after=None, admit=None)


async def _act_on_pages(
    page: Callable[[str, int], Awaitable[Page[T]]], act: Callable[[T], Awaitable[bool]], *, limit: int,
    page_token: str, token_after: Callable[[T], str] | None, admit: Callable[[], Awaitable[None]] | None,
) -> BulkOutcome:
    """Act on the items of ``page`` after ``page_token``, ``limit`` at most; ``admit`` (with the
    ``token_after`` an item) may stop the call before an item."""
    matched = acted = skipped = 0
    token = page_token
    taken_last: T | None = None
    while matched < limit:
        read = await page(token, min(PAGE, limit - matched))
        for item in read.items:
            if admit is not None and token_after is not None:
                try:
                    await admit()
                except QuotaExceeded as refused:
                    if taken_last is None:
                        raise  # nothing done: the call is refused as a one-item verb would be
                    return BulkOutcome(matched=matched, acted=acted, skipped=skipped,
                                       next_page_token=token_after(taken_last), stopped_because=str(refused))
            matched += 1
            taken_last = item
            try:
                changed = await act(item)
            except (InvalidState, RunNotFound, JobNotFound):  # changed, ended or gone since the page was read
                changed = False
            acted, skipped = (acted + 1, skipped) if changed else (acted, skipped + 1)
        token = read.next_page_token
        if not token:
            break
    return BulkOutcome(matched=matched, acted=acted, skipped=skipped, next_page_token=token)
