"""JSON-ready views of jobs, runs, attempts, their history and the cluster, as the CLI prints them
(and the history section that ``jobs get`` and ``runs get`` share).

Instants are RFC 3339 strings with ``Z`` for UTC, durations are seconds, enumerations their values.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import grpc
import orjson

from fastlane.cli.output import note, print_table
from fastlane.client import Client
from fastlane.domain.audit import DEFAULT_AUDIT_LIMIT, AuditEvent, AuditTarget
from fastlane.domain.cluster import ClusterStatus
from fastlane.domain.models import Attempt, Job, Run, Schedule, ScheduleKind
from fastlane.errors import RemoteError
from fastlane.rpc.wire import rfc3339


def seconds(delta: timedelta | None) -> float | None:
    return None if delta is None else delta.total_seconds()


def schedule_view(schedule: Schedule) -> dict[str, Any]:
    view: dict[str, Any] = {"kind": schedule.kind.value}
    if schedule.kind is ScheduleKind.AT:
        view["at"] = rfc3339(schedule.at)
    elif schedule.kind is ScheduleKind.CRON:
        view.update(cron=schedule.cron, timezone=schedule.timezone)
    elif schedule.kind is ScheduleKind.INTERVAL:
        view.update(every_seconds=seconds(schedule.every), anchor=rfc3339(schedule.anchor))
    if schedule.jitter is not None:
        view["jitter_seconds"] = seconds(schedule.jitter)
    return view


def describe_schedule(schedule: Schedule) -> str:
    """One short line for tables: ``cron "30 2 * * *" America/New_York``, ``every 60s``..."""
    if schedule.kind is ScheduleKind.AT:
        return f"at {rfc3339(schedule.at)}"
    jitter = f", jitter {format_seconds(schedule.jitter)}" if schedule.jitter is not None else ""
    if schedule.kind is ScheduleKind.CRON:
        return f'cron "{schedule.cron}" {schedule.timezone}{jitter}'
    if schedule.kind is ScheduleKind.INTERVAL:
        anchor = f" from {rfc3339(schedule.anchor)}" if schedule.anchor else ""
        return f"every {format_seconds(schedule.every)}{anchor}{jitter}"
    return "now"


def format_seconds(delta: timedelta | None) -> str | None:
    """A duration as the flags take one: ``1h30m``, ``1m30s``, ``1.5s``, ``0s``."""
    if delta is None:
        return None
    left = delta.total_seconds()
    if left <= 0 or left >= 100 * 366 * 86_400:
        return f"{left:g}s"
    parts = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count:.0f}{unit}")
    if round(left, 6):
        parts.append(f"{round(left, 6):g}s")
    return "".join(parts)


def payload_view(payload: bytes) -> dict[str, Any]:
    """The payload as JSON when it is JSON (what the CLI and SDK send), else as base64."""
    if not payload:
        return {"payload": None}
    try:
        return {"payload": orjson.loads(payload)}
    except orjson.JSONDecodeError:
        return {"payload": None, "payload_base64": base64.b64encode(payload).decode()}


def job_view(job: Job) -> dict[str, Any]:
    spec = job.spec
    return {
        "job_id": job.job_id,
        "tenant": spec.tenant,
        "name": spec.name,
        "job_type": spec.job_type,
        "state": job.state.value,
        "pause_reason": job.pause_reason,
        "error": job.error,
        "schedule": schedule_view(spec.schedule),
        "next_fire_at": rfc3339(job.next_fire_at),
        **payload_view(spec.payload),
        "priority": spec.priority,
        "concurrency_key": spec.concurrency_key,
        "concurrency_limit": spec.key_limit,
        "retry": {
            "max_attempts": spec.retry.max_attempts,
            "max_retry_time_seconds": seconds(spec.retry.max_retry_time),
            "backoff_base_seconds": seconds(spec.retry.backoff_base),
            "backoff_cap_seconds": seconds(spec.retry.backoff_cap),
        },
        "misfire": {
            "kind": spec.misfire.kind.value,
            "grace_seconds": seconds(spec.misfire.grace),
            "fire_all_cap": spec.misfire.fire_all_cap,
        },
        "overlap": spec.overlap.value,
        "delivery": spec.delivery.value,
        "timeout_seconds": seconds(spec.timeout),
        "lease_ttl_seconds": seconds(spec.lease_ttl),
        "created_at": rfc3339(job.created_at),
        "updated_at": rfc3339(job.updated_at),
        "version": job.version,
        "shard_id": job.shard_id,
    }


def state_shown(job: Job, most: int = 32) -> str:
    """A job's state for a table: a paused job's with the start of its reason."""
    reason = job.pause_reason
    if not reason:
        return job.state.value
    return f"{job.state.value} ({reason if len(reason) <= most else reason[:most - 1] + '…'})"


def job_fields(job: Job) -> list[tuple[str, Any]]:
    """The rows of ``fastlane jobs get``."""
    spec = job.spec
    retry, misfire = spec.retry, spec.misfire
    budget = f", within {format_seconds(retry.max_retry_time)}" if retry.max_retry_time else ""
    return [
        ("job_id", job.job_id),
        ("name", spec.name),
        ("tenant", spec.tenant),
        ("type", spec.job_type),
        ("state", job.state.value),
        ("pause_reason", job.pause_reason),
        ("error", job.error),
        ("schedule", describe_schedule(spec.schedule)),
        ("next_fire_at", job.next_fire_at),
        ("payload", spec.payload.decode(errors="replace") if spec.payload else None),
        ("priority", spec.priority),
        ("concurrency_key", None if spec.concurrency_key is None else f"{spec.concurrency_key} (at most {spec.key_limit} at once)"),
        (
            "retry",
            f"{retry.max_attempts} attempts, backoff {format_seconds(retry.backoff_base)}"
            f"..{format_seconds(retry.backoff_cap)}{budget}",
        ),
        (
            "misfire",
            f"{misfire.kind.value} (grace {format_seconds(misfire.grace)}, fire_all cap {misfire.fire_all_cap})",
        ),
        ("overlap", spec.overlap.value),
        ("delivery", spec.delivery.value),
        ("timeout", format_seconds(spec.timeout)),
        ("lease_ttl", format_seconds(spec.lease_ttl)),
        ("created_at", job.created_at),
        ("updated_at", job.updated_at),
        ("version", job.version),
        ("shard_id", job.shard_id),
    ]


def run_view(run: Run) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "job_id": run.job_id,
        "tenant": run.tenant,
        "job_type": run.job_type,
        "scheduled_for": rfc3339(run.scheduled_for),
        "available_at": rfc3339(run.available_at),
        "state": run.state.value,
        "attempts": run.attempts,
        "manual": run.manual,
        "backfill_id": run.backfill_id,
        "worker_id": run.worker_id,
        "progress": run.progress,
        "last_error": run.last_error,
        "created_at": rfc3339(run.created_at),
        "first_attempt_at": rfc3339(run.first_attempt_at),
        "first_started_at": rfc3339(run.first_started_at),
        "finished_at": rfc3339(run.finished_at),
        "idempotency_key": run.idempotency_key,
        "shard_id": run.shard_id,
        "cancel_requested": run.cancel_requested,
        "checkpoint_bytes": len(run.checkpoint) if run.checkpoint else 0,
        "checkpoint": base64.b64encode(run.checkpoint).decode() if run.checkpoint else None,
    }


def run_io_view(run: Run) -> dict[str, Any]:
    """What ``runs get`` adds to ``run_view``: the run's input (its payload, as :func:`payload_view`
    gives it) and its ``output``, what its handler returned (JSON)."""
    try:
        output = orjson.loads(run.output) if run.output else None
    except orjson.JSONDecodeError:  # the node keeps JSON only; a value from elsewhere is shown as text
        output = run.output.decode(errors="replace") if run.output else None
    return {**payload_view(run.payload), "output": output}


def run_io_fields(run: Run) -> list[tuple[str, Any]]:
    """``run_io_view`` for a person: JSON on one line, bytes that are not JSON by their size."""
    view = run_io_view(run)
    shown = "-" if view["payload"] is None else orjson.dumps(view["payload"]).decode()
    if "payload_base64" in view:
        shown = f"{len(run.payload):,} bytes, not JSON (--json has them, base64)"
    return [("input", shown), ("output", "-" if view["output"] is None else orjson.dumps(view["output"]).decode())]


def run_fields(run: Run) -> list[tuple[str, Any]]:
    """``run_view`` for a person: progress in percent, the checkpoint's size instead of its bytes."""
    view = run_view(run)
    view["progress"] = f"{run.progress * 100:.0f} %"
    if run.checkpoint:
        view["checkpoint"] = f"{len(run.checkpoint):,} bytes (--json has them, base64)"
    return list(view.items())


def run_lag(run: Run) -> timedelta | None:
    """How late the run's first attempt started (its handler entered) after the scheduled time:
    the lag a job sees (None before it started, or from a node that does not say). A backfill's
    run stands for a past fire time: its lag counts from when the backfill wrote it."""
    if run.first_started_at is None:
        return None
    return run.first_started_at - (run.created_at if run.backfill_id else run.scheduled_for)


def run_duration(run: Run) -> timedelta | None:
    """From the first attempt's start to the run's end (None while it runs, or if it never started)."""
    began = run.first_started_at or run.first_attempt_at
    return None if began is None or run.finished_at is None else run.finished_at - began


def attempt_note(attempt: Attempt) -> str:
    """What ``runs get`` says of an attempt beside its outcome: how history knows of it."""
    notes = ["reported late" if attempt.reported_late else "", "redelivery" if attempt.redelivery else ""]
    return ", ".join(note for note in notes if note)


def print_tracebacks(attempts: Sequence[Attempt], *, every: bool = False) -> None:
    """The tracebacks of the attempts whose handler raised: the last one (``every``: all), each
    under a line naming its attempt; nothing when none raised."""
    traced = [attempt for attempt in attempts if attempt.error_traceback]
    for attempt in traced if every else traced[-1:]:
        print()
        print(f"attempt {attempt.attempt} ({attempt.outcome.value}) traceback:")
        print(attempt.error_traceback)
    if len(traced) > 1 and not every:
        earlier = len(traced) - 1
        print(f"({earlier} earlier attempt{'s' if earlier > 1 else ''} raised too: --all-tracebacks shows "
              f"{'them' if earlier > 1 else 'it'})")


def attempt_view(attempt: Attempt) -> dict[str, Any]:
    return {
        "attempt": attempt.attempt,
        "worker_id": attempt.worker_id,
        "node_id": attempt.node_id,
        "outcome": attempt.outcome.value,
        "dispatched_at": rfc3339(attempt.dispatched_at),
        "started_at": rfc3339(attempt.started_at),
        "finished_at": rfc3339(attempt.finished_at),
        "error_code": attempt.error_code,
        "error_message": attempt.error_message,
        "error_traceback": attempt.error_traceback,
        "reported_late": attempt.reported_late,
        "redelivery": attempt.redelivery,
    }


# -- history (the audit trail) -----------------------------------------------------------------


async def fetch_history(client: Client, kind: AuditTarget, target_id: str) -> list[AuditEvent] | None:
    """The history ``jobs get`` and ``runs get`` show; None from a node that keeps none (an
    older release), so that the rest still shows."""
    try:
        return await client.list_audit(kind, target_id)
    except RemoteError as error:
        if error.code is grpc.StatusCode.UNIMPLEMENTED:
            return None
        raise


def actor(event: AuditEvent) -> str:
    """Who made a change, for people: the token's name and id, or that no token was asked for."""
    if event.token_id is None:
        return "unauthenticated (auth off)"
    return f"{event.actor} ({event.token_id})" if event.actor else event.token_id


def audit_view(event: AuditEvent) -> dict[str, Any]:
    return {
        "event_id": event.event_id,
        "at": rfc3339(event.at),
        "action": event.action.value,
        "target_kind": event.target_kind.value,
        "target_id": event.target_id,
        "job_id": event.job_id,
        "token_id": event.token_id,
        "actor": event.actor,
        "detail": event.detail or None,
    }


def history_table(events: list[AuditEvent], *, targets: bool) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """The headers and rows of a history section; ``targets``: a column saying what each event
    is about (a job's history holds its runs' events too)."""
    if targets:
        return (("WHEN", "ACTION", "ACTOR", "TARGET", "DETAIL"),
                [(e.at, e.action.value, actor(e), f"{e.target_kind.value} {e.target_id}", e.detail) for e in events])
    return (("WHEN", "ACTION", "ACTOR", "DETAIL"), [(e.at, e.action.value, actor(e), e.detail) for e in events])


def print_history(history: list[AuditEvent] | None, *, targets: bool) -> None:
    """The history section under ``jobs get`` and ``runs get``."""
    print()
    if history is None:
        note("(no history: this node keeps no audit trail)")
        return
    print("history")
    if not history:
        print("  (no changes recorded)")
        return
    headers, rows = history_table(history, targets=targets)
    print_table(headers, rows)
    if len(history) >= DEFAULT_AUDIT_LIMIT:
        note(f"(showing the newest {len(history)} events)")



def _seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else round((end - start).total_seconds(), 3)


def cluster_view(status: ClusterStatus) -> dict[str, Any]:
    """Nodes and shards. Heartbeat ages and lease times count from the database's clock, which
    every node's clock is measured against, not from this machine's."""
    now = status.database_time
    return {
        "database_time": rfc3339(now),
        "nodes": [
            {
                "node_id": node.node_id,
                "address": node.address,
                "live": node.live,
                "eligible": node.eligible,
                "ready": node.ready,
                "shards_owned": node.shards_owned,
                "workers_connected": node.workers_connected,
                "clock_offset_ms": node.clock_offset_ms,
                "heartbeat_at": rfc3339(node.heartbeat_at),
                "heartbeat_age_seconds": _seconds_between(node.heartbeat_at, now),
                "note": node.note or None,
                "heap_size": node.heap_size,
                "ready_runs": node.ready_runs,
            }
            for node in status.nodes
        ],
        "shards": [
            {
                "shard_id": shard.shard_id,
                "owner": shard.owner or None,
                "token": shard.token,
                "lease_expires_at": rfc3339(shard.lease_expires_at),
                # Negative once the lease has run out and no node has renewed it.
                "lease_expires_in_seconds": _seconds_between(now, shard.lease_expires_at),
            }
            for shard in status.shards
        ],
        "workers": [
            {
                "worker_id": worker.worker_id,
                "tenant": worker.tenant or None,
                "job_types": list(worker.job_types),
                "credits": worker.credits,
                "in_flight": worker.in_flight,
                "node_id": worker.node_id,
            }
            for worker in status.workers
        ],
    }
