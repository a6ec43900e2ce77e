"""The SQLite store (aiosqlite, WAL): the embedded default for a single node.

Behaviour is identical to the PostgreSQL store (one contract suite runs against both). Instants
are stored as integer microseconds since the Unix epoch, UTC. Batches travel as one JSON array
expanded by ``json_each`` so that, as on PostgreSQL, a batch is one statement. Writes take
``BEGIN IMMEDIATE``, so two stores on one file (two processes, or a test's two connections)
serialise on SQLite's write lock; the fence is checked inside that lock.

This module holds the lifecycle and the jobs; the fast lane, runs, shards, API tokens, the audit
trail, quotas and history retention are in the mixins of ``lane``, ``runs``, ``shards``,
``tokens``, ``audit``, ``quotas`` and ``history``, the connections in ``connection``, the SQL in
``queries``.
"""

from __future__ import annotations

import random
from datetime import datetime

from fastlane.clock import from_micros, to_micros
from fastlane.domain.models import Job, JobSpec, JobState, new_id, shard_of
from fastlane.domain.records import Page
from fastlane.domain.schedules import first_fire
from fastlane.domain.validation import validate_spec
from fastlane.errors import ConfigurationError, InvalidState, JobNotFound, StorageError
from fastlane.storage import codec, common
from fastlane.storage.base import Store
from fastlane.storage.migrations import migrations_for
from fastlane.storage.sqlite import queries
from fastlane.storage.sqlite.audit import SQLiteAudit
from fastlane.storage.sqlite.connection import fetch_all, fetch_one, fetch_value, instant
from fastlane.storage.sqlite.history import SQLiteHistory
from fastlane.storage.sqlite.lane import SQLiteLane
from fastlane.storage.sqlite.quotas import SQLiteQuotas
from fastlane.storage.sqlite.runs import SQLiteRuns
from fastlane.storage.sqlite.shards import SQLiteShards
from fastlane.storage.sqlite.tokens import SQLiteTokens
from fastlane.storage.sqlite.workflows import SQLiteWorkflows


class SQLiteStore(
    SQLiteLane, SQLiteRuns, SQLiteShards, SQLiteTokens, SQLiteAudit, SQLiteQuotas, SQLiteHistory, SQLiteWorkflows,
    Store,
):
    """Store on one SQLite file: a write connection (serialised) and a read connection."""

    dialect = "sqlite"

    def __init__(self, url: str, *, shard_count: int, rng: random.Random | None = None) -> None:
        super().__init__(url)
        self._requested_shards = shard_count
        self._shard_count: int | None = None
        self._rng = rng or random.Random()

    @property
    def server_epoch(self) -> int:
        return 0  # one file, no failover

    # -- lifecycle ------------------------------------------------------------------------------

    async def migrate(self) -> int:
        async with self._transaction() as db:
            exists = await fetch_value(db, queries.META_TABLE_EXISTS)
            current = int(await fetch_value(db, queries.SCHEMA_VERSION)) if exists else 0
            migrations = migrations_for(self.dialect)
            for migration in migrations:
                if migration.version > current:
                    for statement in _statements(migration.sql):
                        await db.execute(statement)
                    await db.execute(queries.SET_SCHEMA_VERSION, (str(migration.version),))
            await db.execute(queries.INIT_SHARD_COUNT, (str(self._requested_shards),))
            count = int(await fetch_value(db, queries.SHARD_COUNT))
            await db.executemany(queries.CREATE_SHARDS, [(i,) for i in range(count)])
            self._shard_count = count
            return migrations[-1].version if migrations else 0

    async def shard_count(self) -> int:
        if self._shard_count is None:
            async with self._read() as db:
                try:
                    value = await fetch_value(db, queries.SHARD_COUNT)
                except StorageError:
                    value = None
            if value is None:
                raise ConfigurationError("the database is not migrated: run `fastlane migrate --db URL`")
            self._shard_count = int(value)
        return self._shard_count

    async def db_now(self) -> datetime:
        async with self._read() as db:
            return from_micros(await fetch_value(db, queries.DB_NOW))

    # -- jobs -----------------------------------------------------------------------------------

    async def create_job(self, spec: JobSpec, *, job_id: str | None = None) -> tuple[Job, bool]:
        validate_spec(spec)
        job_id = job_id or new_id()
        shard_id = shard_of(job_id, await self.shard_count())
        async with self._transaction() as db:
            now = from_micros(await fetch_value(db, queries.DB_NOW))
            stored = common.anchor_interval(spec, now)
            row = await fetch_one(
                db,
                queries.INSERT_JOB,
                (job_id, spec.tenant, spec.name, spec.job_type, shard_id, instant(first_fire(stored.schedule, now)),
                 spec.priority, spec.payload, codec.encode_policies(stored).decode(), to_micros(now), to_micros(now)),
            )
            if row is not None:
                return codec.build_job(row), True
            row = await fetch_one(db, queries.JOB_BY_NAME, (spec.tenant, spec.name))
            assert row is not None, "the insert conflicted with it, and BEGIN IMMEDIATE keeps other writers out"
            existing = codec.build_job(row)
        return common.idempotent_create(existing, spec), False

    async def get_job(self, tenant: str, job_id: str) -> Job:
        async with self._read() as db:
            row = await fetch_one(db, queries.GET_JOB, (job_id, tenant))
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
        state_value = state.value if state else None
        async with self._read() as db:
            if name is not None:  # one row at most, found by the (tenant, name) index
                found = await fetch_one(db, queries.JOB_BY_NAME, (tenant, name))
                return common.named_job_page(None if found is None else codec.build_job(found), state, job_type, after)
            rows = await fetch_all(
                db,
                queries.LIST_JOBS,
                (tenant, after, state_value, state_value, job_type, job_type, common.page_limit(limit) + 1),
            )
        return common.page_of([codec.build_job(row) for row in rows], limit, common.job_page_key)

    async def update_job(self, tenant: str, job_id: str, spec: JobSpec) -> Job:
        validate_spec(spec)
        async with self._transaction() as db:
            row = await fetch_one(db, queries.LOCK_JOB, (job_id, tenant))
            if row is None:
                raise JobNotFound(job_id)
            current = codec.build_job(row)
            common.check_update(current, spec)
            now = from_micros(await fetch_value(db, queries.DB_NOW))
            spec = common.anchor_interval(spec, now)
            next_fire_at, state = common.rescheduled(current, spec, now)
            row = await fetch_one(
                db,
                queries.UPDATE_JOB,
                (spec.job_type, spec.priority, spec.payload, codec.encode_policies(spec).decode(),
                 instant(next_fire_at), state.value, to_micros(now), job_id, tenant),
            )
            assert row is not None, "LOCK_JOB found the job, and BEGIN IMMEDIATE keeps other writers out"
        return codec.build_job(row)

    async def pause_job(self, tenant: str, job_id: str) -> Job:
        return await self._change_state(tenant, job_id, common.PAUSE_FROM, JobState.PAUSED, "pause")

    async def resume_job(self, tenant: str, job_id: str) -> Job:
        return await self._change_state(tenant, job_id, common.RESUME_FROM, JobState.ACTIVE, "resume")

    async def set_job_aside(self, job_id: str, reason: str) -> None:
        async with self._transaction() as db:
            await db.execute(queries.SET_JOB_ASIDE, (JobState.ERRORED.value, reason, job_id))

    async def count_jobs(self, state: JobState) -> int:
        async with self._read() as db:
            row = await fetch_one(db, queries.COUNT_JOBS, (state.value,))
        return int(row["n"]) if row is not None else 0

    async def _change_state(
        self, tenant: str, job_id: str, sources: tuple[JobState, ...], target: JobState, verb: str
    ) -> Job:
        async with self._transaction() as db:
            row = await fetch_one(db, queries.LOCK_JOB, (job_id, tenant))
            if row is None:
                raise JobNotFound(job_id)
            if row["state"] == target.value:
                return codec.build_job(row)
            if row["state"] not in sources:
                raise InvalidState("job", job_id, row["state"], verb)
            row = await fetch_one(db, queries.CHANGE_JOB_STATE, (target.value, job_id))
            assert row is not None, "LOCK_JOB found the job, and BEGIN IMMEDIATE keeps other writers out"
        return codec.build_job(row)

    async def delete_job(self, tenant: str, job_id: str) -> None:
        async with self._transaction() as db:
            deleted = await fetch_one(db, queries.DELETE_JOB, (job_id, tenant))
            if deleted is None:
                raise JobNotFound(job_id)
            await db.execute(queries.CANCEL_RUNS_OF_DELETED_JOB, (job_id,))


def _statements(script: str) -> list[str]:
    """Split a migration into statements (they hold no semicolons inside literals)."""
    lines = [line for line in script.splitlines() if not line.strip().startswith("--")]
    return [statement.strip() for statement in "\n".join(lines).split(";") if statement.strip()]
