"""What a run becomes after an attempt ends: decided once, in Python, for both backends.

A backend reads the run inside its transaction, asks here what to write, and writes it. Keeping
the decision out of SQL means SQLite and PostgreSQL cannot drift apart.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from fastlane.domain.models import AttemptOutcome, Delivery, OverlapPolicy, Run, RunState
from fastlane.domain.policies import next_retry_at

# Outcomes after which another attempt may succeed.
_RETRYABLE = frozenset({AttemptOutcome.FAILED, AttemptOutcome.TIMED_OUT, AttemptOutcome.LEASE_EXPIRED})


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTransition:
    state: RunState
    available_at: datetime
    finished_at: datetime | None
    last_error: str | None


# Messages recorded on runs that overlap policies skipped or cancelled, so history explains them.
OVERLAP_SKIPPED = "skipped: the previous run of this job was still active (overlap policy)"
OVERLAP_SUPERSEDED = "skipped: a later occurrence of this job fired in the same catch-up (overlap cancel_previous)"
OVERLAP_CANCELLED = "cancelled: a newer occurrence of this job started (overlap cancel_previous)"
CANCELLED_BY_REQUEST = "cancelled by request"


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
    """
    if outcome is AttemptOutcome.SUCCEEDED:
        return RunTransition(state=RunState.SUCCEEDED, available_at=run.available_at, finished_at=now, last_error=None)
    if outcome is AttemptOutcome.CANCELLED or run.cancel_requested:
        return RunTransition(state=RunState.CANCELLED, available_at=run.available_at, finished_at=now, last_error=error)
    if outcome is AttemptOutcome.LEASE_EXPIRED and run.delivery is Delivery.AT_MOST_ONCE:
        # The worker may or may not have done the work; delivering again could do it twice.
        return RunTransition(state=RunState.LOST, available_at=run.available_at, finished_at=now, last_error=error)
    if outcome in _RETRYABLE and run.delivery is Delivery.AT_LEAST_ONCE:
        retry_at = next_retry_at(
            run.retry,
            attempts_made=run.attempts,
            first_attempt_at=run.first_attempt_at or now,
            now=now,
            rng=rng,
        )
        if retry_at is not None:
            return RunTransition(state=RunState.SCHEDULED, available_at=retry_at, finished_at=None, last_error=error)
    return RunTransition(state=RunState.DEAD, available_at=run.available_at, finished_at=now, last_error=error)
