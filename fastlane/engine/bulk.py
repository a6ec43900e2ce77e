"""Bulk actions: the verb of one run (a cancel, a retry) applied to every run of a selection.

A call takes at most ``limit`` runs, newest scheduled first, read a page at a time, and acts on
each in its own transaction through the same step as the one-run RPC (so the same rules, the same
audit line per run, the same reactions of the node): no call holds the database longer than one
run's verb, and a selection of a million runs is a series of calls, each answered within seconds.
A run that changed between the read and the verb (it ended, a cancel was already under way) is
counted as skipped. The token a call returns resumes after the last run it took. A retry the
tenant's waiting-runs quota refuses stops the call there, with what it did and why; if it had done
nothing yet, the call is refused with the quota's error, as a one-run retry would be.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from fastlane.domain import lifecycle
from fastlane.domain.errors import InvalidState, QuotaExceeded, RunNotFound
from fastlane.domain.models import Run
from fastlane.domain.records import BulkOutcome, RunAction, RunFilter
from fastlane.storage import Store

PAGE = 200  # runs read per page of the selection

# The verb of one run: True when it changed the run, False when there was nothing left to do.
Verb = Callable[[str, str], Awaitable[bool]]
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
    matched = acted = skipped = 0
    token = page_token
    taken_last: Run | None = None
    while matched < limit:
        page = await store.runs.list_runs(
            tenant, job_id=taken.job_id, job_type=taken.job_type, states=taken.states, limit=min(PAGE, limit - matched),
            page_token=token, scheduled_from=taken.scheduled_from, scheduled_before=taken.scheduled_before)
        for run in page.items:
            if admit is not None:
                try:
                    await admit(tenant)
                except QuotaExceeded as refused:
                    if taken_last is None:
                        raise  # nothing done: the call is refused as a one-run retry would be
                    return BulkOutcome(matched=matched, acted=acted, skipped=skipped,
                                       next_page_token=store.runs.page_token_after(taken_last),
                                       stopped_because=str(refused))
            matched += 1
            taken_last = run
            try:
                changed = await verb(tenant, run.run_id)
            except (InvalidState, RunNotFound):  # ended, or trimmed, since the page was read
                changed = False
            acted, skipped = (acted + 1, skipped) if changed else (acted, skipped + 1)
        token = page.next_page_token
        if not token:
            break
    return BulkOutcome(matched=matched, acted=acted, skipped=skipped, next_page_token=token)
