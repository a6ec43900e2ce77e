"""What reported results, and leases that ran out, do to runs and their attempts.

A store reads the runs the results name, inside its transaction, and writes what
:func:`decide_results` returns: the runs whose state changed and how each attempt ends.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from fastlane.domain.lifecycle import WITH_A_WORKER
from fastlane.domain.models import AttemptOutcome, Run
from fastlane.domain.records import AttemptResult
from fastlane.domain.transitions import after_attempt


def lease_expired_results(expired: Sequence[Run], now: datetime) -> list[AttemptResult]:
    """The results that end the current attempts of runs whose lease expired."""
    return [
        AttemptResult(run_id=run.run_id, lease_token=run.lease_token or 0, outcome=AttemptOutcome.LEASE_EXPIRED,
                      error_code="lease_expired", error_message=f"worker {run.worker_id} stopped heartbeating",
                      finished_at=now)
        for run in expired
    ]


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


@dataclass(frozen=True, slots=True)
class AttemptUpdate:
    """How one attempt's row ends: ``outcome`` is ``superseded`` for a stale result."""

    result: AttemptResult
    outcome: AttemptOutcome
    finished_at: datetime


def finished_jobs(runs: Iterable[Run]) -> set[str]:
    """Jobs with a run among these that ended: a buffered run of theirs may start now."""
    return {run.job_id for run in runs if run.state.is_final}


@dataclass(frozen=True, slots=True)
class ResultDecisions:
    # Per result decided, in order: its run as it is now, and whether the result was its current
    # attempt's (False: superseded, the run unchanged).
    verdicts: list[tuple[Run, bool]]
    runs: list[Run]  # runs whose state changed, as they are now
    attempts: list[AttemptUpdate]

    @property
    def finished_jobs(self) -> set[str]:
        """Jobs with a run that just ended: a buffered run of theirs may start now."""
        return finished_jobs(self.runs)


def decide_results(
    runs: dict[str, Run], results: Sequence[AttemptResult], now: datetime, rng: random.Random
) -> ResultDecisions:
    """What reported results do to their runs (read in the caller's transaction).

    Only the result of a run's current attempt (same lease token, a worker still has it) changes
    the run; any other is recorded on its attempt as superseded. ``runs`` is updated in place
    with the runs as they are now.
    """
    verdicts: list[tuple[Run, bool]] = []
    changed: list[Run] = []
    attempts: list[AttemptUpdate] = []
    for result in first_of_each_attempt(results):
        run = runs.get(result.run_id)
        if run is None:
            continue
        current = run.lease_token == result.lease_token and run.state in WITH_A_WORKER
        outcome = result.outcome if current else AttemptOutcome.SUPERSEDED
        attempts.append(AttemptUpdate(result, outcome, result.finished_at or now))
        if not current:
            verdicts.append((run, False))
            continue
        transition = after_attempt(run, result.outcome, error=result.error_message, now=now, rng=rng)
        run = replace(
            run, state=transition.state, available_at=transition.available_at, finished_at=transition.finished_at,
            last_error=transition.last_error, lease_token=None, lease_expires_at=None, updated_at=now,
        )
        runs[run.run_id] = run  # a second result for this run in the batch sees it as it is now
        changed.append(run)
        verdicts.append((run, True))
    return ResultDecisions(verdicts=verdicts, runs=changed, attempts=attempts)
