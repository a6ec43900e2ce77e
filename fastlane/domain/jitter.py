"""Jitter: a recurring schedule's runs spread over a span after each fire time, the same way on
every node.

A thousand jobs on ``0 * * * *`` would otherwise all start in the same millisecond, and so hit
whatever they call at once. With ``Schedule.jitter`` each occurrence starts a fixed offset after
its fire time, in ``[0, jitter)``: the offset is a hash of the job id and the fire time, so it is
the same on every node and after every restart (a node taking a shard over writes the very
instants the old owner would have, and the store's one-run-per-instant rule still holds), and
different from job to job. It never makes a run earlier than its fire time.

An offset is also kept short of the next fire time, so a job's runs stay in the order of its fire
times however short the schedule's gaps are (a cron expression's gaps vary, and daylight saving
shortens some): with a jitter longer than a gap, the occurrences before that gap spread over the
gap instead.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

from fastlane.domain.models import DueJob, Schedule
from fastlane.domain.schedules import next_fire_after

_MICROSECOND = timedelta(microseconds=1)
_SCALE = 1 << 64
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def jitter_offset(job_id: str, fire_time: datetime, following: datetime | None, jitter: timedelta) -> timedelta:
    """How long after ``fire_time`` the job's run for it starts: in ``[0, jitter)``, and before
    ``following`` (the schedule's next fire time; None: there is none)."""
    span = jitter if following is None else min(jitter, following - fire_time - _MICROSECOND)
    span_us = span // _MICROSECOND
    if span_us <= 0:
        return timedelta(0)
    key = f"{job_id}@{(fire_time - _EPOCH) // _MICROSECOND}".encode()
    fraction = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
    return timedelta(microseconds=fraction * span_us // _SCALE)


def run_instant(job_id: str, schedule: Schedule, fire_time: datetime) -> datetime:
    """When the job's run for ``fire_time`` starts: the fire time, plus its jitter if the schedule has one."""
    if schedule.jitter is None:
        return fire_time
    return fire_time + jitter_offset(job_id, fire_time, next_fire_after(schedule, fire_time), schedule.jitter)


def due_instant(job: DueJob) -> datetime:
    """When the window's job is next due: its next fire time's run instant."""
    recurrence = job.timing.recurrence
    if recurrence is None or recurrence.jitter is None:
        return job.next_fire_at
    return run_instant(job.job_id, recurrence, job.next_fire_at)


__all__ = ["due_instant", "jitter_offset", "run_instant"]
