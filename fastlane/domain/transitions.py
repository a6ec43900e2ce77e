"""What due occurrences and ended attempts make of runs: decided once, in Python, for both backends.

A backend reads the rows inside its transaction, asks here what to write, and writes it. Keeping
the decision out of SQL means SQLite and PostgreSQL cannot drift apart. The states each decision
may reach are those of :mod:`fastlane.domain.lifecycle`'s tables.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from fastlane.domain.lifecycle import WITH_A_WORKER, RunEvent, run_target
from fastlane.domain.models import AttemptOutcome, Delivery, OverlapPolicy, Run, RunState, new_id
from fastlane.domain.policies import next_retry_at
from fastlane.domain.records import Occurrence

# Outcomes after which another attempt may succeed.
RETRYABLE_OUTCOMES = frozenset({AttemptOutcome.FAILED, AttemptOutcome.TIMED_OUT, AttemptOutcome.LEASE_EXPIRED})


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTransition:
    state: RunState
    available_at: datetime
    finished_at: datetime | None
    last_error: str | None


# Messages recorded on runs that policies skipped or cancelled, so history explains them.
OVERLAP_SKIPPED = "skipped: the previous run of this job was still active (overlap policy)"
OVERLAP_SUPERSEDED = "skipped: a later occurrence of this job fired in the same catch-up (overlap cancel_previous)"
OVERLAP_CANCELLED = "cancelled: a newer occurrence of this job started (overlap cancel_previous)"
CANCELLED_BY_REQUEST = "cancelled by request"
MISFIRE_SKIPPED = "skipped: missed while no node owned the job or it was paused (misfire policy)"


@dataclass(frozen=True, slots=True, kw_only=True)
class OverlapPlan:
    """The state of each new run of one job, and whether its active runs must be cancelled."""

    states: list[tuple[datetime, RunState, str | None]]
    cancel_previous: bool = False


def resolve_overlap(policy: OverlapPolicy, fire_times: Sequence[datetime], active: Sequence[RunState]) -> OverlapPlan:
    """Apply a job's overlap policy to the occurrences about to be written.

    ``active`` holds the states of the job's runs still buffered, scheduled, dispatched or
    running. A run counts as *previous and still active* from the moment it is written.
    """
    if policy is OverlapPolicy.ALLOW or not fire_times:
        return OverlapPlan(states=[(t, RunState.SCHEDULED, None) for t in fire_times])
    if policy is OverlapPolicy.CANCEL_PREVIOUS:
        *earlier, latest = fire_times
        return OverlapPlan(
            states=[(t, RunState.SKIPPED, OVERLAP_SUPERSEDED) for t in earlier] + [(latest, RunState.SCHEDULED, None)],
            cancel_previous=bool(active),
        )
    busy = bool(active)
    buffered = sum(1 for state in active if state is RunState.BUFFERED)
    states: list[tuple[datetime, RunState, str | None]] = []
    for t in fire_times:
        if not busy:
            states.append((t, RunState.SCHEDULED, None))
            busy = True
        elif policy is OverlapPolicy.BUFFER_ALL or (policy is OverlapPolicy.BUFFER_ONE and buffered == 0):
            states.append((t, RunState.BUFFERED, None))
            buffered += 1
        else:
            states.append((t, RunState.SKIPPED, OVERLAP_SKIPPED))
    return OverlapPlan(states=states)


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
        rows += [RunRow(new_id(), occurrence.job_id, t, RunState.SKIPPED.value, MISFIRE_SKIPPED)
                 for t in occurrence.skipped_times]
        if plan.cancel_previous:
            for run_id, state in active:
                (cancel_requested if state in WITH_A_WORKER else cancel_now).append(run_id)
    return MaterialisationPlan(rows=rows, cancel_now=cancel_now, cancel_requested=cancel_requested)


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


def after_attempt(
    run: Run,
    outcome: AttemptOutcome,
    *,
    error: str | None,
    now: datetime,
    rng: random.Random,
) -> RunTransition:
    """The run's next state once its current attempt ended with ``outcome``.

    A run whose cancellation was requested ends ``cancelled`` unless it succeeded first. An
    at-most-once run is never delivered again: a lost worker makes it ``lost``, a failure ``dead``.
    Raises ValueError for a run no worker has: it has no attempt to end.
    """
    retry_at = None
    if outcome is AttemptOutcome.SUCCEEDED:
        event = RunEvent.SUCCEED
    elif outcome is AttemptOutcome.CANCELLED or run.cancel_requested:
        event = RunEvent.STOP
    elif outcome is AttemptOutcome.LEASE_EXPIRED and run.delivery is Delivery.AT_MOST_ONCE:
        # The worker may or may not have done the work; delivering again could do it twice.
        event = RunEvent.LOSE
    else:
        if outcome in RETRYABLE_OUTCOMES and run.delivery is Delivery.AT_LEAST_ONCE:
            retry_at = next_retry_at(
                run.retry,
                attempts_made=run.attempts,
                first_attempt_at=run.first_attempt_at or now,
                now=now,
                rng=rng,
            )
        event = RunEvent.FAIL if retry_at is None else RunEvent.RETRY
    state = run_target(run.state, event)
    if state is None:
        raise ValueError(f"run {run.run_id} is {run.state.value}: no attempt of it is under way")
    if retry_at is not None:
        return RunTransition(state=state, available_at=retry_at, finished_at=None, last_error=error)
    return RunTransition(state=state, available_at=run.available_at, finished_at=now,
                         last_error=None if event is RunEvent.SUCCEED else error)
