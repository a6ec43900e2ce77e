"""Conversion between protobuf messages and domain models, in both directions.

Servicers, the client SDK and the CLI all go through here, so a field is mapped in one place.
Inbound conversions never raise anything but :class:`InvalidArgument` naming the field as the
proto names it: timestamps and durations are range-checked before they become ``datetime`` and
``timedelta`` (where a year-1 instant or a 1e18-second duration would overflow), and enumerations
are checked against their members. The ranges a field may take are :mod:`fastlane.domain.validation`'s.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TypeVar, overload

from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from fastlane._proto import admin_pb2
from fastlane._proto import common_pb2 as pb
from fastlane.domain import validation
from fastlane.domain.access import ApiToken
from fastlane.domain.limits import MAX_CRON_LENGTH, MAX_TIMEZONE_LENGTH
from fastlane.domain.models import (
    DEFAULT_TENANT,
    Attempt,
    Delivery,
    Job,
    JobSpec,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    Run,
    Schedule,
    ScheduleKind,
)
from fastlane.domain.quotas import TenantQuota
from fastlane.errors import InvalidArgument
from fastlane.rpc.enums import ATTEMPT_OUTCOME, DELIVERY, JOB_STATE, MISFIRE_KIND, OVERLAP_POLICY, ROLE, RUN_STATE
from fastlane.runtime.clock import EPOCH

_Default = TypeVar("_Default", timedelta, None)  # a field with a default never comes back None


# -- scalars -----------------------------------------------------------------------------------


# Timestamps and durations are converted by arithmetic on timedelta's normalised fields rather
# than protobuf's From/ToDatetime helpers: every run crosses the wire with several of them, and
# the helpers cost several times more.


@overload
def timestamp(instant: datetime) -> Timestamp: ...
@overload
def timestamp(instant: None) -> None: ...
@overload
def timestamp(instant: datetime | None) -> Timestamp | None: ...
def timestamp(instant: datetime | None) -> Timestamp | None:
    """A datetime as a protobuf Timestamp; None stays None."""
    if instant is None:
        return None
    since = instant - EPOCH  # days may be negative; seconds and microseconds never are
    return Timestamp(seconds=since.days * 86_400 + since.seconds, nanos=since.microseconds * 1_000)


def instant(message: Timestamp, present: bool = True) -> datetime | None:
    return epoch_plus(message) if present else None


def epoch_plus(message: Timestamp) -> datetime:
    """The instant a (set) Timestamp holds, as aware UTC."""
    return EPOCH + timedelta(seconds=message.seconds, microseconds=message.nanos // 1_000)


# Protobuf's own range for Timestamp (years 1..9999) and Duration (about ±10,000 years).
_MIN_TIMESTAMP_SECONDS, _MAX_TIMESTAMP_SECONDS = -62_135_596_800, 253_402_300_799
_MAX_DURATION_SECONDS = 315_576_000_000


def instant_in(field: str, message: Timestamp) -> datetime:
    """A request's (set) Timestamp as aware UTC, within the supported range."""
    if not (_MIN_TIMESTAMP_SECONDS <= message.seconds <= _MAX_TIMESTAMP_SECONDS and 0 <= message.nanos < 1_000_000_000):
        raise InvalidArgument(field, f"seconds={message.seconds} nanos={message.nanos} is not a valid timestamp")
    return validation.instant(field, epoch_plus(message))


def duration_in(field: str, message: Duration) -> timedelta:
    """A request's (set) Duration; its range is checked where the field's bounds are known."""
    seconds, nanos = message.seconds, message.nanos
    if abs(seconds) > _MAX_DURATION_SECONDS or abs(nanos) >= 1_000_000_000 or seconds * nanos < 0:
        raise InvalidArgument(field, f"seconds={seconds} nanos={nanos} is not a valid duration")
    return timedelta(seconds=seconds, microseconds=nanos // 1_000 if nanos >= 0 else -((-nanos) // 1_000))


def duration(delta: timedelta | None) -> Duration | None:
    if delta is None:
        return None
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    seconds, remainder = divmod(abs(micros), 1_000_000)
    sign = -1 if micros < 0 else 1  # a negative Duration has seconds and nanos both negative
    return Duration(seconds=sign * seconds, nanos=sign * remainder * 1_000)


# -- schedules and specs -----------------------------------------------------------------------


def schedule_to_pb(schedule: Schedule) -> pb.Schedule:
    jitter = duration(schedule.jitter)
    if schedule.kind is ScheduleKind.NOW:
        return pb.Schedule(now=pb.Now(), jitter=jitter)
    if schedule.kind is ScheduleKind.AT:
        return pb.Schedule(at=timestamp(schedule.at), jitter=jitter)
    if schedule.kind is ScheduleKind.CRON:
        return pb.Schedule(cron=pb.Cron(expression=schedule.cron or "", timezone=schedule.timezone), jitter=jitter)
    return pb.Schedule(interval=pb.Interval(every=duration(schedule.every), anchor=timestamp(schedule.anchor)),
                       jitter=jitter)


def schedule_from_pb(message: pb.Schedule, field: str = "spec.schedule") -> Schedule:
    schedule = _schedule_kind_from_pb(message, field)
    if message.HasField("jitter"):
        jitter = duration_in(f"{field}.jitter", message.jitter)
        if jitter:  # a zero jitter is none
            schedule = replace(schedule, jitter=jitter)
    return schedule


def _schedule_kind_from_pb(message: pb.Schedule, field: str) -> Schedule:
    kind = message.WhichOneof("kind")
    if kind == "now":
        return Schedule.now()
    if kind == "at":
        return Schedule.at_instant(instant_in(f"{field}.at", message.at))
    if kind == "cron":
        cron = message.cron
        validation.text(f"{field}.cron.expression", cron.expression, max_length=MAX_CRON_LENGTH)
        validation.text(f"{field}.cron.timezone", cron.timezone, max_length=MAX_TIMEZONE_LENGTH)
        return Schedule.cron_expr(cron.expression, cron.timezone or "UTC")
    if kind == "interval":
        interval = message.interval
        if not interval.HasField("every"):
            raise InvalidArgument(f"{field}.interval.every", "is required for an interval schedule")
        anchor = instant_in(f"{field}.interval.anchor", interval.anchor) if interval.HasField("anchor") else None
        return Schedule.interval(duration_in(f"{field}.interval.every", interval.every), anchor)
    raise InvalidArgument(field, "is missing: set one of now, at, cron or interval")


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
        concurrency_limit=spec.concurrency_limit or 0,
        retry=pb.RetryPolicy(
            max_attempts=retry.max_attempts,
            max_retry_time=duration(retry.max_retry_time),
            backoff_base=duration(retry.backoff_base),
            backoff_cap=duration(retry.backoff_cap),
        ),
        misfire=pb.MisfirePolicy(kind=MISFIRE_KIND.number(misfire.kind), grace=duration(misfire.grace),
                                 fire_all_cap=misfire.fire_all_cap),
        overlap=OVERLAP_POLICY.number(spec.overlap),
        delivery=DELIVERY.number(spec.delivery),
        timeout=duration(spec.timeout),
        lease_ttl=duration(spec.lease_ttl),
    )


def spec_from_pb(message: pb.JobSpec, *, tenant: str | None = None) -> JobSpec:
    """A spec from the wire; unset fields take the model's defaults."""
    defaults_retry, defaults_misfire = RetryPolicy(), MisfirePolicy()
    retry = message.retry
    misfire = message.misfire
    if not message.HasField("schedule"):
        raise InvalidArgument("spec.schedule", "is missing: set one of now, at, cron or interval")

    def optional_duration(owner: Message, name: str, field: str, default: _Default) -> timedelta | _Default:
        return duration_in(field, getattr(owner, name)) if owner.HasField(name) else default

    return JobSpec(
        tenant=tenant or message.tenant or DEFAULT_TENANT,
        name=message.name,
        job_type=message.job_type,
        schedule=schedule_from_pb(message.schedule),
        payload=message.payload,
        priority=message.priority,
        concurrency_key=message.concurrency_key or None,
        concurrency_limit=message.concurrency_limit or None,
        retry=RetryPolicy(
            max_attempts=retry.max_attempts or defaults_retry.max_attempts,
            max_retry_time=optional_duration(retry, "max_retry_time", "spec.retry.max_retry_time", None),
            backoff_base=optional_duration(retry, "backoff_base", "spec.retry.backoff_base", defaults_retry.backoff_base),
            backoff_cap=optional_duration(retry, "backoff_cap", "spec.retry.backoff_cap", defaults_retry.backoff_cap),
        ),
        misfire=MisfirePolicy(
            kind=MISFIRE_KIND.member(misfire.kind, "spec.misfire.kind", defaults_misfire.kind),
            grace=optional_duration(misfire, "grace", "spec.misfire.grace", defaults_misfire.grace),
            fire_all_cap=misfire.fire_all_cap or defaults_misfire.fire_all_cap,
        ),
        overlap=OVERLAP_POLICY.member(message.overlap, "spec.overlap", OverlapPolicy.ALLOW),
        delivery=DELIVERY.member(message.delivery, "spec.delivery", Delivery.AT_LEAST_ONCE),
        timeout=optional_duration(message, "timeout", "spec.timeout", None),
        lease_ttl=optional_duration(message, "lease_ttl", "spec.lease_ttl", timedelta(seconds=30)),
    )


# -- stored objects ----------------------------------------------------------------------------


def job_to_pb(job: Job) -> pb.Job:
    return pb.Job(
        job_id=job.job_id,
        spec=spec_to_pb(job.spec),
        state=JOB_STATE.number(job.state),
        next_fire_at=timestamp(job.next_fire_at),
        created_at=timestamp(job.created_at),
        updated_at=timestamp(job.updated_at),
        version=job.version,
        shard_id=job.shard_id,
        error=job.error or "",
        pause_reason=job.pause_reason or "",
    )


def run_to_pb(run: Run) -> pb.Run:
    return pb.Run(
        run_id=run.run_id,
        job_id=run.job_id,
        tenant=run.tenant,
        job_type=run.job_type,
        scheduled_for=timestamp(run.scheduled_for),
        available_at=timestamp(run.available_at),
        state=RUN_STATE.number(run.state),
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
        first_attempt_at=timestamp(run.first_attempt_at),
        first_started_at=timestamp(run.first_started_at),
        backfill_id=run.backfill_id or "",
    )


def attempt_to_pb(attempt: Attempt) -> pb.Attempt:
    return pb.Attempt(
        attempt=attempt.attempt,
        worker_id=attempt.worker_id,
        node_id=attempt.node_id,
        outcome=ATTEMPT_OUTCOME.number(attempt.outcome),
        dispatched_at=timestamp(attempt.dispatched_at),
        started_at=timestamp(attempt.started_at),
        finished_at=timestamp(attempt.finished_at),
        error_code=attempt.error_code or "",
        error_message=attempt.error_message or "",
        error_traceback=attempt.error_traceback or "",
        reported_late=attempt.reported_late,
        redelivery=attempt.redelivery,
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
        state=JOB_STATE.member(message.state, "job.state"),
        next_fire_at=instant(message.next_fire_at, message.HasField("next_fire_at")),
        created_at=message.created_at.ToDatetime(tzinfo=UTC),
        updated_at=message.updated_at.ToDatetime(tzinfo=UTC),
        version=message.version,
        error=message.error or None,
        pause_reason=message.pause_reason or None,
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
        state=RUN_STATE.member(message.state, "run.state"),
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
        progress=round(message.progress, 6),  # a float32 on the wire: 0.4 arrives as 0.4000000059604645
        last_error=message.last_error or None,
        cancel_requested=message.cancel_requested,
        first_attempt_at=instant(message.first_attempt_at, message.HasField("first_attempt_at")),
        first_started_at=instant(message.first_started_at, message.HasField("first_started_at")),
        backfill_id=message.backfill_id or None,
    )


def attempt_from_pb(run_id: str, message: pb.Attempt) -> Attempt:
    return Attempt(
        run_id=run_id,
        attempt=message.attempt,
        lease_token=0,
        worker_id=message.worker_id,
        node_id=message.node_id,
        outcome=ATTEMPT_OUTCOME.member(message.outcome, "attempt.outcome"),
        dispatched_at=message.dispatched_at.ToDatetime(tzinfo=UTC),
        started_at=instant(message.started_at, message.HasField("started_at")),
        finished_at=instant(message.finished_at, message.HasField("finished_at")),
        error_code=message.error_code or None,
        error_message=message.error_message or None,
        error_traceback=message.error_traceback or None,
        reported_late=message.reported_late,
        redelivery=message.redelivery,
    )


# -- API tokens --------------------------------------------------------------------------------


def token_to_pb(token: ApiToken) -> admin_pb2.ApiToken:
    return admin_pb2.ApiToken(
        token_id=token.token_id, tenant=token.tenant, role=ROLE.number(token.role), name=token.name,
        created_at=timestamp(token.created_at), expires_at=timestamp(token.expires_at),
        revoked_at=timestamp(token.revoked_at), last_used_at=timestamp(token.last_used_at),
    )


def token_from_pb(message: admin_pb2.ApiToken) -> ApiToken:
    return ApiToken(
        token_id=message.token_id, tenant=message.tenant, role=ROLE.member(message.role, "token.role"), name=message.name,
        created_at=epoch_plus(message.created_at),
        expires_at=instant(message.expires_at, message.HasField("expires_at")),
        revoked_at=instant(message.revoked_at, message.HasField("revoked_at")),
        last_used_at=instant(message.last_used_at, message.HasField("last_used_at")),
    )


# -- quotas ------------------------------------------------------------------------------------


def quota_to_pb(quota: TenantQuota) -> admin_pb2.Quota:
    message = admin_pb2.Quota()
    if quota.max_jobs is not None:
        message.max_jobs = quota.max_jobs
    if quota.job_creations_per_second is not None:
        message.job_creations_per_second = quota.job_creations_per_second
    if quota.max_waiting_runs is not None:
        message.max_waiting_runs = quota.max_waiting_runs
    return message


def quota_from_pb(message: admin_pb2.Quota) -> TenantQuota:
    """A quota as sent; its bounds are checked by :meth:`TenantQuota.validated`."""
    return TenantQuota(
        max_jobs=message.max_jobs if message.HasField("max_jobs") else None,
        job_creations_per_second=(message.job_creations_per_second
                                  if message.HasField("job_creations_per_second") else None),
        max_waiting_runs=message.max_waiting_runs if message.HasField("max_waiting_runs") else None,
    )
