"""The PostgreSQL store (asyncpg): production and multi-node.

Batches are set-based: one statement over ``unnest`` arrays per batch, never a statement per row.
Leases are judged by ``clock_timestamp()`` (the database clock at the moment of the statement,
not the start of the transaction).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Collection, Container, Sequence
from datetime import datetime, timedelta

import asyncpg

from fastlane.clock import from_micros, to_micros
from fastlane.domain.models import (
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
    new_id,
    shard_of,
)
from fastlane.domain.records import AttemptResult, Change, ChangeKind, Dispatch, Heartbeat, Occurrence, Page
from fastlane.domain.schedules import first_fire
from fastlane.domain.transitions import CANCELLED_BY_REQUEST, OVERLAP_CANCELLED
from fastlane.domain.validation import validate_spec
from fastlane.errors import (
    ConfigurationError,
    InvalidState,
    JobNotFound,
    RunNotFound,
    StaleFence,
    StorageUnavailable,
)
from fastlane.storage import codec, common
from fastlane.storage.driver_errors import POSTGRES_DRIVER_ERRORS, classify_postgres
from fastlane.storage.migrations import migrations_for
from fastlane.storage.results import Cancellation, Materialised, ResultOutcome
from fastlane.supervise import Backoff

log = logging.getLogger("fastlane.storage.postgres")

_MIGRATION_LOCK = 7_236_001  # pg_advisory_xact_lock key: one migrator at a time across nodes

# Locks the fenced shard rows FOR KEY SHARE: a takeover (which locks the row FOR UPDATE) waits
# for this transaction, so the fence holds until commit; the owner's own lease renewal (a plain
# UPDATE, a weaker lock) does not, so renewals never queue behind data transactions.
_FENCE = """
    SELECT s.shard_id FROM shards s
    JOIN unnest($1::int[], $2::text[], $3::bigint[]) AS f(shard_id, owner, token)
      ON s.shard_id = f.shard_id AND s.owner = f.owner AND s.token = f.token
    WHERE s.lease_expires_at > clock_timestamp()
    FOR KEY SHARE OF s
"""

_LOAD_DUE_JOBS = f"""
    SELECT job_id, shard_id, next_fire_at,
           {codec.DUE_JOB_SCHEDULE.format(kind="policies->'schedule'->>'kind'", schedule="policies->'schedule'")},
           policies->'misfire'
    FROM jobs
    WHERE state = 'active' AND shard_id = ANY($1::int[]) AND next_fire_at < $2
      AND ($3::timestamptz IS NULL OR next_fire_at >= $3)
      AND ($5::timestamptz IS NULL OR (next_fire_at, job_id) > ($5, $6))
    ORDER BY next_fire_at, job_id LIMIT $4
"""

_INSERT_RUNS = """
    INSERT INTO runs (run_id, job_id, tenant, job_type, shard_id, scheduled_for, available_at, state,
                      payload, priority, manual, delivery, lease_ttl_ms, timeout_ms, retry,
                      created_at, updated_at, finished_at, last_error)
    SELECT o.run_id, j.job_id, j.tenant, j.job_type, j.shard_id, o.scheduled_for, o.scheduled_for,
           o.state, j.payload, j.priority, false, j.policies->>'delivery',
           ((j.policies->>'lease_ttl')::float8 * 1000)::bigint,
           ((j.policies->>'timeout')::float8 * 1000)::bigint, j.policies->'retry',
           clock_timestamp(), clock_timestamp(),
           CASE WHEN o.state = 'skipped' THEN clock_timestamp() END, o.last_error
    FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[], $5::text[])
         AS o(run_id, job_id, scheduled_for, state, last_error)
    JOIN jobs j ON j.job_id = o.job_id
    ON CONFLICT (job_id, scheduled_for) WHERE NOT manual DO NOTHING
    RETURNING *
"""


# Successes of current attempts, set-wise: the runs end succeeded, then their attempts say so.
# A success whose attempt is no longer current matches nothing here and is decided in Python.
# (Two statements: joining the attempts to the first one's output inside one query lets the
# planner pick a nested loop over unindexed sets, quadratic in the batch.)
_SUCCEED_RUNS = """
    UPDATE runs r SET state = 'succeeded', finished_at = clock_timestamp(), last_error = NULL,
                      lease_token = NULL, lease_expires_at = NULL, updated_at = clock_timestamp()
    FROM unnest($1::text[], $2::bigint[]) AS u(run_id, lease_token)
    WHERE r.run_id = u.run_id AND r.lease_token = u.lease_token AND r.state IN ('dispatched', 'running')
    RETURNING r.*, u.lease_token AS attempt_token
"""
_SUCCEED_ATTEMPTS = """
    UPDATE attempts a SET outcome = 'succeeded', error_code = s.error_code, error_message = s.error_message,
                          started_at = coalesce(s.started_at, a.started_at),
                          finished_at = coalesce(s.finished_at, clock_timestamp())
    FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::timestamptz[], $6::timestamptz[])
         AS s(run_id, lease_token, error_code, error_message, started_at, finished_at)
    WHERE a.run_id = s.run_id AND a.lease_token = s.lease_token
"""

CHANGES_CHANNEL = "fastlane_changes"
LISTENER_PING = 10.0  # seconds between liveness checks of the LISTEN connection
LISTENER_BACKOFF = Backoff(first=0.1, cap=2.0)  # between attempts to LISTEN again


async def _notify(db: asyncpg.Connection, change: Change) -> None:
    """Tell every node of a change; PostgreSQL delivers it only if this transaction commits."""
    await db.execute("SELECT pg_notify($1, $2)", CHANGES_CHANNEL, common.encode_change(change))


class PostgresStore:
    """Store on PostgreSQL through an asyncpg pool."""

    dialect = "postgres"

    def __init__(self, url: str, *, shard_count: int, pool_size: int = 10, rng: random.Random | None = None) -> None:
        self.url = url
        self._requested_shards = shard_count
        self._pool_size = pool_size
        self._pool: asyncpg.Pool | None = None
        self._shard_count: int | None = None
        self._rng = rng or random.Random()

    # -- plumbing -------------------------------------------------------------------------------

    async def _open(self) -> asyncpg.Pool:
        if self._pool is None:
            try:
                self._pool = await asyncpg.create_pool(
                    self.url, min_size=1, max_size=self._pool_size, command_timeout=60
                )
            except POSTGRES_DRIVER_ERRORS as error:
                raise classify_postgres(error, doing="connecting") from error
        return self._pool

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection; every driver error, from acquiring to releasing it, leaves as a
        StorageError (StorageUnavailable when retrying may work)."""
        pool = await self._open()
        try:
            async with pool.acquire() as connection:
                try:
                    yield connection
                except POSTGRES_DRIVER_ERRORS as error:
                    # Whatever asyncpg raised (a transaction exit even raises InterfaceError), a
                    # connection found closed means the database went away.
                    raise classify_postgres(error, connection_closed=connection.is_closed()) from error
        except POSTGRES_DRIVER_ERRORS as error:
            raise classify_postgres(error, doing="acquiring a connection") from error

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[asyncpg.Connection]:
        async with self._connection() as connection, connection.transaction():
            yield connection

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def migrate(self) -> int:
        async with self._transaction() as db:
            await db.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
            exists = await db.fetchval("SELECT to_regclass('fastlane_meta') IS NOT NULL")
            current = 0
            if exists:
                current = int(await db.fetchval("SELECT value FROM fastlane_meta WHERE key = 'schema_version'"))
            migrations = migrations_for(self.dialect)
            for migration in migrations:
                if migration.version > current:
                    await db.execute(migration.sql)
                    await db.execute(
                        "INSERT INTO fastlane_meta VALUES ('schema_version', $1) "
                        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        str(migration.version),
                    )
            await db.execute(
                "INSERT INTO fastlane_meta VALUES ('shard_count', $1) ON CONFLICT (key) DO NOTHING",
                str(self._requested_shards),
            )
            count = int(await db.fetchval("SELECT value FROM fastlane_meta WHERE key = 'shard_count'"))
            await db.execute(
                "INSERT INTO shards (shard_id) SELECT generate_series(0, $1 - 1) ON CONFLICT DO NOTHING", count
            )
            self._shard_count = count
            return migrations[-1].version if migrations else 0

    async def shard_count(self) -> int:
        if self._shard_count is None:
            async with self._connection() as db:
                value = await db.fetchval("SELECT value FROM fastlane_meta WHERE key = 'shard_count'")
            if value is None:
                raise ConfigurationError("the database is not migrated: run `fastlane migrate --db URL`")
            self._shard_count = int(value)
        return self._shard_count

    async def db_now(self) -> datetime:
        async with self._connection() as db:
            return await db.fetchval("SELECT clock_timestamp()")

    # -- jobs -----------------------------------------------------------------------------------

    async def create_job(self, spec: JobSpec, *, job_id: str | None = None) -> tuple[Job, bool]:
        validate_spec(spec)
        job_id = job_id or new_id()
        shard_id = shard_of(job_id, await self.shard_count())
        async with self._transaction() as db:
            now = await db.fetchval("SELECT clock_timestamp()")
            stored = common.anchor_interval(spec, now)
            row = await db.fetchrow(
                """
                INSERT INTO jobs (job_id, tenant, name, job_type, shard_id, state, next_fire_at, priority,
                                  payload, policies, created_at, updated_at)
                VALUES ($1, $2, $3, $4, $5, 'active', $6, $7, $8, $9::jsonb, $10, $10)
                ON CONFLICT (tenant, name) DO NOTHING
                RETURNING *
                """,
                job_id, spec.tenant, spec.name, spec.job_type, shard_id, first_fire(stored.schedule, now),
                spec.priority, spec.payload, codec.encode_policies(stored).decode(), now,
            )
            if row is not None:
                job = codec.build_job(row)
                await _notify(db, Change(ChangeKind.JOB, job.shard_id, job.tenant, job.job_id))
                return job, True
            existing = codec.build_job(
                await db.fetchrow("SELECT * FROM jobs WHERE tenant = $1 AND name = $2", spec.tenant, spec.name)
            )
        return common.idempotent_create(existing, spec), False

    async def get_job(self, tenant: str, job_id: str) -> Job:
        async with self._connection() as db:
            row = await db.fetchrow("SELECT * FROM jobs WHERE job_id = $1 AND tenant = $2", job_id, tenant)
        if row is None:
            raise JobNotFound(job_id)
        return codec.build_job(row)

    async def list_jobs(
        self,
        tenant: str,
        *,
        state: JobState | None = None,
        job_type: str | None = None,
        limit: int = 100,
        page_token: str = "",
    ) -> Page[Job]:
        after = codec.decode_page_token(page_token, str)[0] if page_token else ""
        async with self._connection() as db:
            rows = await db.fetch(
                """
                SELECT * FROM jobs
                WHERE tenant = $1 AND job_id > $2
                  AND ($3::text IS NULL OR state = $3) AND ($4::text IS NULL OR job_type = $4)
                ORDER BY job_id LIMIT $5
                """,
                tenant, after, state.value if state else None, job_type, common.page_limit(limit) + 1,
            )
        jobs = [codec.build_job(row) for row in rows]
        return common.page_of(jobs, limit, lambda job: (job.job_id,))

    async def update_job(self, tenant: str, job_id: str, spec: JobSpec) -> Job:
        validate_spec(spec)
        async with self._transaction() as db:
            row = await db.fetchrow("SELECT * FROM jobs WHERE job_id = $1 AND tenant = $2 FOR UPDATE", job_id, tenant)
            if row is None:
                raise JobNotFound(job_id)
            current = codec.build_job(row)
            common.check_update(current, spec)
            now = await db.fetchval("SELECT clock_timestamp()")
            spec = common.anchor_interval(spec, now)
            next_fire_at, state = common.rescheduled(current, spec, now)
            row = await db.fetchrow(
                """
                UPDATE jobs SET job_type = $3, priority = $4, payload = $5, policies = $6::jsonb,
                                next_fire_at = $7, state = $8, version = version + 1, updated_at = $9
                WHERE job_id = $1 AND tenant = $2
                RETURNING *
                """,
                job_id, tenant, spec.job_type, spec.priority, spec.payload,
                codec.encode_policies(spec).decode(), next_fire_at, state.value, now,
            )
            job = codec.build_job(row)
            await _notify(db, Change(ChangeKind.JOB, job.shard_id, job.tenant, job.job_id))
        return job

    async def pause_job(self, tenant: str, job_id: str) -> Job:
        return await self._change_state(tenant, job_id, (JobState.ACTIVE,), JobState.PAUSED, "pause")

    async def resume_job(self, tenant: str, job_id: str) -> Job:
        return await self._change_state(tenant, job_id, (JobState.PAUSED, JobState.ERRORED), JobState.ACTIVE, "resume")

    async def set_job_aside(self, job_id: str, reason: str) -> None:
        async with self._transaction() as db:
            row = await db.fetchrow(
                "UPDATE jobs SET state = $2, error = $3, version = version + 1, updated_at = clock_timestamp() "
                "WHERE job_id = $1 RETURNING *",
                job_id, JobState.ERRORED.value, reason,
            )
            if row is not None:
                await _notify(db, Change(ChangeKind.JOB, row["shard_id"], row["tenant"], job_id))

    async def count_jobs(self, state: JobState) -> int:
        async with self._connection() as db:
            return int(await db.fetchval("SELECT count(*) FROM jobs WHERE state = $1", state.value))

    async def _change_state(
        self, tenant: str, job_id: str, sources: tuple[JobState, ...], target: JobState, verb: str
    ) -> Job:
        async with self._transaction() as db:
            row = await db.fetchrow("SELECT * FROM jobs WHERE job_id = $1 AND tenant = $2 FOR UPDATE", job_id, tenant)
            if row is None:
                raise JobNotFound(job_id)
            if row["state"] == target.value:
                return codec.build_job(row)
            if row["state"] not in sources:
                raise InvalidState("job", job_id, row["state"], verb)
            row = await db.fetchrow(
                "UPDATE jobs SET state = $2, error = NULL, version = version + 1, updated_at = clock_timestamp() "
                "WHERE job_id = $1 RETURNING *",
                job_id, target.value,
            )
            job = codec.build_job(row)
            await _notify(db, Change(ChangeKind.JOB, job.shard_id, job.tenant, job.job_id))
        return job

    async def delete_job(self, tenant: str, job_id: str) -> None:
        async with self._transaction() as db:
            shard_id = await db.fetchval(
                "DELETE FROM jobs WHERE job_id = $1 AND tenant = $2 RETURNING shard_id", job_id, tenant
            )
            if shard_id is None:
                raise JobNotFound(job_id)
            await _notify(db, Change(ChangeKind.JOB_DELETED, shard_id, tenant, job_id))
            await db.execute(
                "UPDATE runs SET state = 'cancelled', finished_at = clock_timestamp(), updated_at = clock_timestamp(), "
                "last_error = 'job deleted' WHERE job_id = $1 AND state IN ('scheduled', 'buffered')",
                job_id,
            )

    # -- the fast lane --------------------------------------------------------------------------

    async def load_due_jobs(
        self,
        shard_ids: Collection[int],
        before: datetime,
        *,
        at_or_after: datetime | None = None,
        after_job: tuple[datetime, str] | None = None,
        limit: int = 100_000,
    ) -> list[DueJob]:
        after_time, after_id = after_job or (None, "")
        async with self._connection() as db:
            rows = await db.fetch(
                _LOAD_DUE_JOBS, list(shard_ids), before, at_or_after, limit, after_time, after_id
            )
        return [codec.build_due_job(*row) for row in rows]

    async def materialise_runs(self, fences: Sequence[ShardLease], occurrences: Sequence[Occurrence]) -> Materialised:
        async with self._transaction() as db:
            await self._check_fences(db, fences)
            advanced = await db.fetch(
                """
                UPDATE jobs j
                SET next_fire_at = o.next_fire_at, updated_at = clock_timestamp(),
                    state = CASE WHEN o.next_fire_at IS NULL THEN 'completed' ELSE j.state END
                FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[]) AS o(job_id, expected, next_fire_at)
                WHERE j.job_id = o.job_id AND j.next_fire_at = o.expected
                  AND j.state = 'active' AND j.shard_id = ANY($4::int[])
                RETURNING j.job_id, j.policies->>'overlap' AS overlap
                """,
                [o.job_id for o in occurrences],
                [o.expected_next_fire_at for o in occurrences],
                [o.next_fire_at for o in occurrences],
                [fence.shard_id for fence in fences],
            )
            overlap_of = {row["job_id"]: row["overlap"] for row in advanced}
            changed = [
                codec.build_job(row)
                for row in await db.fetch(
                    "SELECT * FROM jobs WHERE job_id = ANY($1::text[])",
                    [o.job_id for o in occurrences if o.job_id not in overlap_of],
                )
            ] if len(overlap_of) < len(occurrences) else []
            guarded = [job_id for job_id, policy in overlap_of.items() if policy != "allow"]
            active = []
            if guarded:
                active = await db.fetch(
                    "SELECT job_id, run_id, state FROM runs WHERE job_id = ANY($1::text[]) AND state = ANY($2::text[]) "
                    "FOR UPDATE",
                    guarded, list(common.ACTIVE_STATES),
                )
            plan = common.plan_materialisation(
                occurrences, overlap_of, [(r["job_id"], r["run_id"], r["state"]) for r in active]
            )
            cancelling = await self._cancel_for_overlap(db, plan)
            if not plan.rows:
                return Materialised(runs=[], advanced=frozenset(overlap_of), cancelling=cancelling, changed=changed)
            rows = await db.fetch(
                _INSERT_RUNS,
                [r.run_id for r in plan.rows], [r.job_id for r in plan.rows], [r.scheduled_for for r in plan.rows],
                [r.state for r in plan.rows], [r.last_error for r in plan.rows],
            )
        runs = [codec.build_run(row) for row in rows]
        scheduled = sorted((run for run in runs if run.state is RunState.SCHEDULED), key=lambda run: run.scheduled_for)
        return Materialised(runs=scheduled, advanced=frozenset(overlap_of), cancelling=cancelling, changed=changed)

    async def _cancel_for_overlap(self, db: asyncpg.Connection, plan: common.MaterialisationPlan) -> list[Run]:
        rows = []
        if plan.cancel_now:
            rows += await db.fetch(
                "UPDATE runs SET state = 'cancelled', finished_at = clock_timestamp(), updated_at = clock_timestamp(), "
                "last_error = $2 WHERE run_id = ANY($1::text[]) RETURNING *",
                plan.cancel_now, OVERLAP_CANCELLED,
            )
        if plan.cancel_requested:
            rows += await db.fetch(
                "UPDATE runs SET cancel_requested = true, last_error = $2, updated_at = clock_timestamp() "
                "WHERE run_id = ANY($1::text[]) RETURNING *",
                plan.cancel_requested, OVERLAP_CANCELLED,
            )
        return [codec.build_run(row) for row in rows]

    async def pending_runs(
        self, shard_ids: Collection[int], before: datetime, *, skip: Container[str] = frozenset()
    ) -> list[Run]:
        async with self._connection() as db:
            ids = await db.fetch(
                "SELECT run_id FROM runs WHERE state = 'scheduled' AND shard_id = ANY($1::int[]) "
                "AND available_at < $2 ORDER BY available_at",
                list(shard_ids), before,
            )
            wanted = [run_id for (run_id,) in ids if run_id not in skip]
            runs: list[Run] = []
            for chunk in common.chunks(wanted, common.PENDING_CHUNK):
                # Built chunk by chunk: the next query lets the event loop run between them.
                runs += map(codec.build_run, await db.fetch(
                    "SELECT * FROM runs WHERE run_id = ANY($1::text[]) AND state = 'scheduled'", chunk
                ))
        return sorted(runs, key=lambda run: run.available_at)

    async def requeue_expired(self, fence: ShardLease) -> list[Run]:
        async with self._transaction() as db:
            await self._check_fence(db, fence)
            rows = await db.fetch(
                "SELECT * FROM runs WHERE shard_id = $1 AND state IN ('dispatched', 'running') "
                "AND lease_expires_at < clock_timestamp() ORDER BY lease_expires_at FOR UPDATE SKIP LOCKED",
                fence.shard_id,
            )
            if not rows:
                return []
            now = await db.fetchval("SELECT clock_timestamp()")
            expired = [codec.build_run(row) for row in rows]
            results = [
                AttemptResult(run_id=run.run_id, lease_token=run.lease_token or 0, outcome=AttemptOutcome.LEASE_EXPIRED,
                              error_code="lease_expired", error_message=f"worker {run.worker_id} stopped heartbeating",
                              finished_at=now)
                for run in expired
            ]
            outcomes = await self._apply_results(db, {run.run_id: run for run in expired}, results, now)
        return [outcome.run for outcome in outcomes if outcome.run.state is RunState.SCHEDULED]

    async def shards_with_expired_leases(self, shard_ids: Collection[int]) -> list[int]:
        async with self._connection() as db:
            rows = await db.fetch(
                "SELECT DISTINCT shard_id FROM runs WHERE state IN ('dispatched', 'running') "
                "AND shard_id = ANY($1::int[]) AND lease_expires_at < clock_timestamp()",
                list(shard_ids),
            )
        return sorted(row["shard_id"] for row in rows)

    async def _check_fence(self, db: asyncpg.Connection, fence: ShardLease) -> None:
        await self._check_fences(db, [fence])

    async def _check_fences(self, db: asyncpg.Connection, fences: Sequence[ShardLease]) -> None:
        held = {
            row["shard_id"]
            for row in await db.fetch(
                _FENCE, [f.shard_id for f in fences], [f.owner for f in fences], [f.token for f in fences]
            )
        }
        for fence in fences:
            if fence.shard_id not in held:
                raise StaleFence(fence.shard_id, fence.owner, fence.token)

    # -- runs -----------------------------------------------------------------------------------

    async def create_manual_run(self, tenant: str, job_id: str) -> Run:
        async with self._transaction() as db:
            job_row = await db.fetchrow("SELECT job_id FROM jobs WHERE job_id = $1 AND tenant = $2", job_id, tenant)
            if job_row is None:
                raise JobNotFound(job_id)
            row = await db.fetchrow(
                """
                INSERT INTO runs (run_id, job_id, tenant, job_type, shard_id, scheduled_for, available_at, state,
                                  payload, priority, manual, delivery, lease_ttl_ms, timeout_ms, retry,
                                  created_at, updated_at)
                SELECT $1, j.job_id, j.tenant, j.job_type, j.shard_id, clock_timestamp(), clock_timestamp(),
                       'scheduled', j.payload, j.priority, true, j.policies->>'delivery',
                       ((j.policies->>'lease_ttl')::float8 * 1000)::bigint,
                       ((j.policies->>'timeout')::float8 * 1000)::bigint, j.policies->'retry',
                       clock_timestamp(), clock_timestamp()
                FROM jobs j WHERE j.job_id = $2
                RETURNING *
                """,
                new_id(), job_id,
            )
            run = codec.build_run(row)
            await _notify(db, Change(ChangeKind.RUN, run.shard_id, run.tenant, run.run_id))
        return run

    async def cancel_run(self, tenant: str, run_id: str) -> Cancellation:
        async with self._transaction() as db:
            row = await db.fetchrow("SELECT * FROM runs WHERE run_id = $1 AND tenant = $2 FOR UPDATE", run_id, tenant)
            if row is None:
                raise RunNotFound(run_id)
            run = codec.build_run(row)
            if run.state in (RunState.DISPATCHED, RunState.RUNNING):
                row = await db.fetchrow(
                    "UPDATE runs SET cancel_requested = true, updated_at = clock_timestamp() WHERE run_id = $1 "
                    "RETURNING *",
                    run_id,
                )
                await _notify(db, Change(ChangeKind.RUN, run.shard_id, tenant, run_id))
                return Cancellation(run=codec.build_run(row))
            if run.state not in (RunState.SCHEDULED, RunState.BUFFERED):
                raise InvalidState("run", run_id, run.state.value, "cancel")
            row = await db.fetchrow(
                "UPDATE runs SET state = 'cancelled', finished_at = clock_timestamp(), updated_at = clock_timestamp(), "
                "last_error = $2 WHERE run_id = $1 RETURNING *",
                run_id, CANCELLED_BY_REQUEST,
            )
            released = await self._release_buffered(db, [run.job_id])
            await _notify(db, Change(ChangeKind.RUN, run.shard_id, tenant, run_id))
            for other in released:
                await _notify(db, Change(ChangeKind.RUN, other.shard_id, other.tenant, other.run_id))
        return Cancellation(run=codec.build_run(row), released=released)

    async def retry_run(self, tenant: str, run_id: str) -> Run:
        async with self._transaction() as db:
            row = await db.fetchrow("SELECT state FROM runs WHERE run_id = $1 AND tenant = $2 FOR UPDATE", run_id, tenant)
            if row is None:
                raise RunNotFound(run_id)
            if row["state"] not in ("dead", "lost"):
                raise InvalidState("run", run_id, row["state"], "retry (only dead or lost runs can be replayed)")
            row = await db.fetchrow(
                "UPDATE runs SET state = 'scheduled', available_at = clock_timestamp(), finished_at = NULL, "
                "cancel_requested = false, updated_at = clock_timestamp() WHERE run_id = $1 RETURNING *",
                run_id,
            )
            run = codec.build_run(row)
            await _notify(db, Change(ChangeKind.RUN, run.shard_id, run.tenant, run.run_id))
        return run

    async def record_dispatches(self, dispatches: Sequence[Dispatch]) -> list[Attempt]:
        if not dispatches:
            return []
        async with self._transaction() as db:
            rows = await db.fetch(
                """
                WITH started AS (
                    UPDATE runs r
                    SET state = 'dispatched', attempts = r.attempts + 1, lease_token = d.lease_token,
                        lease_expires_at = clock_timestamp() + d.ttl_us * interval '1 microsecond',
                        worker_id = d.worker_id, updated_at = clock_timestamp(),
                        first_attempt_at = coalesce(r.first_attempt_at, d.dispatched_at)
                    FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bigint[], $6::timestamptz[])
                         AS d(run_id, lease_token, worker_id, node_id, ttl_us, dispatched_at)
                    WHERE r.run_id = d.run_id AND r.state = 'scheduled'
                    RETURNING r.run_id, r.attempts, d.lease_token, d.worker_id, d.node_id, d.dispatched_at
                )
                INSERT INTO attempts (run_id, attempt, lease_token, worker_id, node_id, outcome, dispatched_at)
                SELECT run_id, attempts, lease_token, worker_id, node_id, 'pending', dispatched_at FROM started
                RETURNING *
                """,
                [d.run_id for d in dispatches],
                [d.lease_token for d in dispatches],
                [d.worker_id for d in dispatches],
                [d.node_id for d in dispatches],
                [common.micros_of_delta(d.lease_ttl) for d in dispatches],
                [d.dispatched_at for d in dispatches],
            )
        return [codec.build_attempt(row) for row in rows]

    async def record_heartbeats(self, heartbeats: Sequence[Heartbeat]) -> list[str]:
        if not heartbeats:
            return []
        async with self._transaction() as db:
            rows = await db.fetch(
                """
                UPDATE runs r
                SET lease_expires_at = clock_timestamp() + r.lease_ttl_ms * interval '1 millisecond',
                    progress = coalesce(h.progress, r.progress),
                    checkpoint = coalesce(h.checkpoint, r.checkpoint),
                    state = CASE WHEN h.started THEN 'running' ELSE r.state END,
                    updated_at = clock_timestamp()
                FROM unnest($1::text[], $2::bigint[], $3::real[], $4::bytea[], $5::bool[])
                     AS h(run_id, lease_token, progress, checkpoint, started)
                WHERE r.run_id = h.run_id AND r.lease_token = h.lease_token AND r.state IN ('dispatched', 'running')
                RETURNING r.run_id, h.started, r.lease_token
                """,
                [h.run_id for h in heartbeats],
                [h.lease_token for h in heartbeats],
                [h.progress for h in heartbeats],
                [h.checkpoint for h in heartbeats],
                [h.started for h in heartbeats],
            )
            started = [(row["run_id"], row["lease_token"]) for row in rows if row["started"]]
            if started:
                await db.execute(
                    "UPDATE attempts a SET started_at = coalesce(a.started_at, clock_timestamp()) "
                    "FROM unnest($1::text[], $2::bigint[]) AS s(run_id, lease_token) "
                    "WHERE a.run_id = s.run_id AND a.lease_token = s.lease_token",
                    [run_id for run_id, _ in started], [token for _, token in started],
                )
        current = {row["run_id"] for row in rows}
        return [h.run_id for h in heartbeats if h.run_id not in current]

    async def record_results(self, results: Sequence[AttemptResult]) -> list[ResultOutcome]:
        if not results:
            return []
        successes, others = common.successes_first(results)
        async with self._transaction() as db:
            succeeded = await db.fetch(
                _SUCCEED_RUNS, [r.run_id for r in successes], [r.lease_token for r in successes]
            ) if successes else []
            applied = {(row["run_id"], row["attempt_token"]) for row in succeeded}
            done = [r for r in successes if (r.run_id, r.lease_token) in applied]
            if done:
                await db.execute(
                    _SUCCEED_ATTEMPTS,
                    [r.run_id for r in done], [r.lease_token for r in done], [r.error_code for r in done],
                    [r.error_message for r in done], [r.started_at for r in done], [r.finished_at for r in done],
                )
            rest = [r for r in successes if (r.run_id, r.lease_token) not in applied] + others
            outcomes = [ResultOutcome(row=row, accepted=True) for row in succeeded]
            released = await self._release_buffered(db, {row["job_id"] for row in succeeded})
            for run in released:
                await _notify(db, Change(ChangeKind.RUN, run.shard_id, run.tenant, run.run_id))
            outcomes += [ResultOutcome(run=run, accepted=True, released=True) for run in released]
            if rest:
                rows = await db.fetch(
                    "SELECT * FROM runs WHERE run_id = ANY($1::text[]) ORDER BY run_id FOR UPDATE",
                    list({r.run_id for r in rest}),
                )
                now = await db.fetchval("SELECT clock_timestamp()")
                outcomes += await self._apply_results(
                    db, {row["run_id"]: codec.build_run(row) for row in rows}, rest, now)
            return outcomes

    async def _apply_results(
        self, db: asyncpg.Connection, runs: dict[str, Run], results: Sequence[AttemptResult], now: datetime
    ) -> list[ResultOutcome]:
        decided = common.decide_results(runs, results, now, self._rng)
        if decided.runs:
            await db.execute(
                """
                UPDATE runs r SET state = u.state, available_at = u.available_at, finished_at = u.finished_at,
                                  last_error = u.last_error, lease_token = NULL, lease_expires_at = NULL,
                                  updated_at = clock_timestamp()
                FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::text[])
                     AS u(run_id, state, available_at, finished_at, last_error)
                WHERE r.run_id = u.run_id
                """,
                [run.run_id for run in decided.runs], [run.state.value for run in decided.runs],
                [run.available_at for run in decided.runs], [run.finished_at for run in decided.runs],
                [run.last_error for run in decided.runs],
            )
        if decided.attempts:
            updates = decided.attempts
            await db.execute(
                """
                UPDATE attempts a SET outcome = u.outcome, error_code = u.error_code, error_message = u.error_message,
                                      started_at = coalesce(u.started_at, a.started_at), finished_at = u.finished_at
                FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::timestamptz[],
                            $7::timestamptz[])
                     AS u(run_id, lease_token, outcome, error_code, error_message, started_at, finished_at)
                WHERE a.run_id = u.run_id AND a.lease_token = u.lease_token
                  AND (a.outcome IN ('pending', 'lease_expired') OR u.outcome <> 'superseded')
                """,
                [u.result.run_id for u in updates], [u.result.lease_token for u in updates],
                [u.outcome.value for u in updates], [u.result.error_code for u in updates],
                [u.result.error_message for u in updates], [u.result.started_at for u in updates],
                [u.finished_at for u in updates],
            )
        released = await self._release_buffered(db, decided.finished_jobs)
        # A worker may report to any node: the owner of each run's shard must hear of a retry or
        # a run released from the overlap buffer at once, not at its next full scan.
        for run in [*released, *(run for run in decided.runs if run.state is RunState.SCHEDULED)]:
            await _notify(db, Change(ChangeKind.RUN, run.shard_id, run.tenant, run.run_id))
        return decided.outcomes + [ResultOutcome(run=run, accepted=True, released=True) for run in released]

    async def _release_buffered(self, db: asyncpg.Connection, job_ids: Collection[str]) -> list[Run]:
        """Schedule the oldest buffered run of each job that has no other active run left."""
        if not job_ids:
            return []
        rows = await db.fetch(
            """
            UPDATE runs SET state = 'scheduled', available_at = clock_timestamp(), updated_at = clock_timestamp()
            WHERE state = 'buffered' AND job_id = ANY($1::text[])
              AND scheduled_for = (SELECT min(b.scheduled_for) FROM runs b
                                   WHERE b.job_id = runs.job_id AND b.state = 'buffered')
              AND NOT EXISTS (SELECT 1 FROM runs a WHERE a.job_id = runs.job_id
                              AND a.state IN ('scheduled', 'dispatched', 'running'))
            RETURNING *
            """,
            list(job_ids),
        )
        return [codec.build_run(row) for row in rows]

    async def get_run(self, tenant: str, run_id: str) -> Run:
        async with self._connection() as db:
            row = await db.fetchrow("SELECT * FROM runs WHERE run_id = $1 AND tenant = $2", run_id, tenant)
        if row is None:
            raise RunNotFound(run_id)
        return codec.build_run(row)

    async def list_runs(
        self,
        tenant: str,
        *,
        job_id: str | None = None,
        states: Collection[RunState] = (),
        limit: int = 100,
        page_token: str = "",
    ) -> Page[Run]:
        before_time, before_id = None, ""
        if page_token:
            micros, before_id = codec.decode_page_token(page_token, int, str)
            before_time = from_micros(micros)
        async with self._connection() as db:
            rows = await db.fetch(
                """
                SELECT * FROM runs
                WHERE tenant = $1 AND ($2::text IS NULL OR job_id = $2)
                  AND (cardinality($3::text[]) = 0 OR state = ANY($3::text[]))
                  AND ($4::timestamptz IS NULL OR (scheduled_for, run_id) < ($4, $5))
                ORDER BY scheduled_for DESC, run_id DESC LIMIT $6
                """,
                tenant, job_id, [s.value for s in states], before_time, before_id, common.page_limit(limit) + 1,
            )
        runs = [codec.build_run(row) for row in rows]
        return common.page_of(runs, limit, lambda run: (to_micros(run.scheduled_for), run.run_id))

    async def list_attempts(self, run_id: str) -> list[Attempt]:
        async with self._connection() as db:
            rows = await db.fetch("SELECT * FROM attempts WHERE run_id = $1 ORDER BY attempt", run_id)
        return [codec.build_attempt(row) for row in rows]

    # -- shards ---------------------------------------------------------------------------------

    async def acquire_shards(
        self, owner: str, ttl: timedelta, *, limit: int, shard_ids: Collection[int] | None = None
    ) -> list[ShardLease]:
        async with self._transaction() as db:
            rows = await db.fetch(
                """
                UPDATE shards SET owner = $1, token = token + 1,
                                  lease_expires_at = clock_timestamp() + $2 * interval '1 microsecond'
                WHERE shard_id IN (
                    SELECT shard_id FROM shards
                    WHERE (owner = '' OR lease_expires_at IS NULL OR lease_expires_at <= clock_timestamp())
                      AND ($4::int[] IS NULL OR shard_id = ANY($4::int[]))
                    ORDER BY shard_id LIMIT $3
                    FOR UPDATE SKIP LOCKED
                )
                RETURNING *
                """,
                owner, common.micros_of_delta(ttl), limit, None if shard_ids is None else list(shard_ids),
            )
        return sorted((codec.build_lease(row) for row in rows), key=lambda lease: lease.shard_id)

    async def renew_shards(self, leases: Sequence[ShardLease], ttl: timedelta) -> list[ShardLease]:
        if not leases:
            return []
        async with self._transaction() as db:
            rows = await db.fetch(
                """
                UPDATE shards s SET lease_expires_at = clock_timestamp() + $4 * interval '1 microsecond'
                FROM unnest($1::int[], $2::bigint[]) AS l(shard_id, token)
                WHERE s.shard_id = l.shard_id AND s.token = l.token AND s.owner = $3
                  AND s.lease_expires_at > clock_timestamp()
                RETURNING s.*
                """,
                [lease.shard_id for lease in leases], [lease.token for lease in leases], common.single_owner(leases),
                common.micros_of_delta(ttl),
            )
        return sorted((codec.build_lease(row) for row in rows), key=lambda lease: lease.shard_id)

    async def release_shards(self, leases: Sequence[ShardLease]) -> None:
        if not leases:
            return
        async with self._transaction() as db:
            await db.execute(
                """
                UPDATE shards s SET owner = '', lease_expires_at = NULL
                FROM unnest($1::int[], $2::bigint[]) AS l(shard_id, token)
                WHERE s.shard_id = l.shard_id AND s.token = l.token AND s.owner = $3
                """,
                [lease.shard_id for lease in leases], [lease.token for lease in leases], common.single_owner(leases),
            )

    async def list_shards(self) -> list[ShardLease]:
        async with self._connection() as db:
            rows = await db.fetch("SELECT * FROM shards ORDER BY shard_id")
        return [codec.build_lease(row) for row in rows]

    # -- membership -----------------------------------------------------------------------------

    async def heartbeat_node(self, node: NodeInfo, live_within: timedelta) -> list[NodeInfo]:
        async with self._transaction() as db:
            joined = await db.fetchval(
                """
                INSERT INTO nodes (node_id, address, started_at, heartbeat_at, clock_offset_ms, shards_owned,
                                   workers, eligible, note)
                VALUES ($1, $2, clock_timestamp(), clock_timestamp(), $3, $4, $5, $6, $7)
                ON CONFLICT (node_id) DO UPDATE
                SET address = excluded.address, heartbeat_at = excluded.heartbeat_at,
                    clock_offset_ms = excluded.clock_offset_ms, shards_owned = excluded.shards_owned,
                    workers = excluded.workers, eligible = excluded.eligible, note = excluded.note
                RETURNING xmax = 0
                """,
                node.node_id, node.address, node.clock_offset_ms, node.shards_owned, node.workers, node.eligible,
                node.note,
            )
            if joined:
                await _notify(db, Change(ChangeKind.MEMBERS, key=node.node_id))
            rows = await db.fetch(
                "SELECT * FROM nodes WHERE heartbeat_at > clock_timestamp() - $1 * interval '1 microsecond' "
                "ORDER BY node_id",
                common.micros_of_delta(live_within),
            )
        return [codec.build_node(row) for row in rows]

    async def remove_node(self, node_id: str) -> None:
        async with self._transaction() as db:
            await db.execute("DELETE FROM nodes WHERE node_id = $1", node_id)
            await _notify(db, Change(ChangeKind.MEMBERS, key=node_id))

    async def list_nodes(self) -> list[NodeInfo]:
        async with self._connection() as db:
            rows = await db.fetch("SELECT * FROM nodes ORDER BY node_id")
        return [codec.build_node(row) for row in rows]

    async def watch_changes(self, on_change: Callable[[Change], None]) -> None:
        """LISTEN for changes until cancelled; after a lost connection, connect and LISTEN again
        with capped, jittered backoff (a restarting database is weather, not an error)."""
        failures = 0
        while True:
            listening_since = time.monotonic()
            try:
                await self._listen_until_lost(on_change)
            except StorageUnavailable as error:
                # A session that lasted was no failure to connect: the backoff starts afresh.
                failures = 1 if time.monotonic() - listening_since > LISTENER_PING else failures + 1
                delay = LISTENER_BACKOFF.delay(failures, self._rng)
                log.warning("change listener: %s (listening again in %.1f s)", error, delay)
                await asyncio.sleep(delay)

    async def _listen_until_lost(self, on_change: Callable[[Change], None]) -> None:
        """One LISTEN session; raises StorageUnavailable once its connection is gone."""

        def deliver(_connection: object, _pid: int, _channel: str, payload: str) -> None:
            change = common.decode_change(payload)
            if change is not None:
                on_change(change)

        try:
            listener = await asyncpg.connect(self.url, timeout=LISTENER_PING)
        except POSTGRES_DRIVER_ERRORS as error:
            raise classify_postgres(error, doing="connecting to listen for changes") from error
        lost = asyncio.Event()
        listener.add_termination_listener(lambda _connection: lost.set())
        try:
            await listener.add_listener(CHANGES_CHANNEL, deliver)
            # Changes missed while (re)connecting are found by the full scan; a members change
            # makes every node look at the cluster again at once (and renew, if it could not).
            on_change(Change(ChangeKind.MEMBERS))
            while not lost.is_set():
                # A server that vanished without closing the socket is found by the ping.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(LISTENER_PING):
                        await lost.wait()
                if not lost.is_set():
                    await listener.execute("SELECT 1", timeout=LISTENER_PING)
            raise StorageUnavailable("the change listener's connection was closed")
        except POSTGRES_DRIVER_ERRORS as error:
            raise classify_postgres(error, connection_closed=listener.is_closed(), doing="listening") from error
        finally:
            with contextlib.suppress(Exception):
                await listener.close(timeout=2)
