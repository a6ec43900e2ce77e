"""Pieces both backends share: job-spec rules applied at write time, paging, lease batches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from fastlane.errors import InvalidArgument, JobAlreadyExists
from fastlane.models import Job, JobSpec, JobState, ScheduleKind, ShardLease
from fastlane.schedules import first_fire
from fastlane.storage import codec
from fastlane.storage.base import Page

T = TypeVar("T")


def micros_of_delta(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


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


def rescheduled(current: Job, spec: JobSpec, now: datetime) -> tuple[datetime | None, JobState]:
    """A changed schedule starts afresh from now; an unchanged one keeps its next fire time."""
    if spec.schedule == current.spec.schedule:
        return current.next_fire_at, current.state
    state = JobState.ACTIVE if current.state is JobState.COMPLETED else current.state
    return first_fire(spec.schedule, now), state
