"""The storage contract every backend fulfils with identical behaviour.

Methods speak the domain (materialise runs, acquire shards, record results), never raw SQL.
Writes made on behalf of a shard take the caller's :class:`~fastlane.domain.models.ShardLease` as a
*fence*: they happen only if, inside the same transaction and judged by the database clock, the
lease is still the caller's with the same token. Otherwise they write nothing and raise
:class:`~fastlane.domain.errors.StaleFence`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from fastlane.domain.access import ApiToken
from fastlane.domain.audit import DEFAULT_AUDIT_LIMIT, AuditEvent
from fastlane.domain.models import Attempt, DueJob, Job, JobSpec, JobState, NodeInfo, Run, RunState, ShardLease
from fastlane.domain.quotas import TenantQuota
from fastlane.domain.records import (
    Change,
    JobFilter,
    Occurrence,
    Page,
    RunFilter,
)
from fastlane.domain.workflows import Workflow, WorkflowRun, WorkflowSpec
from fastlane.storage.attempts import AttemptStore
from fastlane.storage.backfills import BackfillStore
from fastlane.storage.capabilities import Capabilities
from fastlane.storage.results import Cancellation, Materialised, TrimmedHistory
from fastlane.storage.workflows import WorkflowChanges, WorkflowRunDetail

DEFAULT_SHARD_COUNT = 64


class JobStore(Protocol):
    """Jobs: their specs, states and lookups."""

    async def create_job(self, spec: JobSpec, *, job_id: str | None = None) -> tuple[Job, bool]:
        """Create a job, idempotent on ``(tenant, name)``.

        Returns ``(job, True)`` when created, ``(existing, False)`` when a job of that name exists
        with the same spec, and raises :class:`~fastlane.domain.errors.JobAlreadyExists` when it exists
        with a different one.
        """
        ...

    async def get_job(self, tenant: str, job_id: str) -> Job: ...

    async def list_jobs(
        self,
        tenant: str,
        *,
        states: Collection[JobState] = (),
        job_type: str | None = None,
        limit: int = 100,
        page_token: str = "",
        name: str | None = None,
    ) -> Page[Job]:
        """A page of the tenant's jobs in id order, of these ``states`` (none: any)."""
        ...

    async def count_selected_jobs(self, tenant: str, selection: JobFilter) -> int:
        """How many of the tenant's jobs ``selection`` takes; its ``states`` must be given (an
        empty set counts none)."""
        ...

    async def update_job(self, tenant: str, job_id: str, spec: JobSpec) -> Job:
        """Replace a job's spec (name and tenant fixed); a new schedule recomputes ``next_fire_at``."""
        ...

    async def pause_job(self, tenant: str, job_id: str, reason: str | None = None) -> Job:
        """Pause an active job, keeping ``reason`` with it until it is resumed; a job not active
        is returned as it is."""
        ...

    async def resume_job(self, tenant: str, job_id: str) -> Job:
        """Resume a paused or errored job. Occurrences missed meanwhile stay due, for the misfire policy."""
        ...

    async def set_job_aside(self, job_id: str, reason: str) -> None:
        """Put a job whose processing raised in state ``errored`` with ``reason``: it leaves the
        due set (nothing fires for it) until an operator resumes it. Unknown jobs are ignored."""
        ...

    async def count_jobs(self, state: JobState) -> int:
        """How many jobs of every tenant are in ``state`` (for gauges)."""
        ...

    async def delete_job(self, tenant: str, job_id: str) -> None:
        """Delete a job. Its runs stay in history; queued ones are cancelled."""
        ...

    async def jobs_by_id_prefix(self, tenant: str, prefix: str, limit: int) -> list[Job]:
        """Up to ``limit`` of the tenant's jobs whose id starts with ``prefix``, in id order."""
        ...

    async def jobs_by_name_prefix(self, tenant: str, prefix: str, limit: int) -> list[Job]:
        """Up to ``limit`` of the tenant's jobs whose name starts with ``prefix``, in the names'
        byte order (the console's search)."""
        ...


class LaneStore(Protocol):
    """What the fast lane reads and writes for the shards a node owns: due jobs made runs, the window, expired leases."""

    async def load_due_jobs(
        self,
        shard_ids: Collection[int],
        before: datetime,
        *,
        at_or_after: datetime | None = None,
        after_job: tuple[datetime, str] | None = None,
        limit: int = 100_000,
    ) -> list[DueJob]:
        """Active jobs of these shards with ``at_or_after <= next_fire_at < before``, in
        ``(next_fire_at, job_id)`` order; ``after_job`` continues after that key (paging).

        Only what the window holds is read and decoded: id, shard, fire time and timing."""
        ...

    async def materialise_runs(self, fences: Sequence[ShardLease], occurrences: Sequence[Occurrence]) -> Materialised:
        """Write runs for due occurrences and advance ``next_fire_at`` in one transaction fenced
        on every lease in ``fences``; occurrences of jobs outside those shards are ignored.

        Returns only the runs actually inserted in state ``scheduled`` (never one that already
        existed), so only those are dispatched.
        """
        ...

    async def pending_runs(
        self, shard_ids: Collection[int], before: datetime, *, skip: Container[str] = frozenset()
    ) -> list[Run]:
        """Runs in state ``scheduled`` (materialised, never or not yet again delivered) due before
        ``before``, in ``available_at`` order. Runs whose id is in ``skip`` (the caller holds them
        already) are left out before their rows are read: a node behind on a large backlog reads
        only ids, not every row it already has in memory."""
        ...

    async def requeue_expired(self, fence: ShardLease) -> list[Run]:
        """Fenced: attempts of this shard whose lease expired by the database clock end
        ``lease_expired``; each run is rescheduled per its retry policy (returned) or ends dead."""
        ...

    async def shards_with_expired_leases(self, shard_ids: Collection[int]) -> list[int]:
        """Which of these shards hold attempts whose lease has expired (a cheap read before
        the fenced ``requeue_expired``)."""
        ...

    async def next_lease_expiry(self, shard_ids: Collection[int]) -> timedelta | None:
        """How long until the earliest lease of an attempt in these shards runs out, by the
        database clock (negative when one is already out); None when no attempt is out. The
        node looks for expired leases again then, so a crashed worker's runs go back to the
        queue as its leases end rather than at the next periodic check."""
        ...


class RunStore(Protocol):
    """Runs and their attempts as users see them: manual runs, cancel, retry, listings."""

    async def create_manual_run(self, tenant: str, job_id: str) -> Run:
        """A run of the job due now, outside its schedule (trigger)."""
        ...

    async def cancel_run(self, tenant: str, run_id: str) -> Cancellation:
        """Cancel a run: one not yet delivered ends ``cancelled`` at once; one with a worker is
        marked ``cancel_requested`` (its worker is told to stop, and it will not be retried).
        A run already cancelled, or whose cancel is requested, is returned as it is (``already``):
        cancelling is idempotent.
        Raises :class:`~fastlane.domain.errors.InvalidState` for a run that finished otherwise."""
        ...

    async def retry_run(self, tenant: str, run_id: str) -> Run:
        """Replay a ``dead`` or ``lost`` run as a new attempt now, with the same idempotency key."""
        ...

    async def get_run(self, tenant: str, run_id: str) -> Run:
        """The run, with its ``output`` (what its handler returned)."""
        ...

    async def list_runs(
        self,
        tenant: str,
        *,
        job_id: str | None = None,
        states: Collection[RunState] = (),
        limit: int = 100,
        page_token: str = "",
        scheduled_from: datetime | None = None,
        scheduled_before: datetime | None = None,
        job_type: str | None = None,
        backfill_id: str | None = None,
    ) -> Page[Run]:
        """Runs newest first (by scheduled time); with ``scheduled_from`` and ``scheduled_before``,
        only those scheduled in ``[scheduled_from, scheduled_before)``; with ``backfill_id``, only
        the runs that backfill wrote."""
        ...

    def page_token_after(self, run: Run) -> str:
        """The ``page_token`` of :meth:`list_runs` that goes on after ``run`` (in its order)."""
        ...

    async def count_runs(self, tenant: str, selection: RunFilter) -> int:
        """How many of the tenant's runs ``selection`` takes; its ``states`` must be given (an
        empty set counts none)."""
        ...

    async def list_attempts(self, run_id: str) -> list[Attempt]: ...

    async def runs_by_id_prefix(self, tenant: str, prefix: str, limit: int) -> list[Run]:
        """Up to ``limit`` of the tenant's runs whose id starts with ``prefix``, in id order."""
        ...


class ShardStore(Protocol):
    """Shard leases (fenced by their token) and node membership."""

    async def acquire_shards(
        self, owner: str, ttl: timedelta, *, limit: int, shard_ids: Collection[int] | None = None
    ) -> list[ShardLease]:
        """Take up to ``limit`` shards that are free or whose lease expired; each token is incremented."""
        ...

    async def renew_shards(self, leases: Sequence[ShardLease], ttl: timedelta) -> list[ShardLease]:
        """Extend leases still owned (same owner and fence token, not expired); the rest are lost."""
        ...

    async def release_shards(self, leases: Sequence[ShardLease]) -> None:
        """Give shards up at once so another node can take them without waiting for expiry."""
        ...

    async def list_shards(self) -> list[ShardLease]:
        """Every shard with its owner ('' when free), token and lease expiry."""
        ...

    async def heartbeat_node(self, node: NodeInfo, live_within: timedelta) -> list[NodeInfo]:
        """Record this node's heartbeat (``heartbeat_at`` = database now) and return every node
        whose heartbeat is more recent than ``live_within``, this one included."""
        ...

    async def remove_node(self, node_id: str) -> None:
        """Forget a node that is shutting down, and tell the others to rebalance."""
        ...

    async def list_nodes(self) -> list[NodeInfo]:
        """Every node with a row, live or not, for the cluster view."""
        ...


class TokenStore(Protocol):
    """API tokens: only the hash of each secret is stored."""

    async def create_token(self, token: ApiToken, secret_hash: bytes) -> ApiToken:
        """Store a new token with the hash of its secret (never the secret) and return it as stored.

        ``created_at`` is the database clock's, whatever the record carries; a new token starts
        unrevoked and unused (the record's ``revoked_at`` and ``last_used_at`` are not stored).
        Raises :class:`~fastlane.errors.InvalidArgument` for a bad id, tenant, name or expiry,
        and :class:`~fastlane.domain.errors.Conflict` when the id is taken.
        """
        ...

    async def find_token(self, token_id: str) -> tuple[ApiToken, bytes] | None:
        """The token with this id and its stored secret hash, or None (revoked and expired ones too)."""
        ...

    async def list_tokens(self, tenant: str | None = None) -> list[ApiToken]:
        """The tokens of ``tenant`` (None: of every tenant), oldest first, then by id."""
        ...

    async def revoke_token(self, token_id: str, *, tenant: str | None = None) -> ApiToken:
        """Revoke a token as of the database clock and return it; revoking it again keeps the
        first time. Raises :class:`~fastlane.domain.errors.TokenNotFound` for an unknown id and, when
        ``tenant`` is given, for a token of another tenant (whose existence is never revealed).
        """
        ...

    async def touch_tokens(self, used: Mapping[str, datetime]) -> None:
        """Record when tokens were last accepted, one statement for the batch: each token's
        ``last_used_at`` becomes the later of the stored time and the given one, so reports
        arriving out of order never move it back. Unknown ids are ignored."""
        ...


class AuditStore(Protocol):
    """The audit trail: who changed a job or a run, and when."""

    async def record_audit(self, events: Sequence[AuditEvent]) -> None:
        """Record changes made by callers, in one statement for the batch and in its order.

        Each event's ``at`` is the database clock's and its ``event_id`` the store's, whatever the
        record carries. Actor and detail are cut to their bounds and cleaned of control
        characters; raises :class:`~fastlane.errors.InvalidArgument` for a bad tenant, action,
        target or id (then nothing of the batch is written). Events are kept after their job is
        deleted.
        """
        ...

    async def list_audit(
        self, tenant: str, *, target_kind: str, target_id: str, limit: int = DEFAULT_AUDIT_LIMIT
    ) -> list[AuditEvent]:
        """The ``limit`` (1..1000) newest events of ``tenant`` about one job or run, newest first
        (by database time, then by recording order). A job's (``target_kind`` ``job``) include
        its runs' events; a run's are its own. Another tenant's events are never listed: a
        target of another tenant has none. Raises :class:`~fastlane.errors.InvalidArgument`
        for a kind other than ``job`` or ``run``, a bad id or a limit out of range.
        """
        ...


class QuotaStore(Protocol):
    """What tenant quotas count, and their overrides."""

    async def count_tenant_jobs(self, tenant: str) -> int:
        """How many jobs ``tenant`` has (in any state), for its ``max_jobs`` quota."""
        ...

    async def count_waiting_runs(self, tenant: str) -> int:
        """How many of ``tenant``'s runs are due and not yet taken by a worker (state
        ``scheduled``, available now), for its ``max_waiting_runs`` quota."""
        ...

    async def list_quota_overrides(self) -> dict[str, TenantQuota]:
        """Every tenant's quota override (unset fields: the nodes' defaults), by tenant."""
        ...

    async def set_quota_override(self, tenant: str, quota: TenantQuota | None) -> None:
        """Replace ``tenant``'s override; None (or one with nothing set) removes it. Raises
        :class:`~fastlane.errors.InvalidArgument` for a bad tenant or a limit out of range."""
        ...


class HistoryStore(Protocol):
    """History retention: trimming finished runs."""

    async def trim_history(self, shard_ids: Collection[int], finished_before: datetime, limit: int) -> TrimmedHistory:
        """Delete at most ``limit`` (1..10,000) finished runs of ``shard_ids`` that ended before
        ``finished_before``, oldest first, with their attempts, in one transaction; say how many
        runs went and how long the transaction kept the database busy. A run not in a final
        state is never deleted, however old. A run another trimmer is deleting at the same moment
        is left to it (PostgreSQL: skipped, not waited for). Raises
        :class:`~fastlane.errors.InvalidArgument` for a limit out of range."""
        ...


class WorkflowStore(Protocol):
    """Workflow definitions and workflow runs."""

    async def create_workflow(self, spec: WorkflowSpec) -> tuple[Workflow, bool]:
        """Store ``spec`` as its workflow's next version (``(workflow, True)``), or return the
        latest version if its definition is the same (``(workflow, False)``); the workflow's
        schedule job is created, changed or deleted to match."""
        ...

    async def get_workflow(self, tenant: str, name: str, version: int | None = None) -> Workflow:
        """A version of a workflow (None: the latest); raises NotFound."""
        ...

    async def list_workflows(self, tenant: str, *, limit: int = 100, page_token: str = "") -> Page[Workflow]:
        """The latest version of each of the tenant's workflows, by name."""
        ...

    async def trigger_workflow(self, tenant: str, name: str, input_json: bytes) -> tuple[WorkflowRun, WorkflowChanges]:
        """Start a run of the workflow's latest version now, with this input (JSON)."""
        ...

    async def start_workflow_runs(self, triggers: Sequence[Run], *, released_here: Collection[int] = ()) -> WorkflowChanges:
        """Start the workflow runs that these due runs of workflow jobs stand for, each once:
        a run no longer ``scheduled`` is skipped. The step runs they schedule in
        ``released_here`` shards the caller releases itself: no other node is told of them."""
        ...

    async def advance_workflow_runs(self, workflow_run_ids: Collection[str], *,
                                    released_here: Collection[int] = ()) -> WorkflowChanges:
        """Make the steps that became ready, exactly once each, and end the workflow runs that are
        done. The runs scheduled in ``released_here`` shards the caller releases itself."""
        ...

    async def workflow_runs_to_advance(self, shard_ids: Collection[int], limit: int = 1_000) -> list[str]:
        """Running workflow runs of these shards with step runs that ended since their last advance."""
        ...

    async def cancel_workflow_run(self, tenant: str, workflow_run_id: str) -> tuple[WorkflowRun, WorkflowChanges]:
        """Cancel a running workflow run (an ended one is returned unchanged)."""
        ...

    async def resume_workflow_run(self, tenant: str, workflow_run_id: str) -> tuple[WorkflowRun, WorkflowChanges]:
        """Run a failed or cancelled workflow run on: its failed and cancelled steps again, not its
        succeeded ones. Raises InvalidState for a running or succeeded one."""
        ...

    async def get_workflow_run(self, tenant: str, workflow_run_id: str) -> WorkflowRunDetail:
        """A workflow run with its version of the workflow and its step runs."""
        ...

    async def list_workflow_runs(self, tenant: str, name: str, *, limit: int = 100,
                                 page_token: str = "") -> Page[WorkflowRun]:
        """The runs of a workflow (every version), newest first."""
        ...

    async def workflow_runs_by_id_prefix(self, tenant: str, prefix: str, limit: int) -> list[WorkflowRun]:
        """Up to ``limit`` of the tenant's workflow runs whose id starts with ``prefix``, in id order."""
        ...


class Store(Protocol):
    """Durable state of a fastlane cluster, in parts, one concept each; the store itself owns the
    connections, the schema and the database's clock. All datetimes are aware UTC."""

    url: str
    jobs: JobStore
    lane: LaneStore
    runs: RunStore
    attempts: AttemptStore
    shards: ShardStore
    tokens: TokenStore
    audit: AuditStore
    quotas: QuotaStore
    history: HistoryStore
    workflows: WorkflowStore
    backfills: BackfillStore

    @property
    def capabilities(self) -> Capabilities:
        """What this backend can and cannot do: what callers ask instead of which database it is."""
        ...

    @property
    def write_fault(self) -> str | None:
        """What keeps every write from committing, with its fix ("the disk holding ... is full"),
        or None once one commits again; always None unless ``capabilities.write_faults``."""
        ...

    async def write_fault_changed(self, fault: str | None) -> None:
        """Return once :attr:`write_fault` differs from ``fault``."""
        ...

    async def migrate(self) -> int:
        """Apply pending migrations; return the schema version now in force."""
        ...

    async def close(self) -> None:
        """Release every connection. Safe to call twice."""
        ...

    async def db_now(self) -> datetime:
        """The database clock, which judges every lease."""
        ...

    async def shard_count(self) -> int: ...

    @property
    def server_epoch(self) -> int:
        """Goes up by one each time the store finds itself on another database server history:
        a failover to a promoted standby (a new timeline), or another system altogether. What a
        node remembers of the old server (its windows) may not hold there, so the node drops
        every shard when this changes and acquires them again. Always 0 on SQLite."""
        ...

    async def watch_changes(self, on_change: Callable[[Change], None]) -> None:
        """Call ``on_change`` for each change committed by any node, until cancelled.

        PostgreSQL: LISTEN/NOTIFY, reconnecting when the connection drops (the node's periodic
        full scan covers what is missed meanwhile). SQLite has a single node: nothing to watch.
        """
        ...
