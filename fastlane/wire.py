"""Conversion between protobuf messages and domain models, in both directions.

Servicers, the client SDK and the CLI all go through here, so a field is mapped in one place.
Inbound conversions validate enumerations and raise :class:`InvalidArgument` naming the field.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TypeVar

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from fastlane._proto import common_pb2 as pb
from fastlane.clock import EPOCH
from fastlane.errors import InvalidArgument
from fastlane.models import (
    DEFAULT_TENANT,
    Attempt,
    AttemptOutcome,
    Delivery,
    Job,
    JobSpec,
    JobState,
    MisfireKind,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    Run,
    RunState,
    Schedule,
    ScheduleKind,
)

E = TypeVar("E", bound=StrEnum)


# -- scalars -----------------------------------------------------------------------------------


# Timestamps and durations are converted by arithmetic on timedelta's normalised fields rather
# than protobuf's From/ToDatetime helpers: every run crosses the wire with several of them, and
# the helpers cost several times more.


def timestamp(instant: datetime | None) -> Timestamp | None:
    if instant is None:
        return None
    since = instant - EPOCH  # days may be negative; seconds and microseconds never are
    return Timestamp(seconds=since.days * 86_400 + since.seconds, nanos=since.microseconds * 1_000)


def instant(message: Timestamp, present: bool = True) -> datetime | None:
    return epoch_plus(message) if present else None


def epoch_plus(message: Timestamp) -> datetime:
    """The instant a (set) Timestamp holds, as aware UTC."""
    return EPOCH + timedelta(seconds=message.seconds, microseconds=message.nanos // 1_000)


def duration(delta: timedelta | None) -> Duration | None:
    if delta is None:
        return None
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    seconds, remainder = divmod(abs(micros), 1_000_000)
    sign = -1 if micros < 0 else 1  # a negative Duration has seconds and nanos both negative
    return Duration(seconds=sign * seconds, nanos=sign * remainder * 1_000)


def enum_value(kind: type[E], text: str, field: str, default: E) -> E:
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise InvalidArgument(field, f"{text!r} is not one of: {allowed}") from None


# -- schedules and specs -----------------------------------------------------------------------


def schedule_to_pb(schedule: Schedule) -> pb.Schedule:
    if schedule.kind is ScheduleKind.NOW:
        return pb.Schedule(now=pb.Now())
    if schedule.kind is ScheduleKind.AT:
        return pb.Schedule(at=timestamp(schedule.at))
    if schedule.kind is ScheduleKind.CRON:
        return pb.Schedule(cron=pb.Cron(expression=schedule.cron or "", timezone=schedule.timezone))
    return pb.Schedule(interval=pb.Interval(every=duration(schedule.every), anchor=timestamp(schedule.anchor)))


def schedule_from_pb(message: pb.Schedule) -> Schedule:
    kind = message.WhichOneof("kind")
    if kind == "now":
        return Schedule.now()
    if kind == "at":
        return Schedule.at_instant(message.at.ToDatetime(tzinfo=UTC))
    if kind == "cron":
        return Schedule.cron_expr(message.cron.expression, message.cron.timezone or "UTC")
    if kind == "interval":
        interval = message.interval
        return Schedule.interval(
            interval.every.ToTimedelta(), instant(interval.anchor, interval.HasField("anchor"))
        )
    raise InvalidArgument("schedule", "is missing: set one of now, at, cron or interval")


def spec_to_pb(spec: JobSpec) -> pb.JobSpec:
    retry, misfire = spec.retry, spec.misfire
    return pb.JobSpec(
        tenant=spec.tenant,
        name=spec.name,
        job_type=spec.job_type,
        schedule=schedule_to_pb(spec.schedule),
        payload=spec.payload,
        priority=spec.priority,
        concurrency_key=spec.concurrency_key or "",
        retry=pb.RetryPolicy(
            max_attempts=retry.max_attempts,
            max_retry_time=duration(retry.max_retry_time),
            backoff_base=duration(retry.backoff_base),
            backoff_cap=duration(retry.backoff_cap),
        ),
        misfire=pb.MisfirePolicy(kind=misfire.kind.value, grace=duration(misfire.grace), fire_all_cap=misfire.fire_all_cap),
        overlap=spec.overlap.value,
        delivery=spec.delivery.value,
        timeout=duration(spec.timeout),
        lease_ttl=duration(spec.lease_ttl),
    )


def spec_from_pb(message: pb.JobSpec, *, tenant: str | None = None) -> JobSpec:
    """A spec from the wire; unset fields take the model's defaults."""
    defaults_retry, defaults_misfire = RetryPolicy(), MisfirePolicy()
    retry = message.retry
    misfire = message.misfire
    if not message.HasField("schedule"):
        raise InvalidArgument("schedule", "is missing: set one of now, at, cron or interval")
    return JobSpec(
        tenant=tenant or message.tenant or DEFAULT_TENANT,
        name=message.name,
        job_type=message.job_type,
        schedule=schedule_from_pb(message.schedule),
        payload=message.payload,
        priority=message.priority,
        concurrency_key=message.concurrency_key or None,
        retry=RetryPolicy(
            max_attempts=retry.max_attempts or defaults_retry.max_attempts,
            max_retry_time=retry.max_retry_time.ToTimedelta() if retry.HasField("max_retry_time") else None,
            backoff_base=retry.backoff_base.ToTimedelta() if retry.HasField("backoff_base") else defaults_retry.backoff_base,
            backoff_cap=retry.backoff_cap.ToTimedelta() if retry.HasField("backoff_cap") else defaults_retry.backoff_cap,
        ),
        misfire=MisfirePolicy(
            kind=enum_value(MisfireKind, misfire.kind, "misfire.kind", defaults_misfire.kind),
            grace=misfire.grace.ToTimedelta() if misfire.HasField("grace") else defaults_misfire.grace,
            fire_all_cap=misfire.fire_all_cap or defaults_misfire.fire_all_cap,
        ),
        overlap=enum_value(OverlapPolicy, message.overlap, "overlap", OverlapPolicy.ALLOW),
        delivery=enum_value(Delivery, message.delivery, "delivery", Delivery.AT_LEAST_ONCE),
        timeout=message.timeout.ToTimedelta() if message.HasField("timeout") else None,
        lease_ttl=message.lease_ttl.ToTimedelta() if message.HasField("lease_ttl") else timedelta(seconds=30),
    )


# -- stored objects ----------------------------------------------------------------------------


def job_to_pb(job: Job) -> pb.Job:
    return pb.Job(
        job_id=job.job_id,
        spec=spec_to_pb(job.spec),
        state=job.state.value,
        next_fire_at=timestamp(job.next_fire_at),
        created_at=timestamp(job.created_at),
        updated_at=timestamp(job.updated_at),
        version=job.version,
        shard_id=job.shard_id,
    )


def run_to_pb(run: Run) -> pb.Run:
    return pb.Run(
        run_id=run.run_id,
        job_id=run.job_id,
        tenant=run.tenant,
        job_type=run.job_type,
        scheduled_for=timestamp(run.scheduled_for),
        available_at=timestamp(run.available_at),
        state=run.state.value,
        attempts=run.attempts,
        manual=run.manual,
        worker_id=run.worker_id or "",
        progress=run.progress,
        last_error=run.last_error or "",
        created_at=timestamp(run.created_at),
        finished_at=timestamp(run.finished_at),
        idempotency_key=run.idempotency_key,
        shard_id=run.shard_id,
        checkpoint_bytes=len(run.checkpoint or b""),
        cancel_requested=run.cancel_requested,
    )


def attempt_to_pb(attempt: Attempt) -> pb.Attempt:
    return pb.Attempt(
        attempt=attempt.attempt,
        worker_id=attempt.worker_id,
        node_id=attempt.node_id,
        outcome=attempt.outcome.value,
        dispatched_at=timestamp(attempt.dispatched_at),
        started_at=timestamp(attempt.started_at),
        finished_at=timestamp(attempt.finished_at),
        error_code=attempt.error_code or "",
        error_message=attempt.error_message or "",
    )


def rfc3339(instant_value: datetime | None) -> str | None:
    """An instant as RFC 3339 text, ``Z`` for UTC (the JSON form used by the CLI)."""
    if instant_value is None:
        return None
    return instant_value.isoformat().replace("+00:00", "Z")


def job_from_pb(message: pb.Job) -> Job:
    return Job(
        job_id=message.job_id,
        shard_id=message.shard_id,
        spec=spec_from_pb(message.spec),
        state=JobState(message.state),
        next_fire_at=instant(message.next_fire_at, message.HasField("next_fire_at")),
        created_at=message.created_at.ToDatetime(tzinfo=UTC),
        updated_at=message.updated_at.ToDatetime(tzinfo=UTC),
        version=message.version,
    )


def run_from_pb(message: pb.Run) -> Run:
    """A run as seen by a client. The payload and checkpoint are not sent in listings."""
    return Run(
        run_id=message.run_id,
        job_id=message.job_id,
        tenant=message.tenant,
        job_type=message.job_type,
        shard_id=message.shard_id,
        scheduled_for=message.scheduled_for.ToDatetime(tzinfo=UTC),
        available_at=message.available_at.ToDatetime(tzinfo=UTC),
        state=RunState(message.state),
        attempts=message.attempts,
        payload=b"",
        priority=0,
        manual=message.manual,
        delivery=Delivery.AT_LEAST_ONCE,
        lease_ttl=timedelta(0),
        created_at=message.created_at.ToDatetime(tzinfo=UTC),
        updated_at=message.created_at.ToDatetime(tzinfo=UTC),
        worker_id=message.worker_id or None,
        finished_at=instant(message.finished_at, message.HasField("finished_at")),
        progress=message.progress,
        last_error=message.last_error or None,
        cancel_requested=message.cancel_requested,
    )


def attempt_from_pb(run_id: str, message: pb.Attempt) -> Attempt:
    return Attempt(
        run_id=run_id,
        attempt=message.attempt,
        lease_token=0,
        worker_id=message.worker_id,
        node_id=message.node_id,
        outcome=AttemptOutcome(message.outcome),
        dispatched_at=message.dispatched_at.ToDatetime(tzinfo=UTC),
        started_at=instant(message.started_at, message.HasField("started_at")),
        finished_at=instant(message.finished_at, message.HasField("finished_at")),
        error_code=message.error_code or None,
        error_message=message.error_message or None,
    )
