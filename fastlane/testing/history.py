"""Old finished runs in a database, a million rows fast, on either backend: what history
retention is tested against (the e2e retention test, and the ``retention`` benchmark scenario).

One real run is made through the store (created, dispatched, finished), and the database copies
it ``count`` times in one statement, each copy with its own id, job, shard and instants, ended
``age`` ago; its attempt likewise. Copying a real row, column by column as the schema has them,
keeps the seed valid whatever later migrations add.

The ``console`` benchmark scenario copies rows the same way on PostgreSQL, with copies of its own making
(:func:`one_finished_run`, :func:`insert_copies`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import aiosqlite
import asyncpg

from fastlane.domain.models import AttemptOutcome, DueJob, JobSpec, Schedule
from fastlane.domain.policies import plan_occurrence
from fastlane.runtime.clock import to_micros
from fastlane.storage import AttemptResult, Dispatch, open_store
from fastlane.storage.base import DEFAULT_SHARD_COUNT as SHARDS

PREFIX = "old-"  # the ids of the copies: counted after the run, to see how many were trimmed
JOBS = 1_000  # the copies belong to this many (made-up) jobs
SEEDER = "history-seeder"
LEASE = timedelta(seconds=30)
JOB_TYPE = "history.template"  # the template run's job: it is never delivered, only copied


async def seed_old_history(url: str, count: int, age: timedelta) -> None:
    """Add ``count`` runs that finished ``age`` ago (and a little more), each with one attempt."""
    template = await one_finished_run(url)
    ended = datetime.now(UTC) - age - timedelta(milliseconds=count)  # the copies end 1 ms apart, the last ``age`` ago
    if url.startswith("sqlite"):
        await _copy_sqlite(url.removeprefix("sqlite:///"), template, count, to_micros(ended))
    else:
        connection = await asyncpg.connect(url)
        try:
            await _copy_postgres(connection, template, count, ended)
        finally:
            await connection.close()


async def count_old_runs(url: str) -> int:
    """How many of the copies are still there."""
    query = f"SELECT count(*) FROM runs WHERE run_id LIKE '{PREFIX}%'"
    if url.startswith("sqlite"):
        async with aiosqlite.connect(url.removeprefix("sqlite:///")) as db, db.execute(query) as cursor:
            row = await cursor.fetchone()
            return int(row[0]) if row else 0
    connection = await asyncpg.connect(url)
    try:
        return int(await connection.fetchval(query))
    finally:
        await connection.close()


async def one_finished_run(url: str) -> str:
    """Make one run through the store, dispatched and succeeded, and return its id: the template
    of the copies. Its job (``old-history-template``, default tenant) stays, completed."""
    store = open_store(url, shard_count=SHARDS)
    try:
        await store.migrate()
        leases = {lease.shard_id: lease for lease in await store.shards.acquire_shards(SEEDER, LEASE, limit=SHARDS)}
        job, _ = await store.jobs.create_job(JobSpec(name="old-history-template", job_type=JOB_TYPE,
                                                schedule=Schedule.at_instant(datetime.now(UTC) - timedelta(days=1))))
        now = await store.db_now()
        [run] = (await store.lane.materialise_runs([leases[job.shard_id]],
                                              [plan_occurrence(DueJob.of(job), now, now)])).runs
        await store.attempts.record_dispatches([Dispatch(run_id=run.run_id, lease_token=1, worker_id=SEEDER, node_id=SEEDER,
                                                lease_ttl=LEASE, dispatched_at=now)])
        await store.attempts.record_results([AttemptResult(run_id=run.run_id, lease_token=1, outcome=AttemptOutcome.SUCCEEDED)])
        await store.shards.release_shards(list(leases.values()))  # the node takes them at once
        return run.run_id
    finally:
        await store.close()


def _overrides(instant: str) -> tuple[dict[str, str], dict[str, str]]:
    """What each copy of the run and of its attempt changes, as SQL over the series' ``n``;
    ``instant``: the dialect's expression for the copy's instant."""
    runs = {"run_id": f"'{PREFIX}' || n", "job_id": f"'{PREFIX}job-' || (n % {JOBS})", "shard_id": f"n % {SHARDS}"}
    runs.update(dict.fromkeys(
        ("scheduled_for", "available_at", "created_at", "updated_at", "first_attempt_at", "finished_at"), instant))
    attempts = {"run_id": f"'{PREFIX}' || n"}
    attempts.update(dict.fromkeys(("dispatched_at", "started_at", "finished_at"), instant))
    return runs, attempts


def _copy_of(columns: list[str], overrides: Mapping[str, str]) -> str:
    return ", ".join(overrides.get(column, f"t.{column}") for column in columns)


async def _copy_postgres(db: asyncpg.Connection, template: str, count: int, ended: datetime) -> None:
    run_overrides, attempt_overrides = _overrides("$3::timestamptz + n * interval '1 millisecond'")
    async with db.transaction():
        await insert_copies(db, "runs", run_overrides, "runs t, generate_series(1, $2::bigint) AS n WHERE t.run_id = $1",
                            template, count, ended)
        await insert_copies(db, "attempts", attempt_overrides,
                            "attempts t, generate_series(1, $2::bigint) AS n WHERE t.run_id = $1", template, count, ended)
    await db.execute("ANALYZE runs")
    await db.execute("ANALYZE attempts")


async def insert_copies(db: asyncpg.Connection, table: str, overrides: Mapping[str, str], source: str,
                        *parameters: object) -> None:
    """PostgreSQL: ``INSERT INTO table SELECT ... FROM source``, where ``source`` (a FROM clause,
    with a WHERE if need be) names the template rows ``t`` and what they are copied over; every
    column is the template's unless ``overrides`` gives an SQL expression for it. The columns are
    read from the database, so a column a later migration adds is copied too."""
    columns = await _postgres_columns(db, table)
    await db.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {_copy_of(columns, overrides)} "
                     f"FROM {source}", *parameters)


async def _postgres_columns(db: asyncpg.Connection, table: str) -> list[str]:
    rows = await db.fetch("SELECT column_name FROM information_schema.columns WHERE table_name = $1 "
                          "ORDER BY ordinal_position", table)
    return [row["column_name"] for row in rows]


async def _copy_sqlite(path: str, template: str, count: int, ended_us: int) -> None:
    run_overrides, attempt_overrides = _overrides(":ended + n * 1000")
    async with aiosqlite.connect(path) as db:
        run_columns, attempt_columns = await _sqlite_columns(db, "runs"), await _sqlite_columns(db, "attempts")
        runs, attempts = _copy_of(run_columns, run_overrides), _copy_of(attempt_columns, attempt_overrides)
        series = "WITH RECURSIVE series(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM series WHERE n < :count) "
        parameters = {"template": template, "count": count, "ended": ended_us}
        await db.execute(f"{series}INSERT INTO runs ({', '.join(run_columns)}) SELECT {runs} "
                         "FROM runs t, series WHERE t.run_id = :template", parameters)
        await db.execute(f"{series}INSERT INTO attempts ({', '.join(attempt_columns)}) SELECT {attempts} "
                         "FROM attempts t, series WHERE t.run_id = :template", parameters)
        await db.commit()


async def _sqlite_columns(db: aiosqlite.Connection, table: str) -> list[str]:
    async with db.execute(f"PRAGMA table_info({table})") as cursor:
        return [row[1] for row in await cursor.fetchall()]
