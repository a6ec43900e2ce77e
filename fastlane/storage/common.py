"""Pieces both backends share: job-spec rules applied at write time, paging, lease batches."""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

import orjson

from fastlane.clock import to_micros
from fastlane.domain import validation
from fastlane.domain.audit import MAX_AUDIT_LIMIT, AuditTarget
from fastlane.domain.models import (
    FINAL_RUN_STATES,
    AttemptOutcome,
    Job,
    JobSpec,
    JobState,
    OverlapPolicy,
    Run,
    RunState,
    ScheduleKind,
    ShardLease,
    new_id,
)
from fastlane.domain.records import AttemptResult, Change, ChangeKind, Dispatch, Occurrence, Page
from fastlane.domain.schedules import first_fire
from fastlane.domain.transitions import after_attempt, resolve_overlap
from fastlane.errors import InvalidArgument, JobAlreadyExists
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
# them leaves less memory behind in the allocator (measured on PostgreSQL: reading 10,000 rows at
# once kept 60-90 bytes a window job more in the node's resident size than reading 2,000). The
# rows are decoded on the event loop between two reads: 500 take about a millisecond.
DUE_JOBS_CHUNK = 500


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


MAX_TRIM_BATCH = 10_000  # runs deleted in one trim_history transaction, at most


def trim_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_TRIM_BATCH:
        raise InvalidArgument("limit", f"{limit} is out of range (1..{MAX_TRIM_BATCH})")
    return limit


FINAL_STATES_SQL = ", ".join(f"'{state.value}'" for state in sorted(FINAL_RUN_STATES))  # for an IN (...) list


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


def anchor_interval(spec: JobSpec, now: datetime) -> JobSpec:
    """Interval schedules without an anchor count from the moment they are stored."""
    schedule = spec.schedule
    if schedule.kind is ScheduleKind.INTERVAL and schedule.anchor is None:
        return replace(spec, schedule=replace(schedule, anchor=now))
    return spec


def idempotent_create(existing: Job, requested: JobSpec) -> Job:
    if requested.schedule.kind is ScheduleKind.INTERVAL and requested.schedule.anchor is None:
        requested = replace(requested, schedule=replace(requested.schedule, anchor=existing.spec.schedule.anchor))
    differing = codec.first_difference(existing.spec, requested)
    if differing is not None:
        raise JobAlreadyExists(requested.tenant, requested.name, differing)
    return existing


def check_update(current: Job, spec: JobSpec) -> None:
    if spec.tenant != current.tenant:
        raise InvalidArgument("tenant", "cannot be changed")
    if spec.name != current.name:
        raise InvalidArgument("name", f"cannot be changed (is {current.name!r}); create a new job instead")


# The states a job may be paused from and resumed from.
PAUSE_FROM = (JobState.ACTIVE,)
RESUME_FROM = (JobState.PAUSED, JobState.ERRORED)


def rescheduled(current: Job, spec: JobSpec, now: datetime) -> tuple[datetime | None, JobState]:
    """A changed schedule starts afresh from now; an unchanged one keeps its next fire time."""
    if spec.schedule == current.spec.schedule:
        return current.next_fire_at, current.state
    state = JobState.ACTIVE if current.state is JobState.COMPLETED else current.state
    return first_fire(spec.schedule, now), state


MISFIRE_SKIPPED = "skipped: missed while no node owned the job or it was paused (misfire policy)"

# States of a run a worker has (a cancel of one is a request the worker carries out).
WITH_A_WORKER = (RunState.DISPATCHED, RunState.RUNNING)
# States of a job's runs that count for its overlap policy.
ACTIVE_STATES = ("buffered", "scheduled", "dispatched", "running")


@dataclass(frozen=True, slots=True)
class RunRow:
    """A run about to be inserted by a materialisation."""

    run_id: str
    job_id: str
    scheduled_for: datetime
    state: str
    last_error: str | None


@dataclass(frozen=True, slots=True)
class MaterialisationPlan:
    rows: list[RunRow]
    cancel_now: list[str]  # runs of a cancel_previous job not yet delivered: cancelled at once
    cancel_requested: list[str]  # runs of a cancel_previous job with a worker: told to stop


def plan_materialisation(
    occurrences: Sequence[Occurrence],
    overlap_of: dict[str, str],
    active_runs: Sequence[tuple[str, str, str]],
) -> MaterialisationPlan:
    """Rows to insert for the occurrences of advanced jobs (``overlap_of``: job id → policy).

    ``active_runs`` are ``(job_id, run_id, state)`` of runs still active for those jobs.
    """
    active_by_job: dict[str, list[tuple[str, RunState]]] = {}
    for job_id, run_id, state in active_runs:
        active_by_job.setdefault(job_id, []).append((run_id, RunState(state)))
    rows: list[RunRow] = []
    cancel_now: list[str] = []
    cancel_requested: list[str] = []
    for occurrence in occurrences:
        policy = overlap_of.get(occurrence.job_id)
        if policy is None:
            continue  # not advanced: changed or taken meanwhile
        active = active_by_job.get(occurrence.job_id, [])
        plan = resolve_overlap(OverlapPolicy(policy), occurrence.fire_times, [state for _, state in active])
        rows += [RunRow(new_id(), occurrence.job_id, t, state.value, error) for t, state, error in plan.states]
        rows += [RunRow(new_id(), occurrence.job_id, t, "skipped", MISFIRE_SKIPPED) for t in occurrence.skipped_times]
        if plan.cancel_previous:
            for run_id, state in active:
                delivered = state in (RunState.DISPATCHED, RunState.RUNNING)
                (cancel_requested if delivered else cancel_now).append(run_id)
    return MaterialisationPlan(rows=rows, cancel_now=cancel_now, cancel_requested=cancel_requested)


def id_prefix_range(prefix: str) -> tuple[str, str]:
    """``[low, high)`` holding every id that starts with ``prefix`` in the ids' order (ids are
    UUIDs: hex digits and hyphens, ordered alike by byte and by any locale's collation), or every
    name in the names' byte order; callers still keep only those that start with it."""
    last = ord(prefix[-1])
    return prefix, prefix[:-1] + (chr(last + 1) if last < 0x10FFFF else prefix[-1] * 2)


def with_id_prefix(items: list[T], prefix: str, id_of: Callable[[T], str]) -> Page[T]:
    return Page(items=[item for item in items if id_of(item).startswith(prefix)])


def named_job_page(job: Job | None, state: JobState | None, job_type: str | None, after: str) -> Page[Job]:
    """The page ``list_jobs(name=...)`` answers: the job of that name if it passes the other filters."""
    if job is None or (state is not None and job.state is not state) or job.job_id <= after:
        return Page(items=[])
    return Page(items=[] if job_type is not None and job.job_type != job_type else [job])


def skipped_by_policy(runs: Sequence[Run]) -> dict[str, int]:
    """How many of the runs a materialisation inserted record a skipped occurrence, by the policy
    that skipped it (for ``fastlane_occurrences_skipped_total``): ``misfire`` or ``overlap``.
    Counted from the rows inserted, so an occurrence recorded before is not counted again."""
    counts: dict[str, int] = {}
    for run in runs:
        if run.state is RunState.SKIPPED:
            policy = "misfire" if run.last_error == MISFIRE_SKIPPED else "overlap"
            counts[policy] = counts.get(policy, 0) + 1
    return counts


def scheduled_in_order(runs: Sequence[Run]) -> list[Run]:
    """The runs a materialisation inserted as ``scheduled``, by scheduled time (to dispatch)."""
    return sorted((run for run in runs if run.state is RunState.SCHEDULED), key=lambda run: run.scheduled_for)


def lease_expired_results(expired: Sequence[Run], now: datetime) -> list[AttemptResult]:
    """The results that end the current attempts of runs whose lease expired."""
    return [
        AttemptResult(run_id=run.run_id, lease_token=run.lease_token or 0, outcome=AttemptOutcome.LEASE_EXPIRED,
                      error_code="lease_expired", error_message=f"worker {run.worker_id} stopped heartbeating",
                      finished_at=now)
        for run in expired
    ]


def rescheduled_runs(outcomes: Sequence[ResultOutcome]) -> list[Run]:
    """The runs these outcomes scheduled again (retries of expired attempts)."""
    return [outcome.run for outcome in outcomes if outcome.run.state is RunState.SCHEDULED]


def first_of_each_attempt(results: Sequence[AttemptResult]) -> list[AttemptResult]:
    """One result per attempt: a worker that reconnects resends results, and a batch can hold
    both copies. The first one counts; applying both would let the copy supersede the original."""
    seen: set[tuple[str, int]] = set()
    unique = []
    for result in results:
        key = (result.run_id, result.lease_token)
        if key not in seen:
            seen.add(key)
            unique.append(result)
    return unique


def successes_first(results: Sequence[AttemptResult]) -> tuple[list[AttemptResult], list[AttemptResult]]:
    """The first result of each attempt, split into successes and the rest.

    A success of the current attempt ends its run the same way whatever the run holds, so the
    stores apply successes in one set-based statement without reading the runs first; what it
    does not apply (a stale attempt) goes through :func:`decide_results` with the rest."""
    unique = first_of_each_attempt(results)
    successes = [r for r in unique if r.outcome is AttemptOutcome.SUCCEEDED]
    others = [r for r in unique if r.outcome is not AttemptOutcome.SUCCEEDED]
    return successes, others


def encode_change(change: Change) -> str:
    return orjson.dumps([change.kind, change.shard_id, change.tenant, change.key]).decode()


def decode_change(payload: str) -> Change | None:
    try:
        kind, shard_id, tenant, key = orjson.loads(payload)
        return Change(ChangeKind(kind), int(shard_id), str(tenant), str(key))
    except (ValueError, TypeError):  # not ours, or from a newer version: the periodic scan covers it
        return None


@dataclass(frozen=True, slots=True)
class AttemptUpdate:
    """How one attempt's row ends: ``outcome`` is ``superseded`` for a stale result."""

    result: AttemptResult
    outcome: AttemptOutcome
    finished_at: datetime


@dataclass(frozen=True, slots=True)
class ResultDecisions:
    outcomes: list[ResultOutcome]
    runs: list[Run]  # runs whose state changed, as they are now
    attempts: list[AttemptUpdate]

    @property
    def finished_jobs(self) -> set[str]:
        """Jobs with a run that just ended: a buffered run of theirs may start now."""
        return {run.job_id for run in self.runs if run.state.is_final}


def decide_results(
    runs: dict[str, Run], results: Sequence[AttemptResult], now: datetime, rng: random.Random
) -> ResultDecisions:
    """What reported results do to their runs (read in the caller's transaction).

    Only the result of a run's current attempt (same lease token, still dispatched or running)
    changes the run; any other is recorded on its attempt as superseded.
    """
    outcomes: list[ResultOutcome] = []
    changed: list[Run] = []
    attempts: list[AttemptUpdate] = []
    for result in first_of_each_attempt(results):
        run = runs.get(result.run_id)
        if run is None:
            continue
        current = run.lease_token == result.lease_token and run.state in (RunState.DISPATCHED, RunState.RUNNING)
        outcome = result.outcome if current else AttemptOutcome.SUPERSEDED
        attempts.append(AttemptUpdate(result, outcome, result.finished_at or now))
        if not current:
            outcomes.append(ResultOutcome(run=run, accepted=False))
            continue
        transition = after_attempt(run, result.outcome, error=result.error_message, now=now, rng=rng)
        run = replace(
            run, state=transition.state, available_at=transition.available_at, finished_at=transition.finished_at,
            last_error=transition.last_error, lease_token=None, lease_expires_at=None, updated_at=now,
        )
        runs[run.run_id] = run  # a second result for this run in the batch sees it as it is now
        changed.append(run)
        outcomes.append(ResultOutcome(run=run, accepted=True))
    return ResultDecisions(outcomes=outcomes, runs=changed, attempts=attempts)


def admit_under_caps(
    dispatches: Sequence[Dispatch], scheduled: Collection[str], active: Mapping[tuple[str, str], int]
) -> tuple[list[Dispatch], list[str]]:
    """Split capped dispatches of runs still ``scheduled`` into those their key has room for
    (``active``: runs of each (tenant, key) dispatched or running now) and the run ids held back,
    in the order given; dispatches of runs no longer scheduled are in neither."""
    taken = dict(active)
    admitted: list[Dispatch] = []
    held: list[str] = []
    for dispatch in dispatches:
        if dispatch.run_id not in scheduled:
            continue
        if dispatch.cap is None:
            admitted.append(dispatch)
            continue
        key = (dispatch.cap.tenant, dispatch.cap.key)
        if taken.get(key, 0) < dispatch.cap.limit:
            taken[key] = taken.get(key, 0) + 1
            admitted.append(dispatch)
        else:
            held.append(dispatch.run_id)
    return admitted, held


def capped_keys(dispatches: Sequence[Dispatch]) -> list[tuple[str, str]]:
    """The distinct (tenant, key) of these dispatches, sorted: locks taken in one order cannot deadlock."""
    return sorted({(d.cap.tenant, d.cap.key) for d in dispatches if d.cap is not None})
