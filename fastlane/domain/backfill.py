"""Backfill: the occurrences of a recurring job over a past range, as runs to write now.

A backfill takes the fire times ``t`` of a job's schedule with ``start <= t < end`` (``end`` no
later than now: what is still ahead the schedule fires itself) and writes a run for each, at the
instant a run for it has (its fire time, plus the schedule's jitter), so that a run of the range
is told apart from the rest by its instant as any other run is. ``missed`` takes only the fire
times that have no run that ran (none was written, or the one written was skipped by a misfire or
overlap policy); ``all`` takes every one, beside the runs they already have.

Its runs are manual runs of the job (each its own idempotency key, its own run id) that name the
backfill; they wait for a worker as other runs do, and cancelling the backfill cancels those not
yet started. Under ``buffer_all`` (the default) they run one at a time, oldest first, each after
the job's previous run has ended; under ``allow`` all of them are free to start at once (within
the job's concurrency key).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from itertools import takewhile

from fastlane.domain.jitter import run_instant
from fastlane.domain.models import OverlapPolicy, Schedule
from fastlane.domain.schedules import fires_after

_MICROSECOND = timedelta(microseconds=1)

DEFAULT_BACKFILL_BATCH = 1_000
MAX_BACKFILL_BATCH = 10_000
"""Runs one BackfillJob call writes at most (continued with its page token)."""

BACKFILL_OVERLAPS = (OverlapPolicy.BUFFER_ALL, OverlapPolicy.ALLOW)
"""The overlap policies a backfill's runs take; the first is the default."""


class BackfillMode(StrEnum):
    """Which fire times of the range a backfill runs."""

    MISSED = "missed"  # those with no run that ran (none written, or skipped)
    ALL = "all"  # every one


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One fire time of the range and the instant its run is written for."""

    fire_time: datetime
    instant: datetime


def fire_times(schedule: Schedule, start: datetime, end: datetime) -> Iterator[datetime]:
    """The fire times ``t`` of a recurring ``schedule`` (an interval one with its anchor) with
    ``start <= t < end``, in order."""
    return takewhile(lambda fire: fire < end, fires_after(schedule, start - _MICROSECOND))


def occurrences(job_id: str, schedule: Schedule, start: datetime, end: datetime, limit: int) -> list[Occurrence]:
    """At most ``limit`` of the range's fire times, from ``start`` on, with their runs' instants."""
    found: list[Occurrence] = []
    for fire in fire_times(schedule, start, end):
        if len(found) >= limit:
            break
        found.append(Occurrence(fire, run_instant(job_id, schedule, fire)))
    return found


def count_fire_times(schedule: Schedule, start: datetime, end: datetime, at_most: int) -> int:
    """How many fire times the range holds, counted up to ``at_most`` (then ``at_most``)."""
    counted = 0
    for _ in fire_times(schedule, start, end):
        counted += 1
        if counted >= at_most:
            break
    return counted


__all__ = [
    "BACKFILL_OVERLAPS", "DEFAULT_BACKFILL_BATCH", "MAX_BACKFILL_BATCH", "BackfillMode", "Occurrence",
    "count_fire_times", "fire_times", "occurrences",
]
