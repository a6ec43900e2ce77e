"""The one place that bounds what callers send, before it reaches arithmetic, storage or memory.

Every value that crosses the API is checked here (the servicers call these functions, and the
stores call :func:`validate_spec` again as a last line), so a limit is written once. A bad value
raises :class:`~fastlane.errors.InvalidArgument` naming the field as the proto names it and
saying what would be right. The limits are documented in the README and in the proto comments.

Why these bounds: instants are kept well inside what ``datetime`` can hold, so that adding any
allowed duration, window or lead to any allowed instant cannot overflow; durations and counts
are bounded so that backoff, retry budgets and misfire walks stay finite; strings have a length
and no control characters (PostgreSQL refuses NUL in text, logs and terminals mangle the rest).
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime, timedelta

from fastlane.domain import schedules
from fastlane.domain.access import ApiToken
from fastlane.domain.audit import (
    DEFAULT_AUDIT_LIMIT,
    MAX_AUDIT_DETAIL,
    MAX_AUDIT_LIMIT,
    AuditAction,
    AuditEvent,
    AuditTarget,
)
from fastlane.domain.limits import (
    DEFAULT_PAGE_SIZE,
    FIRST_INSTANT,
    LAST_INSTANT,
    MAX_ATTEMPTS,
    MAX_BACKOFF,
    MAX_CONCURRENCY_LIMIT,
    MAX_CRON_LENGTH,
    MAX_ERROR_TEXT,
    MAX_ERROR_TRACEBACK,
    MAX_FIRE_ALL_CAP,
    MAX_ID_LENGTH,
    MAX_INTERVAL,
    MAX_JITTER,
    MAX_LEASE_TTL,
    MAX_MISFIRE_GRACE,
    MAX_NAME_LENGTH,
    MAX_PAGE_SIZE,
    MAX_PRIORITY,
    MAX_RETRY_TIME,
    MAX_TIMEOUT,
    MIN_BACKOFF,
    MIN_INTERVAL,
    MIN_LEASE_TTL,
    MIN_PRIORITY,
    PAYLOAD_CEILING_BYTES,
)
from fastlane.domain.models import JobSpec, Schedule, ScheduleKind
from fastlane.errors import InvalidArgument

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@-]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # keeps tabs and line feeds


# -- scalars -----------------------------------------------------------------------------------


def name(field: str, value: str) -> str:
    """A tenant, job name or job type: 1–200 of letters, digits and ``._:/@-``."""
    if not (0 < len(value) <= MAX_NAME_LENGTH and _NAME.fullmatch(value)):
        raise InvalidArgument(
            field, f"{_shown(value)} must be 1–{MAX_NAME_LENGTH} of letters, digits and ._:/@- (starting with a letter or digit)"
        )
    return value


def identifier(field: str, value: str, *, required: bool = True) -> str:
    """A job, run or worker id: 1–200 characters, no control characters."""
    if not value and not required:
        return value
    if not value:
        raise InvalidArgument(field, "is required")
    if len(value) > MAX_ID_LENGTH or _CONTROL.search(value):
        raise InvalidArgument(field, f"{_shown(value)} must be 1–{MAX_ID_LENGTH} characters without control characters")
    return value


def text(field: str, value: str, *, max_length: int) -> str:
    """Free text (a cron expression, a zone name): bounded, no control characters."""
    if len(value) > max_length or _CONTROL.search(value):
        raise InvalidArgument(field, f"{_shown(value)} must be at most {max_length} characters without control characters")
    return value


def instant(field: str, value: datetime) -> datetime:
    """An instant within the supported range."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(field, f"{value.isoformat()} has no offset; use RFC 3339, e.g. 2027-01-01T09:00:00Z")
    if not FIRST_INSTANT <= value < LAST_INSTANT:
        raise InvalidArgument(
            field, f"{value.isoformat()} is outside the supported range ({_day(FIRST_INSTANT)} to before {_day(LAST_INSTANT)})"
        )
    return value


def duration(field: str, value: timedelta, low: timedelta, high: timedelta, *, low_inclusive: bool = True) -> timedelta:
    """A duration within ``[low, high]`` (``(low, high]`` when ``low_inclusive`` is false)."""
    too_low = value < low if low_inclusive else value <= low
    if too_low or value > high:
        bracket = "[" if low_inclusive else "("
        raise InvalidArgument(
            field, f"{value.total_seconds():g} s is out of range {bracket}{low.total_seconds():g} s, {high.total_seconds():g} s]"
        )
    return value


def count(field: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InvalidArgument(field, f"{value} is out of range ({low}..{high})")
    return value


def page_size(value: int) -> int:
    """The page size a listing asked for; 0 means the default."""
    return count("page_size", value, 0, MAX_PAGE_SIZE) or DEFAULT_PAGE_SIZE


def payload(field: str, value: bytes, limit: int) -> bytes:
    if len(value) > limit:
        raise InvalidArgument(field, f"{len(value)} bytes is over the limit of {limit} bytes")
    return value


def progress(value: float) -> float:
    """A run's progress: a number from 0 to 1 (NaN is refused)."""
    if not 0.0 <= value <= 1.0:
        raise InvalidArgument("progress", f"{value} is out of range (0..1)")
    return value


def error_text(value: str) -> str:
    """An error code or message from a worker: kept, but cut to a bounded length and cleaned."""
    return _CONTROL.sub(" ", value[:MAX_ERROR_TEXT]) if _CONTROL.search(value) or len(value) > MAX_ERROR_TEXT else value


def traceback_text(value: str) -> str:
    """A handler's traceback from a worker: its last :data:`MAX_ERROR_TRACEBACK` characters (where
    the exception and the innermost frames are), its lines kept, other control characters cleaned."""
    if len(value) > MAX_ERROR_TRACEBACK:
        value = "…" + value[-(MAX_ERROR_TRACEBACK - 1):]
    return _CONTROL_BUT_LINES.sub(" ", value) if _CONTROL_BUT_LINES.search(value) else value


def note_text(value: str, max_length: int) -> str:
    """A note kept for people (an audit event's actor or detail): cut to ``max_length`` and
    cleaned of control characters, never refused."""
    return _CONTROL.sub(" ", value[:max_length]) if _CONTROL.search(value) or len(value) > max_length else value


# -- job specs ---------------------------------------------------------------------------------


def validate_spec(spec: JobSpec, *, max_payload: int = PAYLOAD_CEILING_BYTES) -> JobSpec:
    """Check a job spec; return it unchanged or raise :class:`InvalidArgument` naming the field."""
    name("spec.tenant", spec.tenant)
    name("spec.name", spec.name)
    name("spec.job_type", spec.job_type)
    payload("spec.payload", spec.payload, max_payload)
    count("spec.priority", spec.priority, MIN_PRIORITY, MAX_PRIORITY)
    if spec.concurrency_key is not None:
        name("spec.concurrency_key", spec.concurrency_key)
    if spec.concurrency_limit is not None:
        if spec.concurrency_key is None:
            raise InvalidArgument("spec.concurrency_limit", "needs a concurrency_key: the limit caps the runs of a key")
        count("spec.concurrency_limit", spec.concurrency_limit, 1, MAX_CONCURRENCY_LIMIT)
    validate_schedule(spec.schedule)
    retry = spec.retry
    count("spec.retry.max_attempts", retry.max_attempts, 1, MAX_ATTEMPTS)
    duration("spec.retry.backoff_base", retry.backoff_base, MIN_BACKOFF, MAX_BACKOFF)
    duration("spec.retry.backoff_cap", retry.backoff_cap, retry.backoff_base, MAX_BACKOFF)
    if retry.max_retry_time is not None:
        duration("spec.retry.max_retry_time", retry.max_retry_time, timedelta(0), MAX_RETRY_TIME, low_inclusive=False)
    duration("spec.misfire.grace", spec.misfire.grace, timedelta(0), MAX_MISFIRE_GRACE)
    count("spec.misfire.fire_all_cap", spec.misfire.fire_all_cap, 1, MAX_FIRE_ALL_CAP)
    if spec.timeout is not None:
        duration("spec.timeout", spec.timeout, timedelta(0), MAX_TIMEOUT, low_inclusive=False)
    duration("spec.lease_ttl", spec.lease_ttl, MIN_LEASE_TTL, MAX_LEASE_TTL)
    return spec


# The proto path of each Schedule field, for the errors of ``schedules.validate_schedule``.
_SCHEDULE_FIELDS = {
    "kind": "", "at": ".at", "cron": ".cron.expression", "timezone": ".cron.timezone",
    "every": ".interval.every", "anchor": ".interval.anchor", "jitter": ".jitter",
}


def validate_schedule(schedule: Schedule, field: str = "spec.schedule") -> Schedule:
    """A schedule's shape (``schedules`` checks the fields of its kind) and its fields' ranges;
    errors name the field as the proto does, under ``field``."""
    try:
        schedules.validate_schedule(schedule)
    except InvalidArgument as error:
        raise InvalidArgument(field + _SCHEDULE_FIELDS.get(error.field, f".{error.field}"), error.problem) from None
    text(f"{field}.cron.expression", schedule.cron or "", max_length=MAX_CRON_LENGTH)
    if schedule.kind is ScheduleKind.AT and schedule.at is not None:
        instant(f"{field}.at", schedule.at)
    if schedule.kind is ScheduleKind.INTERVAL:
        if schedule.every is not None:
            duration(f"{field}.interval.every", schedule.every, MIN_INTERVAL, MAX_INTERVAL)
        if schedule.anchor is not None:
            instant(f"{field}.interval.anchor", schedule.anchor)
    if schedule.jitter is not None:
        duration(f"{field}.jitter", schedule.jitter, timedelta(0), MAX_JITTER)
    return schedule


# -- API tokens --------------------------------------------------------------------------------


def validate_token(token: ApiToken) -> ApiToken:
    """Check a token record before it is stored; return it unchanged or raise
    :class:`InvalidArgument` naming the field. The name is a note for people: any text of
    0–200 characters without control characters, empty included."""
    identifier("token_id", token.token_id)
    name("tenant", token.tenant)
    text("name", token.name, max_length=MAX_NAME_LENGTH)
    if token.expires_at is not None:
        instant("expires_at", token.expires_at)
    return token


# -- the audit trail ---------------------------------------------------------------------------


def audit_target(field: str, value: str) -> AuditTarget:
    """What a history listing is about: ``job`` or ``run`` (nothing else, and not empty)."""
    try:
        return AuditTarget(value)
    except ValueError:
        allowed = ", ".join(member.value for member in AuditTarget)
        raise InvalidArgument(field, f"{_shown(value)} is not one of: {allowed}") from None


def audit_limit(value: int) -> int:
    """How many events a history listing asked for; 0 means the default."""
    return count("limit", value, 0, MAX_AUDIT_LIMIT) or DEFAULT_AUDIT_LIMIT


def validate_audit_event(event: AuditEvent) -> AuditEvent:
    """Check an event before it is stored: ids and tenant are refused with
    :class:`InvalidArgument` when out of bounds (they come from stored jobs and runs, so never in
    practice); the actor and detail are notes, cut and cleaned instead. Returns the event as it
    is to be stored."""
    name("tenant", event.tenant)
    if event.action not in set(AuditAction):
        raise InvalidArgument("action", f"{_shown(event.action)} is not one of: {', '.join(AuditAction)}")
    audit_target("target_kind", event.target_kind)
    identifier("target_id", event.target_id)
    identifier("job_id", event.job_id)
    if event.token_id is not None:
        identifier("token_id", event.token_id)
    actor, detail = note_text(event.actor, MAX_NAME_LENGTH), note_text(event.detail, MAX_AUDIT_DETAIL)
    if (actor, detail) != (event.actor, event.detail):
        return replace(event, actor=actor, detail=detail)
    return event


def _shown(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:40] + "…")


def _day(value: datetime) -> str:
    return value.date().isoformat()


__all__ = [
    "audit_limit", "audit_target", "count", "duration", "error_text", "identifier", "instant", "name", "note_text",
    "page_size", "payload", "progress", "text", "validate_audit_event", "validate_schedule", "validate_spec",
    "validate_token",
]
