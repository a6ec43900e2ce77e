"""The audit trail: who changed which job or run, how, and when.

One :class:`AuditEvent` is kept for each change a user makes through the API (create, update,
pause, resume, delete and trigger a job; cancel and retry a run), naming the token that made it.
What the scheduler does by itself (materialising, dispatching, recording results) is not audited:
run history already says what happened there. Events outlive the job they are about.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from fastlane.domain.limits import MAX_PAGE_SIZE

DEFAULT_AUDIT_LIMIT = 50  # events a history listing returns when the caller names no limit
MAX_AUDIT_LIMIT = MAX_PAGE_SIZE
MAX_AUDIT_DETAIL = 200  # characters of an event's detail; a longer one is cut


class AuditAction(StrEnum):
    """What was done."""

    CREATED = "created"
    UPDATED = "updated"
    PAUSED = "paused"
    RESUMED = "resumed"
    DELETED = "deleted"
    TRIGGERED = "triggered"  # the target is the run the trigger made
    CANCELLED = "cancelled"
    RETRIED = "retried"
    BACKFILLED = "backfilled"  # a part of a backfill wrote runs of the job


class AuditTarget(StrEnum):
    """What an event is about."""

    JOB = "job"
    RUN = "run"


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditEvent:
    """One change made by a caller, as recorded in the audit trail.

    Attributes:
        target_id: The job's or the run's id.
        job_id: The job (for a run: its job), so that a job's history shows its runs' events too.
        token_id: The token that made the change; None when authentication was off.
        actor: The token's name (a note for people, possibly empty); empty when authentication
            was off.
        detail: A short note (the job's name when created, its version when updated...).
        event_id: Assigned by the store, in the order events are recorded; None before.
        at: When it was recorded, by the database clock; None before.
    """

    tenant: str
    action: AuditAction
    target_kind: AuditTarget
    target_id: str
    job_id: str
    token_id: str | None = None
    actor: str = ""
    detail: str = ""
    event_id: int | None = None
    at: datetime | None = None
