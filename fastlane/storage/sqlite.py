"""The SQLite store (aiosqlite, WAL): the embedded default for a single node.

Behaviour is identical to the PostgreSQL store (one contract suite runs against both). Instants
are stored as integer microseconds since the Unix epoch, UTC. Batches travel as one JSON array
expanded by ``json_each`` so that, as on PostgreSQL, a batch is one statement. Writes take
``BEGIN IMMEDIATE``, so two stores on one file (two processes, or a test's two connections)
serialise on SQLite's write lock; the fence is checked inside that lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Collection, Container, Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiosqlite
import orjson

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
from fastlane.domain.records import AttemptResult, Change, Dispatch, Heartbeat, Occurrence, Page
from fastlane.domain.schedules import first_fire
from fastlane.domain.transitions import CANCELLED_BY_REQUEST, OVERLAP_CANCELLED
from fastlane.domain.validation import validate_spec
from fastlane.errors import (
    ConfigurationError,
    InvalidState,
    JobNotFound,
    RunNotFound,
    StaleFence,
    StorageError,
)
from fastlane.storage import codec, common
from fastlane.storage.driver_errors import SQLITE_DRIVER_ERRORS, classify_sqlite
from fastlane.storage.migrations import migrations_for
from fastlane.storage.results import Cancellation, Materialised, ResultOutcome
from fastlane.storage.turns import WriteTurns

# The database clock, in integer microseconds. SQLite's own julianday('now') only has millisecond
# resolution; an embedded database shares its host's clock anyway, so the connection gets a SQL
# function reading that clock at full resolution.
NOW = "fl_now_us()"


def _now_us() -> int:
    return time.time_ns() // 1000

_TIME_COLUMNS = frozenset({
    "heartbeat_at",
    "next_fire_at", "created_at", "updated_at", "scheduled_for", "available_at", "lease_expires_at",
    "first_attempt_at", "finished_at", "dispatched_at", "started_at",
})

DUE_JOBS_CHUNK = 2_000
_LOAD_DUE_JOBS = f"""
    SELECT job_id, shard_id, next_fire_at,
           {codec.DUE_JOB_SCHEDULE.format(kind="json_extract(policies, '$.schedule.kind')",
                                          schedule="json_extract(policies, '$.schedule')")},
           json_extract(policies, '$.misfire')
    FROM jobs
    WHERE state = 'active' AND shard_id IN (SELECT value FROM json_each(?)) AND next_fire_at < ?
      AND (? IS NULL OR next_fire_at >= ?)
      AND (? IS NULL OR (next_fire_at, job_id) > (?, ?))
    ORDER BY next_fire_at, job_id LIMIT ?
"""

_FENCE = f"""
    SELECT 1 FROM shards WHERE shard_id = ? AND owner = ? AND token = ? AND lease_expires_at > {NOW}
"""


def _instant(value: datetime | None) -> int | None:
    return None if value is None else to_micros(value)


def _row(row: sqlite3.Row) -> dict[str, Any]:
    """A row as a dict with instants turned back into aware datetimes."""
    return _rows([row])[0]


def _rows(rows: Sequence[sqlite3.Row]) -> list[dict[str, Any]]:
    """Rows as dicts with instants turned back into aware datetimes (columns looked at once)."""
    if not rows:
        return []
    names = rows[0].keys()
    instants = [index for index, name in enumerate(names) if name in _TIME_COLUMNS]
    converted = []
    for row in rows:
        values = list(row)
        for index in instants:
            if values[index] is not None:
                values[index] = from_micros(values[index])
        converted.append(dict(zip(names, values, strict=True)))
    return converted


def _json(rows: Iterable[Sequence[Any]]) -> str:
    return orjson.dumps(list(rows)).decode()


class SQLiteStore:
    """Store on one SQLite file: a write connection (serialised) and a read connection."""

    dialect = "sqlite"

    def __init__(self, url: str, *, shard_count: int, rng: random.Random | None = None) -> None:
        self.url = url
        # sqlite:///relative.db and sqlite:////absolute/path.db, as SQLAlchemy reads them.
        self.path = Path(url.removeprefix("sqlite:///"))
        self._requested_shards = shard_count
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._write_lock = WriteTurns()
        self._read_lock = asyncio.Lock()
        self._shard_count: int | None = None
        self._rng = rng or random.Random()

    # -- plumbing -------------------------------------------------------------------------------

    async def _connect(self) -> aiosqlite.Connection:
        connection: aiosqlite.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = await aiosqlite.connect(self.path, isolation_level=None)
            connection.row_factory = sqlite3.Row
            await connection.create_function("fl_now_us", 0, _now_us)
            await connection.execute("PRAGMA journal_mode = WAL")
            await connection.execute("PRAGMA synchronous = NORMAL")  # durable in WAL mode except on power loss
            await connection.execute("PRAGMA busy_timeout = 10000")
        except SQLITE_DRIVER_ERRORS as error:
            if connection is not None:  # half set up: its thread must not linger
                with contextlib.suppress(Exception):
                    await connection.close()
            raise classify_sqlite(error, doing=f"opening {str(self.path)!r}") from error
        return connection

    @contextlib.asynccontextmanager
    async def _transaction(self, *, urgent: bool = False) -> AsyncIterator[aiosqlite.Connection]:
        """The write transaction; ``urgent`` (lease and membership upkeep) goes ahead of queued ones."""
        async with self._write_lock.turn(urgent=urgent):
            if self._writer is None:
                self._writer = await self._connect()
            db = self._writer
            try:
                await db.execute("BEGIN IMMEDIATE")
                try:
                    yield db
                except BaseException:
                    await self._roll_back(db)
                    raise
                await db.execute("COMMIT")
            except SQLITE_DRIVER_ERRORS as error:
                if self._writer is db and db.in_transaction:  # a failed COMMIT leaves it open
                    await self._roll_back(db)
                raise classify_sqlite(error) from error

    async def _roll_back(self, db: aiosqlite.Connection) -> None:
        """Roll back; a writer that cannot (its file gone, say) is closed, so the next
        transaction starts on a fresh connection instead of failing on this one forever."""
        try:
            if db.in_transaction:  # SQLite rolls back by itself after some errors
                await db.execute("ROLLBACK")
        except (sqlite3.Error, ValueError):  # ValueError: aiosqlite's connection is already closed
            if self._writer is db:
                self._writer = None
            with contextlib.suppress(Exception):
                await db.close()

    @contextlib.asynccontextmanager
    async def _read(self) -> AsyncIterator[aiosqlite.Connection]:
        async with self._read_lock:
            if self._reader is None:
                self._reader = await self._connect()
            try:
                yield self._reader
            except SQLITE_DRIVER_ERRORS as error:
                raise classify_sqlite(error) from error

    async def close(self) -> None:
        for name in ("_writer", "_reader"):
            connection = getattr(self, name)
            setattr(self, name, None)
            if connection is not None:
                await connection.close()

    async def migrate(self) -> int:
        async with self._transaction() as db:
            exists = await _value(db, "SELECT count(*) FROM sqlite_master WHERE name = 'fastlane_meta'")
            current = int(await _value(db, "SELECT value FROM fastlane_meta WHERE key = 'schema_version'")) if exists else 0
            migrations = migrations_for(self.dialect)
            for migration in migrations:
                if migration.version > current:
                    for statement in _statements(migration.sql):
                        await db.execute(statement)
                    await db.execute(
                        "INSERT INTO fastlane_meta VALUES ('schema_version', ?) "
                        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        (str(migration.version),),
                    )
            await db.execute(
                "INSERT INTO fastlane_meta VALUES ('shard_count', ?) ON CONFLICT (key) DO NOTHING",
                (str(self._requested_shards),),
            )
            count = int(await _value(db, "SELECT value FROM fastlane_meta WHERE key = 'shard_count'"))
            await db.executemany("INSERT OR IGNORE INTO shards (shard_id) VALUES (?)", [(i,) for i in range(count)])
            self._shard_count = count
            return migrations[-1].version if migrations else 0

    async def shard_count(self) -> int:
        if self._shard_count is None:
            async with self._read() as db:
                try:
                    value = await _value(db, "SELECT value FROM fastlane_meta WHERE key = 'shard_count'")
                except StorageError:
                    value = None
            if value is None:
                raise ConfigurationError("the database is not migrated: run `fastlane migrate --db URL`")
            self._shard_count = int(value)
        return self._shard_count

    async def db_now(self) -> datetime:
        async with self._read() as db:
            return from_micros(await _value(db, f"SELECT {NOW}"))

    # -- jobs -----------------------------------------------------------------------------------

    async def create_job(self, spec: JobSpec, *, job_id: str | None = None) -> tuple[Job, bool]:
        validate_spec(spec)
        job_id = job_id or new_id()
        shard_id = shard_of(job_id, await self.shard_count())
        async with self._transaction() as db:
            now = from_micros(await _value(db, f"SELECT {NOW}"))
            stored = common.anchor_interval(spec, now)
            row = await _one(
                db,
                """
                INSERT INTO jobs (job_id, tenant, name, job_type, shard_id, state, next_fire_at, priority,
                                  payload, policies, created_at, updated_at)
                VALUES (?, ?, ?, ?, ?, 'active', ?, ?, ?, ?, ?, ?)
                ON CONFLICT (tenant, name) DO NOTHING
                RETURNING *
                """,
                (job_id, spec.tenant, spec.name, spec.job_type, shard_id, _instant(first_fire(stored.schedule, now)),
                 spec.priority, spec.payload, codec.encode_policies(stored).decode(), to_micros(now), to_micros(now)),
            )
            if row is not None:
                return codec.build_job(row), True
            existing = codec.build_job(
                await _one(db, "SELECT * FROM jobs WHERE tenant = ? AND name = ?", (spec.tenant, spec.name))
            )
        return common.idempotent_create(existing, spec), False

    async def get_job(self, tenant: str, job_id: str) -> Job:
        async with self._read() as db:
            row = await _one(db, "SELECT * FROM jobs WHERE job_id = ? AND tenant = ?", (job_id, tenant))
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
        state_value = state.value if state else None
        async with self._read() as db:
            rows = await _all(
                db,
                """
                SELECT * FROM jobs
                WHERE tenant = ? AND job_id > ? AND (? IS NULL OR state = ?) AND (? IS NULL OR job_type = ?)
                ORDER BY job_id LIMIT ?
                """,
                (tenant, after, state_value, state_value, job_type, job_type, common.page_limit(limit) + 1),
            )
        return common.page_of([codec.build_job(row) for row in rows], limit, lambda job: (job.job_id,))

    async def update_job(self, tenant: str, job_id: str, spec: JobSpec) -> Job:
        validate_spec(spec)
        async with self._transaction() as db:
            row = await _one(db, "SELECT * FROM jobs WHERE job_id = ? AND tenant = ?", (job_id, tenant))
            if row is None:
                raise JobNotFound(job_id)
            current = codec.build_job(row)
            common.check_update(current, spec)
            now = from_micros(await _value(db, f"SELECT {NOW}"))
            spec = common.anchor_interval(spec, now)
            next_fire_at, state = common.rescheduled(current, spec, now)
            row = await _one(
                db,
                """
                UPDATE jobs SET job_type = ?, priority = ?, payload = ?, policies = ?, next_fire_at = ?, state = ?,
                                version = version + 1, updated_at = ?
                WHERE job_id = ? AND tenant = ?
                RETURNING *
                """,
                (spec.job_type, spec.priority, spec.payload, codec.encode_policies(spec).decode(),
                 _instant(next_fire_at), state.value, to_micros(now), job_id, tenant),
            )
        return codec.build_job(row)

    async def pause_job(self, tenant: str, job_id: str) -> Job:
        return await self._change_state(tenant, job_id, (JobState.ACTIVE,), JobState.PAUSED, "pause")

    async def resume_job(self, tenant: str, job_id: str) -> Job:
        return await self._change_state(tenant, job_id, (JobState.PAUSED, JobState.ERRORED), JobState.ACTIVE, "resume")

    async def set_job_aside(self, job_id: str, reason: str) -> None:
        async with self._transaction() as db:
            await db.execute(
                f"UPDATE jobs SET state = ?, error = ?, version = version + 1, updated_at = {NOW} WHERE job_id = ?",
                (JobState.ERRORED.value, reason, job_id),
            )

    async def count_jobs(self, state: JobState) -> int:
        async with self._read() as db:
            row = await _one(db, "SELECT count(*) AS n FROM jobs WHERE state = ?", (state.value,))
        return int(row["n"]) if row is not None else 0

    async def _change_state(
        self, tenant: str, job_id: str, sources: tuple[JobState, ...], target: JobState, verb: str
    ) -> Job:
        async with self._transaction() as db:
            row = await _one(db, "SELECT * FROM jobs WHERE job_id = ? AND tenant = ?", (job_id, tenant))
            if row is None:
                raise JobNotFound(job_id)
            if row["state"] == target.value:
                return codec.build_job(row)
            if row["state"] not in sources:
                raise InvalidState("job", job_id, row["state"], verb)
            row = await _one(
                db,
                f"UPDATE jobs SET state = ?, error = NULL, version = version + 1, updated_at = {NOW} WHERE job_id = ? RETURNING *",
                (target.value, job_id),
            )
        return codec.build_job(row)

    async def delete_job(self, tenant: str, job_id: str) -> None:
        async with self._transaction() as db:
            deleted = await _one(
                db, "DELETE FROM jobs WHERE job_id = ? AND tenant = ? RETURNING job_id", (job_id, tenant)
            )
            if deleted is None:
                raise JobNotFound(job_id)
            await db.execute(
                f"UPDATE runs SET state = 'cancelled', finished_at = {NOW}, updated_at = {NOW}, "
                "last_error = 'job deleted' WHERE job_id = ? AND state IN ('scheduled', 'buffered')",
                (job_id,),
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
        lower = _instant(at_or_after)
        after_time, after_id = (to_micros(after_job[0]), after_job[1]) if after_job else (None, "")
        params = (_json_list(shard_ids), to_micros(before), lower, lower, after_time, after_time, after_id, limit)
        jobs: list[DueJob] = []
        async with self._read() as db, db.execute(_LOAD_DUE_JOBS, params) as cursor:
            # A few thousand rows at a time: the rows are thrown away as soon as they are decoded,
            # and a smaller batch of them leaves less memory behind in the allocator.
            while rows := await cursor.fetchmany(DUE_JOBS_CHUNK):
                jobs += [codec.build_due_job(job_id, shard_id, from_micros(fire_at), schedule, misfire)
                         for job_id, shard_id, fire_at, schedule, misfire in rows]
        return jobs

    async def materialise_runs(self, fences: Sequence[ShardLease], occurrences: Sequence[Occurrence]) -> Materialised:
        async with self._transaction() as db:
            for fence in fences:
                await _check_fence(db, fence)
            advanced = await _all(
                db,
                f"""
                UPDATE jobs
                SET next_fire_at = o.next_fire_at, updated_at = {NOW},
                    state = CASE WHEN o.next_fire_at IS NULL THEN 'completed' ELSE jobs.state END
                FROM (SELECT json_extract(value, '$[0]') AS job_id, json_extract(value, '$[1]') AS expected,
                             json_extract(value, '$[2]') AS next_fire_at FROM json_each(?)) AS o
                WHERE jobs.job_id = o.job_id AND jobs.next_fire_at = o.expected
                  AND jobs.state = 'active' AND jobs.shard_id IN (SELECT value FROM json_each(?))
                RETURNING jobs.job_id, json_extract(jobs.policies, '$.overlap') AS overlap
                """,
                (
                    _json((o.job_id, to_micros(o.expected_next_fire_at), _instant(o.next_fire_at)) for o in occurrences),
                    _json_list(fence.shard_id for fence in fences),
                ),
            )
            overlap_of = {row["job_id"]: row["overlap"] for row in advanced}
            changed = [
                codec.build_job(row)
                for row in await _all(
                    db,
                    "SELECT * FROM jobs WHERE job_id IN (SELECT value FROM json_each(?))",
                    (_json_list(o.job_id for o in occurrences if o.job_id not in overlap_of),),
                )
            ] if len(overlap_of) < len(occurrences) else []
            guarded = [job_id for job_id, policy in overlap_of.items() if policy != "allow"]
            active = []
            if guarded:
                active = await _all(
                    db,
                    "SELECT job_id, run_id, state FROM runs WHERE job_id IN (SELECT value FROM json_each(?)) "
                    "AND state IN (SELECT value FROM json_each(?))",
                    (_json_list(guarded), _json_list(common.ACTIVE_STATES)),
                )
            plan = common.plan_materialisation(
                occurrences, overlap_of, [(r["job_id"], r["run_id"], r["state"]) for r in active]
            )
            cancelling = await _cancel_for_overlap(db, plan)
            if not plan.rows:
                return Materialised(runs=[], advanced=frozenset(overlap_of), cancelling=cancelling, changed=changed)
            rows = await _all(
                db,
                f"""
                INSERT INTO runs (run_id, job_id, tenant, job_type, shard_id, scheduled_for, available_at, state,
                                  payload, priority, manual, delivery, lease_ttl_ms, timeout_ms, retry,
                                  created_at, updated_at, finished_at, last_error)
                SELECT o.run_id, j.job_id, j.tenant, j.job_type, j.shard_id, o.scheduled_for, o.scheduled_for,
                       o.state, j.payload, j.priority, 0, json_extract(j.policies, '$.delivery'),
                       CAST(json_extract(j.policies, '$.lease_ttl') * 1000 AS INTEGER),
                       CAST(json_extract(j.policies, '$.timeout') * 1000 AS INTEGER),
                       json_extract(j.policies, '$.retry'), {NOW}, {NOW},
                       CASE WHEN o.state = 'skipped' THEN {NOW} END, o.last_error
                FROM (SELECT json_extract(value, '$[0]') AS run_id, json_extract(value, '$[1]') AS job_id,
                             json_extract(value, '$[2]') AS scheduled_for, json_extract(value, '$[3]') AS state,
                             json_extract(value, '$[4]') AS last_error
                      FROM json_each(?)) AS o
                JOIN jobs j ON j.job_id = o.job_id
                WHERE true
                ON CONFLICT (job_id, scheduled_for) WHERE manual = 0 DO NOTHING
                RETURNING *
                """,
                (_json((r.run_id, r.job_id, to_micros(r.scheduled_for), r.state, r.last_error) for r in plan.rows),),
            )
        runs = [codec.build_run(row) for row in rows]
        scheduled = sorted((run for run in runs if run.state is RunState.SCHEDULED), key=lambda run: run.scheduled_for)
        return Materialised(runs=scheduled, advanced=frozenset(overlap_of), cancelling=cancelling, changed=changed)

    async def pending_runs(
        self, shard_ids: Collection[int], before: datetime, *, skip: Container[str] = frozenset()
    ) -> list[Run]:
        async with self._read() as db:
            async with db.execute(
                "SELECT run_id FROM runs WHERE state = 'scheduled' AND shard_id IN (SELECT value FROM json_each(?)) "
                "AND available_at < ? ORDER BY available_at",
                (_json_list(shard_ids), to_micros(before)),
            ) as cursor:
                wanted = [run_id for (run_id,) in await cursor.fetchall() if run_id not in skip]
            runs: list[Run] = []
            for chunk in common.chunks(wanted, common.PENDING_CHUNK):
                # Built chunk by chunk: the next query lets the event loop run between them.
                runs += map(codec.build_run, await _all(
                    db, "SELECT * FROM runs WHERE run_id IN (SELECT value FROM json_each(?)) AND state = 'scheduled'",
                    (_json_list(chunk),),
                ))
        return sorted(runs, key=lambda run: run.available_at)

    async def requeue_expired(self, fence: ShardLease) -> list[Run]:
        async with self._transaction() as db:
            await _check_fence(db, fence)
            rows = await _all(
                db,
                f"SELECT * FROM runs WHERE shard_id = ? AND state IN ('dispatched', 'running') "
                f"AND lease_expires_at < {NOW} ORDER BY lease_expires_at",
                (fence.shard_id,),
            )
            if not rows:
                return []
            now = from_micros(await _value(db, f"SELECT {NOW}"))
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
        async with self._read() as db:
            rows = await _all(
                db,
                f"SELECT DISTINCT shard_id FROM runs WHERE state IN ('dispatched', 'running') "
                f"AND shard_id IN (SELECT value FROM json_each(?)) AND lease_expires_at < {NOW}",
                (_json_list(shard_ids),),
            )
        return sorted(row["shard_id"] for row in rows)

    # -- runs -----------------------------------------------------------------------------------

    async def create_manual_run(self, tenant: str, job_id: str) -> Run:
        async with self._transaction() as db:
            row = await _one(
                db,
                f"""
                INSERT INTO runs (run_id, job_id, tenant, job_type, shard_id, scheduled_for, available_at, state,
                                  payload, priority, manual, delivery, lease_ttl_ms, timeout_ms, retry,
                                  created_at, updated_at)
                SELECT ?, j.job_id, j.tenant, j.job_type, j.shard_id, {NOW}, {NOW}, 'scheduled', j.payload,
                       j.priority, 1, json_extract(j.policies, '$.delivery'),
                       CAST(json_extract(j.policies, '$.lease_ttl') * 1000 AS INTEGER),
                       CAST(json_extract(j.policies, '$.timeout') * 1000 AS INTEGER),
                       json_extract(j.policies, '$.retry'), {NOW}, {NOW}
                FROM jobs j WHERE j.job_id = ? AND j.tenant = ?
                RETURNING *
                """,
                (new_id(), job_id, tenant),
            )
        if row is None:
            raise JobNotFound(job_id)
        return codec.build_run(row)

    async def cancel_run(self, tenant: str, run_id: str) -> Cancellation:
        async with self._transaction() as db:
            row = await _one(db, "SELECT * FROM runs WHERE run_id = ? AND tenant = ?", (run_id, tenant))
            if row is None:
                raise RunNotFound(run_id)
            run = codec.build_run(row)
            if run.state in (RunState.DISPATCHED, RunState.RUNNING):
                row = await _one(
                    db, f"UPDATE runs SET cancel_requested = 1, updated_at = {NOW} WHERE run_id = ? RETURNING *",
                    (run_id,),
                )
                return Cancellation(run=codec.build_run(row))
            if run.state not in (RunState.SCHEDULED, RunState.BUFFERED):
                raise InvalidState("run", run_id, run.state.value, "cancel")
            row = await _one(
                db,
                f"UPDATE runs SET state = 'cancelled', finished_at = {NOW}, updated_at = {NOW}, last_error = ? "
                "WHERE run_id = ? RETURNING *",
                (CANCELLED_BY_REQUEST, run_id),
            )
            released = await _release_buffered(db, [run.job_id])
        return Cancellation(run=codec.build_run(row), released=released)

    async def retry_run(self, tenant: str, run_id: str) -> Run:
        async with self._transaction() as db:
            row = await _one(db, "SELECT state FROM runs WHERE run_id = ? AND tenant = ?", (run_id, tenant))
            if row is None:
                raise RunNotFound(run_id)
            if row["state"] not in ("dead", "lost"):
                raise InvalidState("run", run_id, row["state"], "retry (only dead or lost runs can be replayed)")
            row = await _one(
                db,
                f"UPDATE runs SET state = 'scheduled', available_at = {NOW}, finished_at = NULL, cancel_requested = 0, "
                f"updated_at = {NOW} WHERE run_id = ? RETURNING *",
                (run_id,),
            )
        return codec.build_run(row)

    async def record_dispatches(self, dispatches: Sequence[Dispatch]) -> list[Attempt]:
        if not dispatches:
            return []
        async with self._transaction() as db:
            started = await _all(
                db,
                f"""
                UPDATE runs
                SET state = 'dispatched', attempts = runs.attempts + 1, lease_token = d.lease_token,
                    lease_expires_at = {NOW} + d.ttl_us, worker_id = d.worker_id, updated_at = {NOW},
                    first_attempt_at = coalesce(runs.first_attempt_at, d.dispatched_at)
                FROM (SELECT json_extract(value, '$[0]') AS run_id, json_extract(value, '$[1]') AS lease_token,
                             json_extract(value, '$[2]') AS worker_id, json_extract(value, '$[3]') AS ttl_us,
                             json_extract(value, '$[4]') AS dispatched_at
                      FROM json_each(?)) AS d
                WHERE runs.run_id = d.run_id AND runs.state = 'scheduled'
                RETURNING runs.run_id, runs.attempts, runs.lease_token, runs.worker_id
                """,
                (_json((d.run_id, d.lease_token, d.worker_id, common.micros_of_delta(d.lease_ttl), to_micros(d.dispatched_at))
                       for d in dispatches),),
            )
            if not started:
                return []
            sent = {d.run_id: d for d in dispatches}
            # One statement for the whole batch: a row at a time would cross to SQLite's thread
            # once per run, holding the single writer for seconds on a large batch.
            rows = await _all(
                db,
                """
                INSERT INTO attempts (run_id, attempt, lease_token, worker_id, node_id, outcome, dispatched_at)
                SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
                       json_extract(value, '$[3]'), json_extract(value, '$[4]'), 'pending',
                       json_extract(value, '$[5]')
                FROM json_each(?)
                RETURNING *
                """,
                (_json((run["run_id"], run["attempts"], run["lease_token"], run["worker_id"],
                        sent[run["run_id"]].node_id, to_micros(sent[run["run_id"]].dispatched_at))
                       for run in started),),
            )
        return [codec.build_attempt(row) for row in rows]

    async def record_heartbeats(self, heartbeats: Sequence[Heartbeat]) -> list[str]:
        if not heartbeats:
            return []
        async with self._transaction() as db:
            current = {
                (row["run_id"], row["lease_token"])
                for row in await _all(
                    db,
                    "SELECT run_id, lease_token FROM runs WHERE run_id IN (SELECT value FROM json_each(?)) "
                    "AND state IN ('dispatched', 'running')",
                    (_json_list(h.run_id for h in heartbeats),),
                )
            }
            live = [h for h in heartbeats if (h.run_id, h.lease_token) in current]
            await db.executemany(
                f"""
                UPDATE runs SET lease_expires_at = {NOW} + lease_ttl_ms * 1000, progress = coalesce(?, progress),
                                checkpoint = coalesce(?, checkpoint),
                                state = CASE WHEN ? THEN 'running' ELSE state END, updated_at = {NOW}
                WHERE run_id = ? AND lease_token = ?
                """,
                [(h.progress, h.checkpoint, h.started, h.run_id, h.lease_token) for h in live],
            )
            await db.executemany(
                f"UPDATE attempts SET started_at = coalesce(started_at, {NOW}) WHERE run_id = ? AND lease_token = ?",
                [(h.run_id, h.lease_token) for h in live if h.started],
            )
        return [h.run_id for h in heartbeats if (h.run_id, h.lease_token) not in current]

    async def record_results(self, results: Sequence[AttemptResult]) -> list[ResultOutcome]:
        if not results:
            return []
        successes, others = common.successes_first(results)
        async with self._transaction() as db:
            # Successes of current attempts set-wise (see common.successes_first). This is the
            # only writer, so the tokens read here are still current at the update.
            current = {
                (row["run_id"], row["lease_token"])
                for row in await _all(
                    db,
                    "SELECT run_id, lease_token FROM runs WHERE run_id IN (SELECT value FROM json_each(?)) "
                    "AND state IN ('dispatched', 'running')",
                    (_json_list({r.run_id for r in successes}),),
                )
            } if successes else set()
            applied = [r for r in successes if (r.run_id, r.lease_token) in current]
            succeeded = await _all(
                db,
                f"""
                UPDATE runs SET state = 'succeeded', finished_at = {NOW}, last_error = NULL, lease_token = NULL,
                                lease_expires_at = NULL, updated_at = {NOW}
                WHERE run_id IN (SELECT value FROM json_each(?))
                RETURNING *
                """,
                (_json_list(r.run_id for r in applied),),
            ) if applied else []
            await db.executemany(
                f"UPDATE attempts SET outcome = 'succeeded', error_code = ?, error_message = ?, "
                f"started_at = coalesce(?, started_at), finished_at = coalesce(?, {NOW}) "
                "WHERE run_id = ? AND lease_token = ?",
                [(r.error_code, r.error_message, _instant(r.started_at), _instant(r.finished_at), r.run_id,
                  r.lease_token) for r in applied],
            )
            outcomes = [ResultOutcome(row=row, accepted=True) for row in succeeded]
            released = await _release_buffered(db, {row["job_id"] for row in succeeded})
            outcomes += [ResultOutcome(run=run, accepted=True, released=True) for run in released]
            rest = [r for r in successes if (r.run_id, r.lease_token) not in current] + others
            if rest:
                rows = await _all(
                    db,
                    "SELECT * FROM runs WHERE run_id IN (SELECT value FROM json_each(?))",
                    (_json_list({r.run_id for r in rest}),),
                )
                now = from_micros(await _value(db, f"SELECT {NOW}"))
                runs = {row["run_id"]: codec.build_run(row) for row in rows}
                outcomes += await self._apply_results(db, runs, rest, now)
            return outcomes

    async def _apply_results(
        self, db: aiosqlite.Connection, runs: dict[str, Run], results: Sequence[AttemptResult], now: datetime
    ) -> list[ResultOutcome]:
        decided = common.decide_results(runs, results, now, self._rng)
        await db.executemany(
            f"UPDATE runs SET state = ?, available_at = ?, finished_at = ?, last_error = ?, lease_token = NULL, "
            f"lease_expires_at = NULL, updated_at = {NOW} WHERE run_id = ?",
            [(run.state.value, to_micros(run.available_at), _instant(run.finished_at), run.last_error, run.run_id)
             for run in decided.runs],
        )
        await db.executemany(
            "UPDATE attempts SET outcome = ?, error_code = ?, error_message = ?, "
            "started_at = coalesce(?, started_at), finished_at = ? WHERE run_id = ? AND lease_token = ? "
            "AND (outcome IN ('pending', 'lease_expired') OR ?1 <> 'superseded')",
            [(u.outcome.value, u.result.error_code, u.result.error_message, _instant(u.result.started_at),
              to_micros(u.finished_at), u.result.run_id, u.result.lease_token) for u in decided.attempts],
        )
        released = await _release_buffered(db, decided.finished_jobs)
        return decided.outcomes + [ResultOutcome(run=run, accepted=True, released=True) for run in released]

    async def get_run(self, tenant: str, run_id: str) -> Run:
        async with self._read() as db:
            row = await _one(db, "SELECT * FROM runs WHERE run_id = ? AND tenant = ?", (run_id, tenant))
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
            before_time, before_id = codec.decode_page_token(page_token, int, str)
        state_list = _json_list(s.value for s in states)
        async with self._read() as db:
            rows = await _all(
                db,
                """
                SELECT * FROM runs
                WHERE tenant = ? AND (? IS NULL OR job_id = ?)
                  AND (json_array_length(?) = 0 OR state IN (SELECT value FROM json_each(?)))
                  AND (? IS NULL OR (scheduled_for, run_id) < (?, ?))
                ORDER BY scheduled_for DESC, run_id DESC LIMIT ?
                """,
                (tenant, job_id, job_id, state_list, state_list, before_time, before_time, before_id,
                 common.page_limit(limit) + 1),
            )
        runs = [codec.build_run(row) for row in rows]
        return common.page_of(runs, limit, lambda run: (to_micros(run.scheduled_for), run.run_id))

    async def list_attempts(self, run_id: str) -> list[Attempt]:
        async with self._read() as db:
            rows = await _all(db, "SELECT * FROM attempts WHERE run_id = ? ORDER BY attempt", (run_id,))
        return [codec.build_attempt(row) for row in rows]

    # -- shards ---------------------------------------------------------------------------------

    async def acquire_shards(
        self, owner: str, ttl: timedelta, *, limit: int, shard_ids: Collection[int] | None = None
    ) -> list[ShardLease]:
        wanted = None if shard_ids is None else _json_list(shard_ids)
        async with self._transaction(urgent=True) as db:
            rows = await _all(
                db,
                f"""
                UPDATE shards SET owner = ?, token = token + 1, lease_expires_at = {NOW} + ?
                WHERE shard_id IN (
                    SELECT shard_id FROM shards
                    WHERE (owner = '' OR lease_expires_at IS NULL OR lease_expires_at <= {NOW})
                      AND (? IS NULL OR shard_id IN (SELECT value FROM json_each(?)))
                    ORDER BY shard_id LIMIT ?
                )
                RETURNING *
                """,
                (owner, common.micros_of_delta(ttl), wanted, wanted, limit),
            )
        return sorted((codec.build_lease(row) for row in rows), key=lambda lease: lease.shard_id)

    async def renew_shards(self, leases: Sequence[ShardLease], ttl: timedelta) -> list[ShardLease]:
        if not leases:
            return []
        async with self._transaction(urgent=True) as db:
            rows = await _all(
                db,
                f"""
                UPDATE shards SET lease_expires_at = {NOW} + ?
                WHERE owner = ? AND lease_expires_at > {NOW}
                  AND (shard_id, token) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                                            FROM json_each(?))
                RETURNING *
                """,
                (common.micros_of_delta(ttl), common.single_owner(leases), _json((lease.shard_id, lease.token) for lease in leases)),
            )
        return sorted((codec.build_lease(row) for row in rows), key=lambda lease: lease.shard_id)

    async def release_shards(self, leases: Sequence[ShardLease]) -> None:
        if not leases:
            return
        async with self._transaction(urgent=True) as db:
            await db.execute(
                """
                UPDATE shards SET owner = '', lease_expires_at = NULL
                WHERE owner = ?
                  AND (shard_id, token) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                                            FROM json_each(?))
                """,
                (common.single_owner(leases), _json((lease.shard_id, lease.token) for lease in leases)),
            )

    async def list_shards(self) -> list[ShardLease]:
        async with self._read() as db:
            rows = await _all(db, "SELECT * FROM shards ORDER BY shard_id", ())
        return [codec.build_lease(row) for row in rows]

    # -- membership -----------------------------------------------------------------------------

    async def heartbeat_node(self, node: NodeInfo, live_within: timedelta) -> list[NodeInfo]:
        async with self._transaction(urgent=True) as db:
            await db.execute(
                f"""
                INSERT INTO nodes (node_id, address, started_at, heartbeat_at, clock_offset_ms, shards_owned,
                                   workers, eligible, note)
                VALUES (?, ?, {NOW}, {NOW}, ?, ?, ?, ?, ?)
                ON CONFLICT (node_id) DO UPDATE
                SET address = excluded.address, heartbeat_at = excluded.heartbeat_at,
                    clock_offset_ms = excluded.clock_offset_ms, shards_owned = excluded.shards_owned,
                    workers = excluded.workers, eligible = excluded.eligible, note = excluded.note
                """,
                (node.node_id, node.address, node.clock_offset_ms, node.shards_owned, node.workers, node.eligible,
                 node.note),
            )
            rows = await _all(
                db, f"SELECT * FROM nodes WHERE heartbeat_at > {NOW} - ? ORDER BY node_id",
                (common.micros_of_delta(live_within),),
            )
        return [codec.build_node(row) for row in rows]

    async def remove_node(self, node_id: str) -> None:
        async with self._transaction(urgent=True) as db:
            await db.execute("DELETE FROM nodes WHERE node_id = ?", (node_id,))

    async def list_nodes(self) -> list[NodeInfo]:
        async with self._read() as db:
            rows = await _all(db, "SELECT * FROM nodes ORDER BY node_id", ())
        return [codec.build_node(row) for row in rows]

    async def watch_changes(self, on_change: Callable[[Change], None]) -> None:
        # One node owns an SQLite database, and it learns of its own changes by direct call.
        await asyncio.Event().wait()


# -- small query helpers -----------------------------------------------------------------------


async def _one(db: aiosqlite.Connection, sql: str, params: Sequence[Any]) -> dict[str, Any] | None:
    async with db.execute(sql, params) as cursor:
        row = await cursor.fetchone()
        # Drain the cursor so a RETURNING statement completes before the transaction ends.
        await cursor.fetchall()
    return None if row is None else _row(row)


async def _all(db: aiosqlite.Connection, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
    async with db.execute(sql, params) as cursor:
        return _rows(await cursor.fetchall())


async def _value(db: aiosqlite.Connection, sql: str, params: Sequence[Any] = ()) -> Any:
    async with db.execute(sql, params) as cursor:
        row = await cursor.fetchone()
    return None if row is None else row[0]


async def _cancel_for_overlap(db: aiosqlite.Connection, plan: common.MaterialisationPlan) -> list[Run]:
    rows = []
    if plan.cancel_now:
        rows += await _all(
            db,
            f"UPDATE runs SET state = 'cancelled', finished_at = {NOW}, updated_at = {NOW}, last_error = ? "
            "WHERE run_id IN (SELECT value FROM json_each(?)) RETURNING *",
            (OVERLAP_CANCELLED, _json_list(plan.cancel_now)),
        )
    if plan.cancel_requested:
        rows += await _all(
            db,
            f"UPDATE runs SET cancel_requested = 1, last_error = ?, updated_at = {NOW} "
            "WHERE run_id IN (SELECT value FROM json_each(?)) RETURNING *",
            (OVERLAP_CANCELLED, _json_list(plan.cancel_requested)),
        )
    return [codec.build_run(row) for row in rows]


async def _release_buffered(db: aiosqlite.Connection, job_ids: Collection[str]) -> list[Run]:
    """Schedule the oldest buffered run of each job that has no other active run left."""
    if not job_ids:
        return []
    rows = await _all(
        db,
        f"""
        UPDATE runs SET state = 'scheduled', available_at = {NOW}, updated_at = {NOW}
        WHERE state = 'buffered' AND job_id IN (SELECT value FROM json_each(?))
          AND scheduled_for = (SELECT min(b.scheduled_for) FROM runs b
                               WHERE b.job_id = runs.job_id AND b.state = 'buffered')
          AND NOT EXISTS (SELECT 1 FROM runs a WHERE a.job_id = runs.job_id
                          AND a.state IN ('scheduled', 'dispatched', 'running'))
        RETURNING *
        """,
        (_json_list(job_ids),),
    )
    return [codec.build_run(row) for row in rows]


async def _check_fence(db: aiosqlite.Connection, fence: ShardLease) -> None:
    if await _value(db, _FENCE, (fence.shard_id, fence.owner, fence.token)) is None:
        raise StaleFence(fence.shard_id, fence.owner, fence.token)


def _json_list(values: Iterable[Any]) -> str:
    return orjson.dumps(list(values)).decode()


def _statements(script: str) -> list[str]:
    """Split a migration into statements (they hold no semicolons inside literals)."""
    lines = [line for line in script.splitlines() if not line.strip().startswith("--")]
    return [statement.strip() for statement in "\n".join(lines).split(";") if statement.strip()]
