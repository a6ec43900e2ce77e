"""What a run becomes after an attempt ends: decided once, in Python, for both backends.

A backend reads the run inside its transaction, asks here what to write, and writes it. Keeping
the decision out of SQL means SQLite and PostgreSQL cannot drift apart.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime

from fastlane.models import AttemptOutcome, Delivery, Run, RunState
from fastlane.policies import next_retry_at

# Outcomes after which another attempt may succeed.
_RETRYABLE = frozenset({AttemptOutcome.FAILED, AttemptOutcome.TIMED_OUT, AttemptOutcome.LEASE_EXPIRED})


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTransition:
    state: RunState
    available_at: datetime
    finished_at: datetime | None
    last_error: str | None


def after_attempt(
    run: Run,
    outcome: AttemptOutcome,
    *,
    error: str | None,
    now: datetime,
    rng: random.Random,
) -> RunTransition:
    """The run's next state once its current attempt ended with ``outcome``."""
    if outcome is AttemptOutcome.SUCCEEDED:
        return RunTransition(state=RunState.SUCCEEDED, available_at=run.available_at, finished_at=now, last_error=None)
    if outcome is AttemptOutcome.CANCELLED:
        return RunTransition(state=RunState.CANCELLED, available_at=run.available_at, finished_at=now, last_error=error)
    if outcome is AttemptOutcome.LEASE_EXPIRED and run.delivery is Delivery.AT_MOST_ONCE:
        # The worker may or may not have done the work; delivering again could do it twice.
        return RunTransition(state=RunState.LOST, available_at=run.available_at, finished_at=now, last_error=error)
    if outcome in _RETRYABLE:
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
