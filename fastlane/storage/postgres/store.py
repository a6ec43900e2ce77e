"""The PostgreSQL store (asyncpg): production and multi-node.

Batches are set-based: one statement over ``unnest`` arrays per batch, never a statement per row.
Leases are judged by ``clock_timestamp()`` (the database clock at the moment of the statement,
not the start of the transaction). Every write another node must hear of is notified inside its
transaction (see ``changes``).

This module holds the lifecycle and the jobs; the fast lane, runs, shards, the change watch, API
tokens, the audit trail, quotas and history retention are in the mixins of ``lane``, ``runs``,
``shards``, ``changes``, ``tokens``, ``audit``, ``quotas`` and ``history``, the pool in
``connection``, the SQL in ``queries``.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from fastlane.domain.models import Job, JobSpec, JobState, new_id, shard_of
from fastlane.domain.records import Change, ChangeKind, Page
from fastlane.domain.schedules import first_fire
from fastlane.domain.validation import validate_spec
from fastlane.errors import ConfigurationError, InvalidState, JobNotFound
from fastlane.storage import codec, common
from fastlane.storage.base import Store
from fastlane.storage.migrations import migrations_for
from fastlane.storage.postgres import queries
from fastlane.storage.postgres.audit import PostgresAudit
from fastlane.storage.postgres.changes import PostgresChanges, notify
from fastlane.storage.postgres.connection import DEFAULT_LEASE_TTL
from fastlane.storage.postgres.history import PostgresHistory
from fastlane.storage.postgres.lane import PostgresLane
from fastlane.storage.postgres.quotas import PostgresQuotas
from fastlane.storage.postgres.runs import PostgresRuns
from fastlane.storage.postgres.shards import PostgresShards
from fastlane.storage.postgres.tokens import PostgresTokens
from fastlane.storage.postgres.workflows import PostgresWorkflows

_MIGRATION_LOCK = 7_236_001  # pg_advisory_xact_lock key: one migrator at a time across nodes


class PostgresStore(
    PostgresLane, PostgresRuns, PostgresShards, PostgresChanges, PostgresTokens, PostgresAudit, PostgresQuotas,
    PostgresHistory, PostgresWorkflows, Store,
):
    """Store on PostgreSQL through an asyncpg pool."""

    dialect = "postgres"

    def __init__(
        self,
        url: str,
        *,
        shard_count: int,
        pool_size: int = 10,
        rng: random.Random | None = None,
        lease_ttl: timedelta = DEFAULT_LEASE_TTL,
    ) -> None:
        """``lease_ttl`` is the nodes' shard lease TTL: the session limits of every connection
        derive from it (see :class:`~fastlane.storage.postgres.connection.SessionLimits`)."""
        super().__init__(url, pool_size=pool_size, lease_ttl=lease_ttl)
        self._requested_shards = shard_count
        self._shard_count: int | None = None
        self._rng = rng or random.Random()

    # -- lifecycle ------------------------------------------------------------------------------

    async def migrate(self) -> int:
        # On a connection without the statement and lock limits of the pool's (see
        # SessionLimits.migration_settings): a migration may rightly take long.
        async with self._migration_transaction() as db:
            await db.execute(queries.LOCK_MIGRATIONS, _MIGRATION_LOCK)
            exists = await db.fetchval(queries.META_TABLE_EXISTS)
            current = 0
            if exists:
                current = int(await db.fetchval(queries.SCHEMA_VERSION))
            migrations = migrations_for(self.dialect)
            for migration in migrations:
                if migration.version > current:
                    await db.execute(migration.sql)
                    await db.execute(queries.SET_SCHEMA_VERSION, str(migration.version))
            await db.execute(queries.INIT_SHARD_COUNT, str(self._requested_shards))
            count = int(await db.fetchval(queries.SHARD_COUNT))
            await db.execute(queries.CREATE_SHARDS, count)
            self._shard_count = count
            return migrations[-1].version if migrations else 0

    async def shard_count(self) -> int:
        if self._shard_count is None:
            async with self._connection() as db:
                value = await db.fetchval(queries.SHARD_COUNT)
            if value is None:
                raise ConfigurationError("the database is not migrated: run `fastlane migrate --db URL`")
            self._shard_count = int(value)
        return self._shard_count

    async def db_now(self) -> datetime:
        async with self._connection() as db:
            now: datetime = await db.fetchval(queries.DB_NOW)
        return now

    # -- jobs -----------------------------------------------------------------------------------

    async def create_job(self, spec: JobSpec, *, job_id: str | None = None) -> tuple[Job, bool]:
        validate_spec(spec)
        job_id = job_id or new_id()
        shard_id = shard_of(job_id, await self.shard_count())
        async with self._transaction() as db:
            now = await db.fetchval(queries.DB_NOW)
            stored = common.anchor_interval(spec, now)
            row = await db.fetchrow(
                queries.INSERT_JOB,
                job_id, spec.tenant, spec.name, spec.job_type, shard_id, first_fire(stored.schedule, now),
                spec.priority, spec.payload, codec.encode_policies(stored).decode(), now,
            )
            if row is not None:
                job = codec.build_job(row)
                await notify(db, Change(ChangeKind.JOB, job.shard_id, job.tenant, job.job_id))
                return job, True
            row = await db.fetchrow(queries.JOB_BY_NAME, spec.tenant, spec.name)
            if row is None:
                # The job that conflicted was deleted since (this statement sees a new snapshot).
                # Raised as the TypeError that subscripting None raised here before this check.
                raise TypeError(f"job {spec.name!r} of tenant {spec.tenant!r} vanished after conflicting")
            existing = codec.build_job(row)
        return common.idempotent_create(existing, spec), False

    async def get_job(self, tenant: str, job_id: str) -> Job:
        async with self._connection() as db:
            row = await db.fetchrow(queries.GET_JOB, job_id, tenant)
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
        name: str | None = None,
    ) -> Page[Job]:
        after = codec.decode_page_token(page_token, str)[0] if page_token else ""
        async with self._connection() as db:
            if name is not None:  # one row at most, found by the (tenant, name) index
                found = await db.fetchrow(queries.JOB_BY_NAME, tenant, name)
                return common.named_job_page(None if found is None else codec.build_job(found), state, job_type, after)
            rows = await db.fetch(
                queries.LIST_JOBS,
                tenant, after, state.value if state else None, job_type, common.page_limit(limit) + 1,
            )
        return common.page_of([codec.build_job(row) for row in rows], limit, common.job_page_key)

    async def update_job(self, tenant: str, job_id: str, spec: JobSpec) -> Job:
        validate_spec(spec)
        async with self._transaction() as db:
            row = await db.fetchrow(queries.LOCK_JOB, job_id, tenant)
            if row is None:
                raise JobNotFound(job_id)
            current = codec.build_job(row)
            common.check_update(current, spec)
            now = await db.fetchval(queries.DB_NOW)
            spec = common.anchor_interval(spec, now)
            next_fire_at, state = common.rescheduled(current, spec, now)
            row = await db.fetchrow(
                queries.UPDATE_JOB,
                job_id, tenant, spec.job_type, spec.priority, spec.payload,
                codec.encode_policies(spec).decode(), next_fire_at, state.value, now,
            )
            assert row is not None, "LOCK_JOB holds the job's row lock in this transaction"
            job = codec.build_job(row)
            await notify(db, Change(ChangeKind.JOB, job.shard_id, job.tenant, job.job_id))
        return job

    async def pause_job(self, tenant: str, job_id: str) -> Job:
        return await self._change_state(tenant, job_id, common.PAUSE_FROM, JobState.PAUSED, "pause")

    async def resume_job(self, tenant: str, job_id: str) -> Job:
        return await self._change_state(tenant, job_id, common.RESUME_FROM, JobState.ACTIVE, "resume")

    async def set_job_aside(self, job_id: str, reason: str) -> None:
        async with self._transaction() as db:
            row = await db.fetchrow(queries.SET_JOB_ASIDE, job_id, JobState.ERRORED.value, reason)
            if row is not None:
                await notify(db, Change(ChangeKind.JOB, row["shard_id"], row["tenant"], job_id))

    async def count_jobs(self, state: JobState) -> int:
        async with self._connection() as db:
            return int(await db.fetchval(queries.COUNT_JOBS, state.value))

    async def _change_state(
        self, tenant: str, job_id: str, sources: tuple[JobState, ...], target: JobState, verb: str
    ) -> Job:
        async with self._transaction() as db:
            row = await db.fetchrow(queries.LOCK_JOB, job_id, tenant)
            if row is None:
                raise JobNotFound(job_id)
            if row["state"] == target.value:
                return codec.build_job(row)
            if row["state"] not in sources:
                raise InvalidState("job", job_id, row["state"], verb)
            row = await db.fetchrow(queries.CHANGE_JOB_STATE, job_id, target.value)
            assert row is not None, "LOCK_JOB holds the job's row lock in this transaction"
            job = codec.build_job(row)
            await notify(db, Change(ChangeKind.JOB, job.shard_id, job.tenant, job.job_id))
        return job

    async def delete_job(self, tenant: str, job_id: str) -> None:
        async with self._transaction() as db:
            shard_id = await db.fetchval(queries.DELETE_JOB, job_id, tenant)
            if shard_id is None:
                raise JobNotFound(job_id)
            await notify(db, Change(ChangeKind.JOB_DELETED, shard_id, tenant, job_id))
            await db.execute(queries.CANCEL_RUNS_OF_DELETED_JOB, job_id)
