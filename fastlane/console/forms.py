"""The job form: its fields in, a :class:`~fastlane.domain.models.JobSpec` out.

Only turns text into types and says which field is wrong; the bounds of every value are checked
where every API request's are, by the servicer the form's spec goes to (its one validation point).
The form covers what people set by hand (name, type, schedule, payload, attempts, priority); an
edit keeps the job's other settings (policies, timeouts, concurrency) as they are.

The console never shows a payload (it may hold secrets), so an edit form starts with the payload
empty: left empty, the edit keeps the job's payload; filled, it replaces it; "clear" empties it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import orjson

from fastlane.domain import schedules
from fastlane.domain.models import JobSpec, RetryPolicy, Schedule, ScheduleKind
from fastlane.errors import InvalidArgument

KINDS = tuple(kind.value for kind in ScheduleKind)
MAX_SECONDS = 1e10  # within what a timedelta holds; the API's own bound is lower
MAX_FIELD_CHARS = 1_000  # any field but the payload; the API's own limits are far lower for names


@dataclass(frozen=True, slots=True)
class JobForm:
    """The form's values as text, as shown back to the user after an error."""

    name: str = ""
    job_type: str = ""
    schedule: str = "cron"
    cron: str = ""
    timezone: str = "UTC"
    at: str = ""
    every_seconds: str = ""
    payload: str = ""
    clear_payload: str = ""  # a checkbox: anything but empty empties the job's payload (an edit, payload empty)
    max_attempts: str = "3"
    priority: str = "0"

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> JobForm:
        values = {}
        for spec_field in dataclasses.fields(cls):
            text = str(fields.get(spec_field.name, "")).strip()
            if spec_field.name != "payload" and len(text) > MAX_FIELD_CHARS:
                raise InvalidArgument(spec_field.name, f"is longer than {MAX_FIELD_CHARS} characters")
            values[spec_field.name] = text
        return cls(**values)

    @classmethod
    def from_spec(cls, spec: JobSpec) -> JobForm:
        """The form of an edit: every field of the spec but its payload, which is never shown."""
        s = spec.schedule
        return cls(name=spec.name, job_type=spec.job_type, schedule=s.kind.value, cron=s.cron or "",
                   timezone=s.timezone, at=s.at.isoformat() if s.at else "",
                   every_seconds=_seconds_text(s.every) if s.every else "",
                   max_attempts=str(spec.retry.max_attempts), priority=str(spec.priority))

    def spec(self, *, tenant: str, based_on: JobSpec | None = None) -> JobSpec:
        """The spec the form describes (over ``based_on``'s other settings, for an edit, and its
        payload too unless the form gives one or asks to clear it).

        Raises:
            InvalidArgument: a field cannot be read as its type.
        """
        if self.schedule not in KINDS:
            raise InvalidArgument("schedule", f"must be one of {', '.join(KINDS)}")
        if self.payload:
            try:
                orjson.loads(self.payload)
            except orjson.JSONDecodeError as error:
                raise InvalidArgument("payload", f"is not JSON: {error}") from error
        base = based_on or JobSpec(name=self.name, job_type=self.job_type, schedule=Schedule.now())
        keep_payload = based_on is not None and not self.payload and not self.clear_payload
        return dataclasses.replace(
            base, tenant=tenant, name=self.name, job_type=self.job_type, schedule=self._schedule(base.schedule),
            payload=base.payload if keep_payload else self.payload.encode(),
            priority=_integer("priority", self.priority, 0),
            retry=dataclasses.replace(base.retry if based_on else RetryPolicy(),
                                      max_attempts=_integer("max_attempts", self.max_attempts, RetryPolicy().max_attempts)),
        )

    def _schedule(self, current: Schedule) -> Schedule:
        kind = ScheduleKind(self.schedule)
        if kind is ScheduleKind.CRON:
            return Schedule.cron_expr(self.cron, self.timezone or "UTC")
        if kind is ScheduleKind.AT:
            return Schedule.at_instant(schedules.parse_at(self.at))  # ScheduleError names the field
        if kind is ScheduleKind.INTERVAL:
            try:
                seconds = float(self.every_seconds)
            except ValueError:
                raise InvalidArgument("every_seconds", "must be a number of seconds") from None
            if not 0 < seconds < MAX_SECONDS:  # NaN fails too; the API bounds it more closely
                raise InvalidArgument("every_seconds", "must be a positive number of seconds")
            anchor = current.anchor if current.kind is ScheduleKind.INTERVAL else None
            return Schedule.interval(timedelta(seconds=seconds), anchor)
        return Schedule.now()


def _seconds_text(every: timedelta) -> str:
    """Seconds as text that reads back to the same value (``:g`` would round 1234567 s)."""
    seconds = every.total_seconds()
    return str(int(seconds)) if seconds.is_integer() else repr(seconds)


def _integer(field: str, text: str, default: int) -> int:
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(field, "must be a whole number") from None
    if abs(value) > 1 << 31:
        raise InvalidArgument(field, "is out of range")
    return value
