"""Encoding of the parts of a job spec that are stored as one JSON document.

Indexed fields (tenant, name, job type, priority, state, next fire time) have columns of their
own; schedule and policies travel together as JSON so adding a policy needs no migration.
Both backends use this module, so they store byte-identical documents.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Protocol

import orjson

from fastlane.domain.access import ApiToken, Role
from fastlane.domain.audit import AuditAction, AuditEvent, AuditTarget
from fastlane.domain.models import (
    Attempt,
    AttemptOutcome,
    Delivery,
    DueJob,
    Job,
    JobSpec,
    JobState,
    MisfireKind,
    MisfirePolicy,
    NodeInfo,
    OverlapPolicy,
    RetryPolicy,
    Run,
    RunState,
    Schedule,
    ScheduleKind,
    ShardLease,
    Timing,
    queue_of,
)
from fastlane.domain.quotas import TenantQuota


def _seconds(delta: timedelta | None) -> float | None:
    return None if delta is None else delta.total_seconds()


def _delta(seconds: float | None) -> timedelta | None:
    return None if seconds is None else timedelta(seconds=seconds)


def _instant(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def schedule_to_dict(schedule: Schedule) -> dict[str, Any]:
    doc = {
        "kind": schedule.kind.value,
        "at": schedule.at.isoformat() if schedule.at else None,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "every": _seconds(schedule.every),
        "anchor": schedule.anchor.isoformat() if schedule.anchor else None,
    }
    if schedule.jitter is not None:  # absent otherwise: a schedule without one is stored as before jitter existed
        doc["jitter"] = _seconds(schedule.jitter)
    return doc


def schedule_from_dict(doc: dict[str, Any]) -> Schedule:
    return Schedule(
        kind=ScheduleKind(doc["kind"]),
        at=_instant(doc.get("at")),
        cron=doc.get("cron"),
        timezone=doc.get("timezone") or "UTC",
        every=_delta(doc.get("every")),
        anchor=_instant(doc.get("anchor")),
        jitter=_delta(doc.get("jitter")),
    )


def retry_to_dict(retry: RetryPolicy) -> dict[str, Any]:
    return {
        "max_attempts": retry.max_attempts,
        "max_retry_time": _seconds(retry.max_retry_time),
        "backoff_base": _seconds(retry.backoff_base),
        "backoff_cap": _seconds(retry.backoff_cap),
    }


def retry_from_dict(doc: dict[str, Any]) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=doc["max_attempts"],
        max_retry_time=_delta(doc.get("max_retry_time")),
        backoff_base=timedelta(seconds=doc["backoff_base"]),
        backoff_cap=timedelta(seconds=doc["backoff_cap"]),
    )


def misfire_from_dict(doc: dict[str, Any]) -> MisfirePolicy:
    return MisfirePolicy(
        kind=MisfireKind(doc["kind"]),
        grace=timedelta(seconds=doc["grace"]),
        fire_all_cap=doc["fire_all_cap"],
    )


def encode_policies(spec: JobSpec) -> bytes:
    """The JSON document stored beside a job's columns."""
    return orjson.dumps(
        {
            "schedule": schedule_to_dict(spec.schedule),
            "retry": retry_to_dict(spec.retry),
            "misfire": {
                "kind": spec.misfire.kind.value,
                "grace": _seconds(spec.misfire.grace),
                "fire_all_cap": spec.misfire.fire_all_cap,
            },
            "overlap": spec.overlap.value,
            "delivery": spec.delivery.value,
            "timeout": _seconds(spec.timeout),
            "lease_ttl": _seconds(spec.lease_ttl),
            "concurrency_key": spec.concurrency_key,
            # Resolved (None: 1) so that runs copy it from the document as it is.
            "concurrency_limit": spec.key_limit,
        },
        option=orjson.OPT_SORT_KEYS,
    )


def decode_spec(
    policies: bytes | str,
    *,
    tenant: str,
    name: str,
    job_type: str,
    payload: bytes,
    priority: int,
) -> JobSpec:
    doc = orjson.loads(policies)
    return JobSpec(
        tenant=tenant,
        name=name,
        job_type=job_type,
        payload=bytes(payload),
        priority=priority,
        schedule=schedule_from_dict(doc["schedule"]),
        retry=retry_from_dict(doc["retry"]),
        misfire=misfire_from_dict(doc["misfire"]),
        overlap=OverlapPolicy(doc["overlap"]),
        delivery=Delivery(doc["delivery"]),
        timeout=_delta(doc.get("timeout")),
        lease_ttl=timedelta(seconds=doc["lease_ttl"]),
        concurrency_key=doc.get("concurrency_key"),
        concurrency_limit=doc.get("concurrency_limit"),
    )


# -- rows to models ----------------------------------------------------------------------------
# Backends convert their column types (timestamps above all) first, then build models here.


class Row(Protocol):
    """A row as the builders below read it: its columns by name. asyncpg's ``Record`` and the
    SQLite store's dicts both are one; ``Record`` is no ``Mapping``, and converting each row to
    one would cost the hot path a copy per row."""

    def __getitem__(self, column: str, /) -> Any: ...


def optional_column(row: Row, column: str) -> Any:
    """A column a row may lack (None then): one added by a later schema version."""
    try:
        return row[column]
    except KeyError:
        return None


def build_job(row: Row) -> Job:
    return Job(
        job_id=row["job_id"],
        shard_id=row["shard_id"],
        spec=decode_spec(
            row["policies"],
            tenant=row["tenant"],
            name=row["name"],
            job_type=row["job_type"],
            payload=row["payload"],
            priority=row["priority"],
        ),
        state=JobState(row["state"]),
        next_fire_at=row["next_fire_at"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        version=row["version"],
        error=row["error"],
        pause_reason=row["pause_reason"],
    )


@functools.lru_cache(maxsize=4096)
def decode_timing(schedule: str | bytes | None, misfire: str | bytes) -> Timing:
    """The timing stored as these JSON texts. Cached: most jobs in a window share a handful of
    timings, and a cache hit decodes nothing and makes the jobs share one value in memory."""
    return Timing(
        None if schedule is None else schedule_from_dict(orjson.loads(schedule)),
        misfire_from_dict(orjson.loads(misfire)),
    )


def build_due_job(
    job_id: str, shard_id: int, next_fire_at: datetime, schedule: str | bytes | None, misfire: str | bytes,
    job_type: str, tenant: str, priority: int,
) -> DueJob:
    return DueJob(job_id, shard_id, next_fire_at, decode_timing(schedule, misfire), queue_of(job_type, tenant), priority)


# Runs are built by the thousand per second: repeated values are decoded once.
_RUN_STATES = {state.value: state for state in RunState}
_DELIVERIES = {delivery.value: delivery for delivery in Delivery}


@functools.lru_cache(maxsize=1024)
def _retry_policy(document: str | bytes) -> RetryPolicy:
    return retry_from_dict(orjson.loads(document))


@functools.lru_cache(maxsize=1024)
def _milliseconds(value: int) -> timedelta:
    return timedelta(milliseconds=value)


def run_state(row: Row) -> RunState:
    return _RUN_STATES[row["state"]]


def build_run(row: Row, previous: Run | None = None, job_ids: Mapping[str, str] | None = None) -> Run:
    """The run of ``row``, holding equal values once where it cheaply can (see :func:`build_runs`):
    ``previous`` is the run built before it in the same batch, ``job_ids`` the job ids already interned.
    A driver makes a new object of every value of every row, and the fast lane holds runs by the
    hundred thousand before their instant."""
    job_type, tenant = queue_of(row["job_type"], row["tenant"])  # a node sees a handful
    job_id = row["job_id"]
    if job_ids is not None:
        job_id = job_ids.get(job_id, job_id)
    scheduled_for = row["scheduled_for"]
    available_at = row["available_at"]
    if available_at == scheduled_for:  # until it is retried
        available_at = scheduled_for
    created_at = row["created_at"]
    if previous is not None and created_at == previous.created_at:  # one statement's rows
        created_at = previous.created_at
    updated_at = row["updated_at"]
    if updated_at == created_at:  # until it is dispatched
        updated_at = created_at
    return Run(
        run_id=row["run_id"],
        job_id=job_id,
        tenant=tenant,
        job_type=job_type,
        shard_id=row["shard_id"],
        scheduled_for=scheduled_for,
        available_at=available_at,
        state=_RUN_STATES[row["state"]],
        attempts=row["attempts"],
        payload=bytes(row["payload"]),
        priority=row["priority"],
        manual=bool(row["manual"]),
        delivery=_DELIVERIES[row["delivery"]],
        lease_ttl=_milliseconds(row["lease_ttl_ms"]),
        retry=_retry_policy(row["retry"]),
        timeout=None if row["timeout_ms"] is None else _milliseconds(row["timeout_ms"]),
        cancel_requested=bool(row["cancel_requested"]),
        first_attempt_at=row["first_attempt_at"],
        lease_token=row["lease_token"],
        lease_expires_at=row["lease_expires_at"],
        worker_id=row["worker_id"],
        progress=row["progress"] or 0.0,  # the constant: one object for every run not started
        checkpoint=None if row["checkpoint"] is None else bytes(row["checkpoint"]),
        last_error=row["last_error"],
        created_at=created_at,
        updated_at=updated_at,
        finished_at=row["finished_at"],
        concurrency_key=row["concurrency_key"],
        concurrency_limit=row["concurrency_limit"],
        # Optional: these columns came with schema version 14, and a run read from an
        # older schema (a store mid-upgrade, the migration tests) has none.
        workflow_run_id=optional_column(row, "workflow_run_id"),
        step=optional_column(row, "step"),
        item=optional_column(row, "item") or 0,
        backfill_id=optional_column(row, "backfill_id"),  # schema version 17
    )


def build_runs(rows: Iterable[Row], *, job_ids: Iterable[str] = ()) -> list[Run]:
    """The runs of a batch of rows (a write-ahead's inserted runs, a rebuild's chunk), equal values
    kept once: a batch's rows share their statement's ``created_at`` (and ``updated_at``, until
    dispatched), a run's ``available_at`` is its ``scheduled_for`` (until retried), its tenant and
    job type are those of every run of its queue, and ``job_ids`` are the ids the window already
    holds (a recurring job's run shares its planned job's id). A run waiting in memory (in the
    lane until its instant, in a ready queue after it) then holds one object per distinct value
    rather than one per column."""
    interned = {job_id: job_id for job_id in job_ids}
    runs: list[Run] = []
    previous: Run | None = None
    for row in rows:
        previous = build_run(row, previous, interned)
        runs.append(previous)
    return runs


def build_listed_run(row: Row) -> Run:
    """A run of a listing, which also reads when its first attempt started (``first_started_at``)."""
    return replace(build_run(row), first_started_at=row["first_started_at"])


def build_run_read_alone(row: Row) -> Run:
    """A run with what its handler returned: the fire path's runs never need it."""
    return replace(build_run(row), output=None if row["output"] is None else bytes(row["output"]))


def build_attempt(row: Row) -> Attempt:
    return Attempt(
        run_id=row["run_id"],
        attempt=row["attempt"],
        lease_token=row["lease_token"],
        worker_id=row["worker_id"],
        node_id=row["node_id"],
        outcome=AttemptOutcome(row["outcome"]),
        dispatched_at=row["dispatched_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        error_code=row["error_code"],
        error_message=row["error_message"],
        error_traceback=row["error_traceback"],
        reported_late=bool(row["reported_late"]),
        redelivery=bool(row["redelivery"]),
    )


def build_lease(row: Row) -> ShardLease:
    return ShardLease(
        shard_id=row["shard_id"],
        owner=row["owner"],
        token=row["token"],
        lease_expires_at=row["lease_expires_at"],
    )


def encode_page_token(*parts: object) -> str:
    return orjson.dumps(list(parts)).hex()


_MAX_PAGE_TOKEN = 1_000  # characters: a token holds a sort key of a few dozen
_TOKEN_PART_BOUND = 1 << 62


def decode_page_token(token: str, *kinds: type) -> list[Any]:
    """The parts of a token made by :func:`encode_page_token`, one of each of ``kinds`` (str or
    int). Tokens are opaque to callers: anything else is refused as not from a previous page."""
    from fastlane.errors import InvalidArgument

    refused = InvalidArgument("page_token", "is not a token returned by a previous page")
    try:
        parts = orjson.loads(bytes.fromhex(token)) if len(token) <= _MAX_PAGE_TOKEN else None
    except ValueError as error:
        raise refused from error
    if not isinstance(parts, list) or len(parts) != len(kinds) or not all(map(_is_part, parts, kinds)):
        raise refused
    return parts


def _is_part(value: object, kind: type) -> bool:
    if kind is int:
        return type(value) is int and abs(value) < _TOKEN_PART_BOUND
    return type(value) is str and len(value) <= 200 and "\x00" not in value


def build_node(row: Row) -> NodeInfo:
    return NodeInfo(
        node_id=row["node_id"],
        address=row["address"],
        started_at=row["started_at"],
        heartbeat_at=row["heartbeat_at"],
        clock_offset_ms=row["clock_offset_ms"],
        shards_owned=row["shards_owned"],
        workers=row["workers"],
        eligible=bool(row["eligible"]),
        note=row["note"],
    )


def build_token(row: Row) -> ApiToken:
    return ApiToken(
        token_id=row["token_id"],
        tenant=row["tenant"],
        role=Role(row["role"]),
        name=row["name"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
        last_used_at=row["last_used_at"],
    )


def build_quota(row: Row) -> TenantQuota:
    return TenantQuota(max_jobs=row["max_jobs"], job_creations_per_second=row["job_creations_per_second"],
                       max_waiting_runs=row["max_waiting_runs"])


def build_audit_event(row: Row) -> AuditEvent:
    return AuditEvent(
        event_id=row["event_id"],
        tenant=row["tenant"],
        at=row["at"],
        action=AuditAction(row["action"]),
        target_kind=AuditTarget(row["target_kind"]),
        target_id=row["target_id"],
        job_id=row["job_id"],
        token_id=row["token_id"],
        actor=row["actor"],
        detail=row["detail"],
    )
