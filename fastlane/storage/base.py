"""The storage contract every backend fulfils with identical behaviour.

Methods speak the domain (materialise runs, acquire shards, record results), never raw SQL.
Writes made on behalf of a shard take the caller's :class:`~fastlane.models.ShardLease` as a
*fence*: they happen only if, inside the same transaction and judged by the database clock, the
lease is still the caller's with the same token. Otherwise they write nothing and raise
:class:`~fastlane.errors.StaleFence`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, Protocol, TypeVar

from fastlane.errors import ConfigurationError
from fastlane.models import (
    Attempt,
    AttemptOutcome,
    DueJob,
    Job,
    JobSpec,
    JobState,
    NodeInfo,
    Run,
    RunState,
    ShardLease,
)
from fastlane.storage import codec

DEFAULT_SHARD_COUNT = 64
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatch:
    """A run handed to a worker: becomes a new attempt holding a lease."""

    run_id: str
    lease_token: int
    worker_id: str
    node_id: str
    lease_ttl: timedelta
    dispatched_at: datetime  # when the node sent it; the journal may write it a little later


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """A worker's sign of life for one attempt; may carry progress and a checkpoint.

    It extends the attempt's lease by the run's own lease TTL, from the database's now."""

    run_id: str
    lease_token: int
    progress: float | None = None
    checkpoint: bytes | None = None
    started: bool = False


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


class ResultOutcome:
    """What recording a result did to a run: ``accepted`` is False for a superseded attempt.

    ``released`` marks a run of the same job that left the overlap buffer because this one
    finished: it is now ``scheduled`` and due at once.

    A store may hand over the run's row rather than the run: the node needs only ``state`` for
    most results (a success), and building thousands of full runs a second for nothing shows in
    its CPU profile. ``run`` is then built when first asked for.
    """

    __slots__ = ("accepted", "released", "_run", "_row")

    def __init__(
        self, *, accepted: bool, released: bool = False, run: Run | None = None, row: Mapping[str, Any] | None = None
    ) -> None:
        if (run is None) == (row is None):
            raise ValueError("a result outcome needs the run or its row")
        self.accepted = accepted
        self.released = released
        self._run = run
        self._row = row

    @property
    def run(self) -> Run:
        if self._run is None:
            self._run = codec.build_run(self._held_row())
        return self._run

    @property
    def state(self) -> RunState:
        return self._run.state if self._run is not None else codec.run_state(self._held_row())

    def _held_row(self) -> Mapping[str, Any]:
        assert self._row is not None  # the constructor took one of the two
        return self._row

    def __repr__(self) -> str:
        return f"ResultOutcome(run={self.run!r}, accepted={self.accepted}, released={self.released})"


@dataclass(frozen=True, slots=True, kw_only=True)
class Materialised:
    """What a materialisation wrote.

    ``runs``: the new runs in state ``scheduled``, to release at their time. ``cancelling``:
    earlier runs an overlap policy cancelled — queued ones now ``cancelled`` (drop them from
    memory), delivered ones ``cancel_requested`` (tell their workers to stop).
    """

    runs: list[Run]
    advanced: frozenset[str] = frozenset()  # jobs whose next_fire_at this write moved on
    cancelling: list[Run] = field(default_factory=list)
    # Jobs of the batch that were not advanced because they changed meanwhile (elsewhere), as
    # they are now: the caller replaces its stale copy with these.
    changed: list[Job] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancellation:
    """What cancelling a run did: ``run`` as it is now, ``released`` runs to schedule at once."""

    run: Run
    released: list[Run] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Change:
    """A change another node may need to act on at once (PostgreSQL NOTIFY).

    ``kind``: ``job`` (created, changed, paused, resumed), ``job_deleted``, ``run`` (triggered,
    replayed or cancelled) or ``members`` (a node left or joined).
    """

    kind: str
    shard_id: int = -1
    tenant: str = ""
    key: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Page(Generic[T]):
    items: list[T]
    next_page_token: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFilter:
    job_id: str | None = None
    states: frozenset[RunState] = field(default_factory=frozenset)


class Store(Protocol):
    """Durable state of a fastlane cluster. All datetimes are aware UTC."""

    url: str

    # -- lifecycle ------------------------------------------------------------------------------

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

    # -- jobs -----------------------------------------------------------------------------------

    async def create_job(self, spec: JobSpec, *, job_id: str | None = None) -> tuple[Job, bool]:
        """Create a job, idempotent on ``(tenant, name)``.

        Returns ``(job, True)`` when created, ``(existing, False)`` when a job of that name exists
        with the same spec, and raises :class:`~fastlane.errors.JobAlreadyExists` when it exists
        with a different one.
        """
        ...

    async def get_job(self, tenant: str, job_id: str) -> Job: ...

    async def list_jobs(
        self,
        tenant: str,
        *,
        state: JobState | None = None,
        job_type: str | None = None,
        limit: int = 100,
        page_token: str = "",
    ) -> Page[Job]: ...

    async def update_job(self, tenant: str, job_id: str, spec: JobSpec) -> Job:
        """Replace a job's spec (name and tenant fixed); a new schedule recomputes ``next_fire_at``."""
        ...

    async def pause_job(self, tenant: str, job_id: str) -> Job: ...

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

    # -- the fast lane (shard-scoped) ----------------------------------------------------------

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

    # -- runs -----------------------------------------------------------------------------------

    async def create_manual_run(self, tenant: str, job_id: str) -> Run:
        """A run of the job due now, outside its schedule (trigger)."""
        ...

    async def cancel_run(self, tenant: str, run_id: str) -> Cancellation:
        """Cancel a run: one not yet delivered ends ``cancelled`` at once; one with a worker is
        marked ``cancel_requested`` (its worker is told to stop, and it will not be retried).
        Raises :class:`~fastlane.errors.InvalidState` for a run already finished."""
        ...

    async def retry_run(self, tenant: str, run_id: str) -> Run:
        """Replay a ``dead`` or ``lost`` run as a new attempt now, with the same idempotency key."""
        ...

    async def record_dispatches(self, dispatches: Sequence[Dispatch]) -> list[Attempt]:
        """Start an attempt for each run still ``scheduled``; others are ignored (and not returned)."""
        ...

    async def record_heartbeats(self, heartbeats: Sequence[Heartbeat]) -> list[str]:
        """Extend leases; return the run ids whose attempt is no longer current (worker should stop)."""
        ...

    async def record_results(self, results: Sequence[AttemptResult]) -> list[ResultOutcome]: ...

    async def get_run(self, tenant: str, run_id: str) -> Run: ...

    async def list_runs(
        self,
        tenant: str,
        *,
        job_id: str | None = None,
        states: Collection[RunState] = (),
        limit: int = 100,
        page_token: str = "",
    ) -> Page[Run]:
        """Runs newest first (by scheduled time)."""
        ...

    async def list_attempts(self, run_id: str) -> list[Attempt]: ...

    # -- shards ---------------------------------------------------------------------------------

    async def acquire_shards(
        self, owner: str, ttl: timedelta, *, limit: int, shard_ids: Collection[int] | None = None
    ) -> list[ShardLease]:
        """Take up to ``limit`` shards that are free or whose lease expired; each token is incremented."""
        ...

    async def renew_shards(self, leases: Sequence[ShardLease], ttl: timedelta) -> list[ShardLease]:
        """Extend leases still held (same owner and token, not expired); the rest are lost."""
        ...

    async def release_shards(self, leases: Sequence[ShardLease]) -> None:
        """Give shards up at once so another node can take them without waiting for expiry."""
        ...

    async def list_shards(self) -> list[ShardLease]:
        """Every shard with its owner ('' when free), token and lease expiry."""
        ...

    # -- membership -----------------------------------------------------------------------------

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

    async def watch_changes(self, on_change: Callable[[Change], None]) -> None:
        """Call ``on_change`` for each change committed by any node, until cancelled.

        PostgreSQL: LISTEN/NOTIFY, reconnecting when the connection drops (the node's periodic
        full scan covers what is missed meanwhile). SQLite has a single node: nothing to watch.
        """
        ...


def open_store(url: str, *, shard_count: int = DEFAULT_SHARD_COUNT) -> Store:
    """Make a store for ``sqlite:///path`` or ``postgresql://...``; call ``migrate()`` before use."""
    if url.startswith("sqlite://"):
        from fastlane.storage.sqlite import SQLiteStore

        return SQLiteStore(url, shard_count=shard_count)
    if url.startswith(("postgresql://", "postgres://")):
        from fastlane.storage.postgres import PostgresStore

        return PostgresStore(url, shard_count=shard_count)
    raise ConfigurationError(
        f"unsupported database URL {url!r}: use sqlite:///path/to/file.db or postgresql://user@host/db"
    )
