"""Pure policy decisions: what to fire for a due job (misfire), when to retry a failed attempt.

Nothing here does I/O or reads a clock; callers pass ``now`` and a random source, so every
decision can be tested exactly and both storage backends decide identically.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from fastlane.domain.jitter import jitter_offset
from fastlane.domain.models import DueJob, MisfireKind, RetryPolicy, Schedule
from fastlane.domain.records import Occurrence
from fastlane.domain.schedules import next_fire_after

# Bounds so a job with a one-second schedule that was paused for a week cannot make one
# materialisation walk 600k occurrences or write 600k skipped rows.
MAX_OCCURRENCES_WALKED = 10_000
MAX_SKIPPED_RECORDED = 1_000


def plan_occurrence(job: DueJob, now: datetime, horizon: datetime) -> Occurrence:
    """Decide which occurrences of a due job to fire and which to record as skipped.

    Occurrences from ``job.next_fire_at`` up to ``horizon`` are considered, and the first always:
    its caller took the job because it is due (a crowd's jobs are taken before their instants). One found more than
    the misfire grace after its time was *missed* (the node was down, the shard unowned, or the
    job paused); the job's misfire policy decides what becomes of missed ones:

    - ``fire_once``: one run, for the latest missed occurrence; the other missed ones are
      skipped (occurrences still within the grace fire as usual);
    - ``fire_all``: each missed occurrence fires, the latest ``fire_all_cap`` of them;
    - ``skip``: none fires.

    Runs are written for the instants of the occurrences (:mod:`fastlane.domain.jitter`); the
    job's ``next_fire_at`` stays a fire time of its schedule.
    """
    due = job.next_fire_at
    policy = job.timing.misfire
    recurrence = job.timing.recurrence
    jitter = None if recurrence is None else recurrence.jitter
    missed: list[datetime] = []
    on_time: list[datetime] = []
    occurrence: datetime | None = due
    walked = 0
    while occurrence is not None:
        # A run's instant is its fire time, or later by its jitter (never past the next fire time,
        # so instants grow with fire times and the loop may stop at the first past the horizon).
        following = _next(recurrence, occurrence) if jitter is not None else None
        instant = occurrence if jitter is None else occurrence + jitter_offset(job.job_id, occurrence, following, jitter)
        if instant > horizon and walked:
            break
        (missed if now - instant > policy.grace else on_time).append(instant)
        walked += 1
        if walked >= MAX_OCCURRENCES_WALKED:
            # Jump over the rest of a very long outage: they count as missed but are not listed.
            occurrence = _next(recurrence, max(occurrence, now - policy.grace))
            continue
        occurrence = following if jitter is not None else _next(recurrence, occurrence)

    fire: list[datetime]
    skipped: list[datetime]
    if not missed:
        fire, skipped = on_time, []
    elif policy.kind is MisfireKind.FIRE_ONCE:
        fire = missed[-1:] + on_time
        skipped = missed[:-1]
    elif policy.kind is MisfireKind.FIRE_ALL:
        cap = policy.fire_all_cap
        fire = missed[-cap:] + on_time
        skipped = missed[:-cap]
    else:
        fire, skipped = on_time, missed
    return Occurrence(
        job_id=job.job_id,
        expected_next_fire_at=due,
        fire_times=tuple(fire),
        skipped_times=tuple(skipped[-MAX_SKIPPED_RECORDED:]),
        next_fire_at=occurrence,
    )


def _next(recurrence: Schedule | None, after: datetime) -> datetime | None:
    return None if recurrence is None else next_fire_after(recurrence, after)


def backoff_delay(policy: RetryPolicy, failed_attempts: int, rng: random.Random) -> timedelta:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base * 2^(n-1))].

    The doublings are counted up to the cap before anything is multiplied, so a hundredth
    attempt costs no 2^99 and cannot overflow ``timedelta``.
    """
    ceiling = policy.backoff_base
    for _ in range(max(failed_attempts - 1, 0)):
        if ceiling >= policy.backoff_cap:
            break
        ceiling *= 2
    ceiling = min(ceiling, policy.backoff_cap)
    return timedelta(seconds=rng.uniform(0.0, ceiling.total_seconds()))


def next_retry_at(
    policy: RetryPolicy,
    *,
    attempts_made: int,
    first_attempt_at: datetime,
    now: datetime,
    rng: random.Random,
) -> datetime | None:
    """When the next attempt may start, or None when the retry budget is spent."""
    if attempts_made >= policy.max_attempts:
        return None
    retry_at = now + backoff_delay(policy, attempts_made, rng)
    if policy.max_retry_time is not None and retry_at - first_attempt_at > policy.max_retry_time:
        return None
    return retry_at
