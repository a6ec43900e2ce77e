"""Records that cross the boundary between the engine and a store: what to write, what was written.

Pure values, no I/O: the engine builds them, a :class:`~fastlane.storage.Store` writes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Generic, TypeVar

from fastlane.domain.models import Attempt, AttemptOutcome, Job, JobState, Run, RunState

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Occurrence:
    """What to write for one job whose ``next_fire_at`` has come due.

    ``expected_next_fire_at`` is the value the caller read; the write applies only if the job
    still has it (and is active), so a job changed, paused or deleted meanwhile is left alone and
    two racing writers cannot both advance it.
    """

    job_id: str
    expected_next_fire_at: datetime
    fire_times: tuple[datetime, ...]
    next_fire_at: datetime | None
    skipped_times: tuple[datetime, ...] = ()


@dataclass(frozen=True, slots=True)
class KeyCap:
    """A run's concurrency key: at most ``limit`` runs of (tenant, key) dispatched or running at once."""

    tenant: str
    key: str
    limit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatch:
    """A run handed to a worker: becomes a new attempt holding a lease."""

    run_id: str
    lease_token: int
    worker_id: str
    node_id: str
    lease_ttl: timedelta
    dispatched_at: datetime  # when the node sent it; the journal may write it a little later
    cap: KeyCap | None = None  # the run's concurrency key: see Store.attempts.record_capped_dispatches


@dataclass(frozen=True, slots=True)
class CappedDispatches:
    """What :meth:`Store.attempts.record_capped_dispatches` did: the attempts it started, and the runs
    still ``scheduled`` it left so because their key was at its limit."""

    attempts: list[Attempt]
    blocked: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """A worker's sign of life for one attempt; may carry progress and a checkpoint.

    It extends the attempt's lease by the run's own lease TTL, from the database's now."""

    run_id: str
    lease_token: int
    progress: float | None = None
    checkpoint: bytes | None = None
    started: bool = False
    started_at: datetime | None = None  # with started: when the handler began (node clock); None: not said


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptResult:
    """The outcome a worker reported for one attempt."""

    run_id: str
    lease_token: int
    outcome: AttemptOutcome
    error_code: str | None = None
    error_message: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error_traceback: str | None = None
    output: bytes = b""  # a workflow step's result (JSON), kept for the steps after it


class ChangeKind(StrEnum):
    """What a :class:`Change` is about."""

    JOB = "job"  # created, changed, paused or resumed
    JOB_DELETED = "job_deleted"
    RUN = "run"  # triggered, replayed or cancelled
    MEMBERS = "members"  # a node joined or left


@dataclass(frozen=True, slots=True)
class Change:
    """A change another node may need to act on at once (PostgreSQL NOTIFY).

    ``key`` is the job or run id (``members``: the node id, when known).
    """

    kind: ChangeKind
    shard_id: int = -1
    tenant: str = ""
    key: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Page(Generic[T]):
    items: list[T]
    next_page_token: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFilter:
    """Which of a tenant's runs a bulk action takes: every field that is set must match (no
    states: every state the action takes)."""

    job_id: str | None = None
    job_type: str | None = None
    states: frozenset[RunState] = field(default_factory=frozenset)
    scheduled_from: datetime | None = None  # at or after
    scheduled_before: datetime | None = None
    backfill_id: str | None = None  # the runs one backfill wrote

    def matches(self, run: Run) -> bool:
        """Whether ``run`` is one this filter takes (what the store's statements select)."""
        return ((self.job_id is None or run.job_id == self.job_id)
                and (self.backfill_id is None or run.backfill_id == self.backfill_id)
                and (self.job_type is None or run.job_type == self.job_type)
                and (not self.states or run.state in self.states)
                and (self.scheduled_from is None or run.scheduled_for >= self.scheduled_from)
                and (self.scheduled_before is None or run.scheduled_for < self.scheduled_before))


class RunAction(StrEnum):
    """What a bulk action does to each run it takes."""

    CANCEL = "cancel"
    RETRY = "retry"


@dataclass(frozen=True, slots=True, kw_only=True)
class JobFilter:
    """Which of a tenant's jobs a bulk action takes: every field that is set must match (no
    states: every state the action takes)."""

    job_type: str | None = None
    states: frozenset[JobState] = field(default_factory=frozenset)

    def matches(self, job: Job) -> bool:
        """Whether ``job`` is one this filter takes (what the store's statements select)."""
        return (self.job_type is None or job.job_type == self.job_type) and (not self.states or job.state in self.states)


class JobAction(StrEnum):
    """What a bulk action does to each job it takes."""

    PAUSE = "pause"
    RESUME = "resume"
    DELETE = "delete"


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkOutcome:
    """What one call of a bulk action did (:meth:`fastlane.engine.operations.Operations.act_on_runs`
    and :meth:`~fastlane.engine.operations.Operations.act_on_jobs`)."""

    matched: int  # a dry run: everything the action would take; else what this call took
    acted: int = 0
    skipped: int = 0  # taken, but changed meanwhile so that the action no longer applied
    next_page_token: str = ""  # empty: nothing of the selection left
    stopped_because: str = ""  # why the call stopped short of its limit with some left
