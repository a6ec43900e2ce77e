"""Pieces both backends share: paging, lease batches, change payloads, and the domain's decisions
(:mod:`fastlane.domain.lifecycle`, :mod:`~fastlane.domain.transitions`,
:mod:`~fastlane.domain.run_results`) under the names the backends call them by."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import orjson

from fastlane.domain import lifecycle, run_results, validation
from fastlane.domain.audit import MAX_AUDIT_LIMIT, AuditTarget
from fastlane.domain.lifecycle import admit_under_caps as admit_under_caps
from fastlane.domain.lifecycle import anchor_interval as anchor_interval
from fastlane.domain.lifecycle import capped_keys as capped_keys
from fastlane.domain.lifecycle import check_update as check_update
from fastlane.domain.lifecycle import idempotent_create as idempotent_create
from fastlane.domain.lifecycle import rescheduled as rescheduled
from fastlane.domain.models import Job, Run, RunState, ShardLease
from fastlane.domain.records import AttemptResult, Change, ChangeKind, JobFilter, Page
from fastlane.domain.run_results import AttemptUpdate as AttemptUpdate
from fastlane.domain.run_results import first_of_each_attempt as first_of_each_attempt
from fastlane.domain.run_results import lease_expired_results as lease_expired_results
from fastlane.domain.run_results import successes_first as successes_first
from fastlane.domain.transitions import MISFIRE_SKIPPED as MISFIRE_SKIPPED
from fastlane.domain.transitions import MaterialisationPlan as MaterialisationPlan
from fastlane.domain.transitions import RunRow as RunRow
from fastlane.domain.transitions import plan_materialisation as plan_materialisation
from fastlane.domain.transitions import scheduled_in_order as scheduled_in_order
from fastlane.domain.transitions import skipped_by_policy as skipped_by_policy
from fastlane.errors import InvalidArgument
from fastlane.runtime.clock import to_micros
from fastlane.storage import codec
from fastlane.storage.results import ResultOutcome

T = TypeVar("T")


def micros_of_delta(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def audit_listing(target_kind: str, target_id: str, limit: int) -> AuditTarget:
    """The target kind of a history listing, checked with its id and limit (1..1000)."""
    kind = validation.audit_target("target_kind", target_kind)
    validation.identifier("target_id", target_id)
    validation.count("limit", limit, 1, MAX_AUDIT_LIMIT)
    return kind


PENDING_CHUNK = 5_000  # rows of pending runs read by one query
# Rows of the window read at a time: each row is thrown away once decoded, and a smaller batch of
# them leaves less memory behind in the allocator (which keeps much of a batch's peak as resident
# memory after its rows are freed, so a larger batch shows in the node's size per window job). The
# rows are decoded on the event loop between two reads: a small batch keeps each step short.
DUE_JOBS_CHUNK = 500


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


MAX_TRIM_BATCH = 10_000  # runs deleted in one trim_history transaction, at most


def trim_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_TRIM_BATCH:
        raise InvalidArgument("limit", f"{limit} is out of range (1..{MAX_TRIM_BATCH})")
    return limit


FINAL_STATES_SQL = lifecycle.sql_list(lifecycle.FINAL)  # for an IN (...) list


def page_limit(limit: int) -> int:
    if not 1 <= limit <= 1000:
        raise InvalidArgument("limit", f"{limit} is out of range (1..1000)")
    return limit


def page_of(items: list[T], limit: int, key: Callable[[T], tuple[Any, ...]]) -> Page[T]:
    """The first ``limit`` items and, if more were fetched, the token of the next page."""
    if len(items) > limit:
        items = items[:limit]
        return Page(items=items, next_page_token=codec.encode_page_token(*key(items[-1])))
    return Page(items=items)


def job_page_key(job: Job) -> tuple[str]:
    """Where a page of jobs (in ``job_id`` order) ends."""
    return (job.job_id,)


def run_page_key(run: Run) -> tuple[int, str]:
    """Where a page of runs (newest first) ends."""
    return (to_micros(run.scheduled_for), run.run_id)


def leases_in_order(rows: Sequence[Any]) -> list[ShardLease]:
    """Shard lease rows as leases, by shard id."""
    return sorted((codec.build_lease(row) for row in rows), key=lambda lease: lease.shard_id)


def single_owner(leases: Sequence[ShardLease]) -> str:
    owners = {lease.owner for lease in leases}
    if len(owners) != 1:
        raise ValueError(f"leases of several owners in one call: {sorted(owners)}")
    return owners.pop()


# The lifecycle's sets as the backends take them today: tuples in value order (a signature types
# PAUSE_FROM and RESUME_FROM as tuples; ACTIVE_STATES is a parameter of plain strings).
WITH_A_WORKER = tuple(sorted(lifecycle.WITH_A_WORKER))
ACTIVE_STATES = tuple(sorted(state.value for state in lifecycle.OVERLAP_ACTIVE))
PAUSE_FROM = tuple(sorted(lifecycle.PAUSE_FROM))
RESUME_FROM = tuple(sorted(lifecycle.RESUME_FROM))


def id_prefix_range(prefix: str) -> tuple[str, str]:
    """``[low, high)`` holding every id that starts with ``prefix`` in the ids' order (ids are
    UUIDs: hex digits and hyphens, ordered alike by byte and by any locale's collation), or every
    name in the names' byte order; callers still keep only those that start with it."""
    last = ord(prefix[-1])
    return prefix, prefix[:-1] + (chr(last + 1) if last < 0x10FFFF else prefix[-1] * 2)


def with_id_prefix(items: list[T], prefix: str, id_of: Callable[[T], str]) -> Page[T]:
    return Page(items=[item for item in items if id_of(item).startswith(prefix)])


def named_job_page(job: Job | None, selection: JobFilter, after: str) -> Page[Job]:
    """The page ``list_jobs(name=...)`` answers: the job of that name if it passes the other filters."""
    return Page(items=[job] if job is not None and job.job_id > after and selection.matches(job) else [])


def rescheduled_runs(outcomes: Sequence[ResultOutcome]) -> list[Run]:
    """The runs these outcomes scheduled again (retries of expired attempts)."""
    return [outcome.run for outcome in outcomes if outcome.run.state is RunState.SCHEDULED]


def encode_change(change: Change) -> str:
    return orjson.dumps([change.kind, change.shard_id, change.tenant, change.key]).decode()


def decode_change(payload: str) -> Change | None:
    try:
        kind, shard_id, tenant, key = orjson.loads(payload)
        return Change(ChangeKind(kind), int(shard_id), str(tenant), str(key))
    except (ValueError, TypeError):  # not ours, or from a newer version: the periodic scan covers it
        return None


@dataclass(frozen=True, slots=True)
class ResultDecisions:
    """:class:`fastlane.domain.run_results.ResultDecisions`, each verdict as the outcome a store returns."""

    outcomes: list[ResultOutcome]
    runs: list[Run]  # runs whose state changed, as they are now
    attempts: list[AttemptUpdate]

    @property
    def finished_jobs(self) -> set[str]:
        """Jobs with a run that just ended: a buffered run of theirs may start now."""
        return run_results.finished_jobs(self.runs)


def decide_results(
    runs: dict[str, Run], results: Sequence[AttemptResult], now: datetime, rng: random.Random
) -> ResultDecisions:
    """:func:`fastlane.domain.run_results.decide_results`, with its verdicts as result outcomes."""
    decided = run_results.decide_results(runs, results, now, rng)
    return ResultDecisions(
        outcomes=[ResultOutcome(run=run, accepted=accepted) for run, accepted in decided.verdicts],
        runs=decided.runs,
        attempts=decided.attempts,
    )
