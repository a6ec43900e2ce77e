"""The domain model: jobs, runs, attempts, shards and the policies that govern them.

Everything here is an immutable value. Input is bounded in one place, :mod:`fastlane.domain.validation`.
"""

from __future__ import annotations

import functools
import uuid
import zlib
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum

# Old import paths, re-exported explicitly (``X as X``) so that type checkers accept them too.
from fastlane.domain.limits import DEFAULT_MAX_PAYLOAD_BYTES as MAX_PAYLOAD_BYTES  # noqa: F401
from fastlane.domain.limits import MAX_CHECKPOINT_BYTES as MAX_CHECKPOINT_BYTES
from fastlane.domain.limits import MIN_LEASE_TTL as MIN_LEASE_TTL

DEFAULT_TENANT = "default"


# -- enumerations ------------------------------------------------------------------------------


class ScheduleKind(StrEnum):
    """Which kind of :class:`Schedule` a job has: once now, once at an instant, cron, or every interval."""

    NOW = "now"
    AT = "at"
    CRON = "cron"
    INTERVAL = "interval"


class JobState(StrEnum):
    """Whether a job's occurrences are being materialised as runs."""

    ACTIVE = "active"
    PAUSED = "paused"
    COMPLETED = "completed"  # a one-shot job whose only occurrence has been materialised
    ERRORED = "errored"  # set aside: processing it raised (see Job.error); resume takes it back


class RunState(StrEnum):
    """Where a run is in its life; :attr:`is_final` states never change again."""

    BUFFERED = "buffered"  # waiting for the previous run of its job to finish (overlap policy)
    SCHEDULED = "scheduled"  # materialised, waiting for its time (or its retry time)
    DISPATCHED = "dispatched"  # sent to a worker, not yet acknowledged as started
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # kept for history of a failed attempt; the run itself retries or dies
    DEAD = "dead"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    LOST = "lost"

    @property
    def is_final(self) -> bool:
        """True for the end states: succeeded, failed, dead, skipped, cancelled and lost."""
        return self in FINAL_RUN_STATES

    @property
    def is_active(self) -> bool:
        """True while the run is buffered, scheduled, dispatched or running (what overlap counts)."""
        return self not in FINAL_RUN_STATES


FINAL_RUN_STATES = frozenset(
    {RunState.SUCCEEDED, RunState.FAILED, RunState.DEAD, RunState.SKIPPED, RunState.CANCELLED, RunState.LOST}
)


class AttemptOutcome(StrEnum):
    """How one attempt (one delivery of a run to a worker) ended, or ``pending`` while it has not."""

    PENDING = "pending"  # delivered, no result yet
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # retryable failure reported by the handler
    PERMANENT_FAILURE = "permanent_failure"
    TIMED_OUT = "timed_out"
    LEASE_EXPIRED = "lease_expired"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"  # a result that arrived for an attempt that no longer owns the run


class OverlapPolicy(StrEnum):
    """What a new occurrence does while the previous run of its job is still active.

    ``allow`` runs it anyway; ``skip`` records it as skipped; ``buffer_one`` lets one run wait as
    buffered (later ones are skipped) and ``buffer_all`` lets every one wait, each starting when the
    one before ends; ``cancel_previous`` cancels the active runs and schedules the new one.
    """

    ALLOW = "allow"
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    BUFFER_ALL = "buffer_all"
    CANCEL_PREVIOUS = "cancel_previous"


class MisfireKind(StrEnum):
    """What happens to occurrences found more than :attr:`MisfirePolicy.grace` late.

    ``fire_once`` makes one run, for the latest; ``fire_all`` makes one for each, up to
    :attr:`MisfirePolicy.fire_all_cap`; ``skip`` makes none. Skipped occurrences stay in history.
    """

    FIRE_ONCE = "fire_once"
    FIRE_ALL = "fire_all"
    SKIP = "skip"


class Delivery(StrEnum):
    """The delivery guarantee of a job's runs.

    ``at_least_once``: a run is delivered again if its worker may not have finished it.
    ``at_most_once``: marked started durably before it is sent and never delivered twice; if its
    worker vanishes it ends ``lost``, and a failure is not retried.
    """

    AT_LEAST_ONCE = "at_least_once"
    AT_MOST_ONCE = "at_most_once"


# -- schedules and policies --------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """When a job fires. Exactly the fields of its ``kind`` are set.

    - ``now``: once, as soon as possible after creation;
    - ``at``: once, at ``at``;
    - ``cron``: ``cron`` (5 fields, or 6 with seconds first) read in ``timezone`` (IANA);
    - ``interval``: every ``every`` from ``anchor`` (default: the creation time).

    ``jitter`` (cron and interval only): each run starts up to this long after its fire time, by
    an offset fixed per job and fire time (:mod:`fastlane.domain.jitter`); None: on the fire time.
    """

    kind: ScheduleKind
    at: datetime | None = None
    cron: str | None = None
    timezone: str = "UTC"
    every: timedelta | None = None
    anchor: datetime | None = None
    jitter: timedelta | None = None

    @property
    def is_one_shot(self) -> bool:
        """True for ``now`` and ``at``: the job fires once."""
        return self.kind in (ScheduleKind.NOW, ScheduleKind.AT)

    @staticmethod
    def now() -> Schedule:
        """Fire once, as soon as possible after the job is created."""
        return Schedule(kind=ScheduleKind.NOW)

    @staticmethod
    def at_instant(at: datetime) -> Schedule:
        """Fire once, at ``at`` (an aware datetime)."""
        return Schedule(kind=ScheduleKind.AT, at=at)

    @staticmethod
    def cron_expr(expr: str, timezone: str = "UTC", *, jitter: timedelta | None = None) -> Schedule:
        """Fire on the cron expression ``expr`` (5 fields, or 6 with seconds first), read in the IANA ``timezone``."""
        return Schedule(kind=ScheduleKind.CRON, cron=expr, timezone=timezone, jitter=jitter)

    @staticmethod
    def interval(every: timedelta, anchor: datetime | None = None, *, jitter: timedelta | None = None) -> Schedule:
        """Fire every ``every`` from ``anchor`` (default: the job's creation time)."""
        return Schedule(kind=ScheduleKind.INTERVAL, every=every, anchor=anchor, jitter=jitter)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How failed attempts are retried: exponential backoff with full jitter, within a budget."""

    max_attempts: int = 3
    max_retry_time: timedelta | None = None
    backoff_base: timedelta = timedelta(seconds=1)
    backoff_cap: timedelta = timedelta(minutes=5)


@dataclass(frozen=True, slots=True, kw_only=True)
class MisfirePolicy:
    """What to do with occurrences that passed while no node owned the shard, the job was paused,
    or its runs' workers were too far behind to write more (``--max-backlog``).

    An occurrence is *missed* when it is found more than ``grace`` after its time.
    """

    kind: MisfireKind = MisfireKind.FIRE_ONCE
    grace: timedelta = timedelta(seconds=10)
    fire_all_cap: int = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """Everything a client says about a job; what ``create`` and ``update`` take."""

    name: str
    job_type: str
    schedule: Schedule
    tenant: str = DEFAULT_TENANT
    payload: bytes = b""
    priority: int = 0
    # Runs of every job of the tenant with this key share one cap, across the cluster: at most
    # ``concurrency_limit`` of them dispatched or running at once (None: no cap; limit None: 1).
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    misfire: MisfirePolicy = field(default_factory=MisfirePolicy)
    overlap: OverlapPolicy = OverlapPolicy.ALLOW
    delivery: Delivery = Delivery.AT_LEAST_ONCE
    timeout: timedelta | None = None
    lease_ttl: timedelta = timedelta(seconds=30)

    @property
    def key_limit(self) -> int | None:
        """The cap of this spec's concurrency key (None without a key)."""
        return None if self.concurrency_key is None else (self.concurrency_limit or 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A stored job: its spec plus identity, state and the precomputed next fire time."""

    job_id: str
    shard_id: int
    spec: JobSpec
    state: JobState
    next_fire_at: datetime | None
    created_at: datetime
    updated_at: datetime
    version: int = 1
    error: str | None = None  # why it was set aside (state errored), with the error id of the log
    pause_reason: str | None = None  # state paused: the reason the pause was given, if any

    @property
    def tenant(self) -> str:
        """The spec's tenant."""
        return self.spec.tenant

    @property
    def name(self) -> str:
        """The spec's name, unique within the tenant."""
        return self.spec.name

    @property
    def job_type(self) -> str:
        """The spec's job type, which routes its runs to workers."""
        return self.spec.job_type


@dataclass(frozen=True, slots=True)
class Timing:
    """What decides a job's occurrences: its recurrence and its misfire policy.

    ``recurrence`` is None for a one-shot job (``now``, ``at``): it has no next occurrence. Jobs
    with the same timing share one value, so the window holds each distinct timing once.
    """

    recurrence: Schedule | None
    misfire: MisfirePolicy

    @staticmethod
    def of(spec: JobSpec) -> Timing:
        """The timing of a job with this spec."""
        return Timing(None if spec.schedule.is_one_shot else spec.schedule, spec.misfire)


@dataclass(frozen=True, slots=True)
class DueJob:
    """A job as the in-memory window holds it: just enough to plan its next occurrences.

    The window holds up to hundreds of thousands of these, so it keeps six references rather
    than the whole job: planning its occurrences needs nothing else, and ``queue`` (its job type
    and tenant, the ready queue its runs join) tells whether that queue is too far behind to add to;
    ``priority`` whether its runs are urgent (deferred only past ``--max-backlog``: see
    ``--priority-reserve``).
    Jobs with the same timing, and those with the same queue, share one value of each.
    """

    job_id: str
    shard_id: int
    next_fire_at: datetime
    timing: Timing
    queue: tuple[str, str]  # (job type, tenant)
    priority: int

    @staticmethod
    def of(job: Job) -> DueJob:
        """The window's view of ``job``. Raises ValueError if it has no next fire time."""
        if job.next_fire_at is None:
            raise ValueError(f"job {job.job_id} has no next_fire_at; it is not due")
        return DueJob(job.job_id, job.shard_id, job.next_fire_at, Timing.of(job.spec), queue_of(job.spec.job_type, job.tenant),
                      job.spec.priority)

    def __lt__(self, other: DueJob) -> bool:
        # The window's heap orders (fire time, job id, job): two entries tie only when one is a
        # dead plan of the same job (removed, then planned again for the same time). Their order
        # does not matter, since the write-ahead tells the live one by identity.
        return False


@functools.lru_cache(maxsize=4096)
def queue_of(job_type: str, tenant: str) -> tuple[str, str]:
    """The ready queue of a job's runs, one shared value per queue: a window's jobs share a handful."""
    return (job_type, tenant)


# -- runs and attempts -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One occurrence of a job (one fire time, or one manual trigger)."""

    run_id: str
    job_id: str
    tenant: str
    job_type: str
    shard_id: int
    scheduled_for: datetime
    available_at: datetime  # when it may next be delivered: scheduled_for, or a retry time
    state: RunState
    attempts: int
    payload: bytes
    priority: int
    manual: bool
    delivery: Delivery
    lease_ttl: timedelta
    created_at: datetime
    updated_at: datetime
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout: timedelta | None = None
    cancel_requested: bool = False
    first_attempt_at: datetime | None = None
    first_started_at: datetime | None = None  # when its first attempt's handler was entered (listings only)
    lease_token: int | None = None
    lease_expires_at: datetime | None = None
    worker_id: str | None = None
    finished_at: datetime | None = None
    progress: float = 0.0
    checkpoint: bytes | None = None
    last_error: str | None = None
    concurrency_key: str | None = None  # copied from the job when the run was made
    concurrency_limit: int | None = None  # set when concurrency_key is
    workflow_run_id: str | None = None  # set on a step run of a workflow run
    step: str | None = None  # with workflow_run_id: which step (item: which item of a fan-out)
    item: int = 0
    # What its handler returned, as JSON; read with the run alone (GetRun), None in listings.
    output: bytes | None = None
    backfill_id: str | None = None  # the backfill that wrote it (a manual run of a past fire time)

    @property
    def idempotency_key(self) -> str:
        """Stable across the run's attempts; see :func:`idempotency_key`."""
        return idempotency_key(self.job_id, self.run_id, self.scheduled_for, self.manual)


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One delivery of a run to a worker, with its outcome."""

    run_id: str
    attempt: int
    lease_token: int
    worker_id: str
    node_id: str
    outcome: AttemptOutcome
    dispatched_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error_code: str | None = None
    error_message: str | None = None
    # Known from its worker's report only: the node that sent it died before recording the
    # dispatch (``dispatched_at`` is then the earliest time the report gives).
    reported_late: bool = False
    # Sent while an earlier, unrecorded delivery of the run was under way: the run went out twice.
    redelivery: bool = False
    error_traceback: str | None = None  # the handler's, if it raised (its last MAX_ERROR_TRACEBACK characters)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardLease:
    """A node's claim on a shard: valid while ``lease_expires_at`` (database clock) is ahead."""

    shard_id: int
    owner: str
    token: int
    lease_expires_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    """A daemon node as the cluster sees it, from its last heartbeat."""

    node_id: str
    address: str
    started_at: datetime
    heartbeat_at: datetime
    clock_offset_ms: float = 0.0
    shards_owned: int = 0
    workers: int = 0
    eligible: bool = True  # False while its clock is off or it is shutting down
    note: str = ""


# -- pure helpers ------------------------------------------------------------------------------


def new_id() -> str:
    """A new random id (a UUID 4 in text form) for a job or a run."""
    return str(uuid.uuid4())


def shard_of(job_id: str, shard_count: int) -> int:
    """The stable shard of a job: CRC-32 of its id, so every node and language agrees."""
    return zlib.crc32(job_id.encode()) % shard_count


def idempotency_key(job_id: str, run_id: str, scheduled_for: datetime, manual: bool) -> str:
    """Stable across attempts: ``job_id:scheduled_for`` for scheduled runs, the run id for manual ones."""
    if manual:
        return run_id
    return f"{job_id}:{scheduled_for.isoformat().replace('+00:00', 'Z')}"


__all__ = [
    "Attempt",
    "AttemptOutcome",
    "Delivery",
    "Job",
    "JobSpec",
    "JobState",
    "MisfireKind",
    "MisfirePolicy",
    "NodeInfo",
    "OverlapPolicy",
    "RetryPolicy",
    "Run",
    "RunState",
    "Schedule",
    "ScheduleKind",
    "ShardLease",
    "idempotency_key",
    "new_id",
    "replace",
    "shard_of",
]
