"""Schema migrations applied to a database that already holds jobs and runs, on both backends.

The database is first migrated only as far as the version before the migration under test and
filled by the store as that version's code wrote it; then the store migrates it the rest of the way.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import aiosqlite
import asyncpg
import pytest

from fastlane.domain.models import DueJob, JobSpec, RunState, Schedule
from fastlane.domain.policies import plan_occurrence
from fastlane.storage import open_store
from fastlane.storage.migrations import migrations_for
from fastlane.storage.postgres import queries as postgres_queries
from fastlane.storage.sqlite import queries as sqlite_queries

SHARDS = 4
TTL = timedelta(seconds=30)
SQLITE_PREFIX = "sqlite:///"

# What version 11's code said when it inserted a job's scheduled runs.
V11_CONFLICT = {
    "postgres": "ON CONFLICT (job_id, scheduled_for) WHERE NOT manual DO NOTHING",
    "sqlite": "ON CONFLICT (job_id, scheduled_for) WHERE manual = 0 DO NOTHING",
}
V12_CONFLICT = "ON CONFLICT (job_id, scheduled_for, (CASE WHEN manual THEN run_id ELSE '' END)) DO NOTHING"


async def run_indexes(db_url: str) -> set[str]:
    if db_url.startswith(SQLITE_PREFIX):
        async with aiosqlite.connect(db_url.removeprefix(SQLITE_PREFIX)) as conn:
            async with conn.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'runs'") as rows:
                return {name for (name,) in await rows.fetchall() if not name.startswith("sqlite_autoindex")}
    conn = await asyncpg.connect(db_url)
    try:
        return {row["indexname"] for row in await conn.fetch("SELECT indexname FROM pg_indexes WHERE tablename = 'runs'")}
    finally:
        await conn.close()


async def materialise(store, leases, job_id: str):
    job = await store.get_job("default", job_id)
    now = await store.db_now()
    return (await store.materialise_runs([leases[job.shard_id]], [plan_occurrence(DueJob.of(job), now, now)])).runs


async def make_due_at(store, job_id: str, at: datetime) -> None:
    """Point the job's schedule at one instant, as a user's update would."""
    current = await store.get_job("default", job_id)
    await store.update_job("default", job_id, replace(current.spec, schedule=Schedule.at_instant(at)))


async def test_version_12_merges_the_run_indexes_of_a_populated_database(db_url, monkeypatch):
    dialect = "sqlite" if db_url.startswith(SQLITE_PREFIX) else "postgres"
    queries = sqlite_queries if dialect == "sqlite" else postgres_queries
    store_module = f"fastlane.storage.{dialect}.store"

    # Version 11, and version 11's insert of scheduled runs.
    monkeypatch.setattr(f"{store_module}.migrations_for", lambda name: migrations_for(name)[:11])
    monkeypatch.setattr(queries, "INSERT_RUNS", queries.INSERT_RUNS.replace(V12_CONFLICT, V11_CONFLICT[dialect]))
    store = open_store(db_url, shard_count=SHARDS)
    try:
        assert await store.migrate() == 11
        leases = {lease.shard_id: lease for lease in await store.acquire_shards("node-a", TTL, limit=SHARDS)}
        job, _ = await store.create_job(JobSpec(name="billing", job_type="billing.run",
                                                schedule=Schedule.interval(timedelta(hours=1))))
        instant = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
        await make_due_at(store, job.job_id, instant)
        [scheduled] = await materialise(store, leases, job.job_id)
        manual = [await store.create_manual_run("default", job.job_id) for _ in range(3)]
        before = [run.run_id for run in (await store.list_runs("default", job_id=job.job_id)).items]
        assert {"runs_one_per_occurrence", "runs_by_job"} <= await run_indexes(db_url)
    finally:
        await store.close()
    monkeypatch.undo()

    store = open_store(db_url, shard_count=SHARDS)
    try:
        assert await store.migrate() == 12
        indexes = await run_indexes(db_url)
        assert "runs_of_job" in indexes and not indexes & {"runs_one_per_occurrence", "runs_by_job"}

        # Every run is still there, listed newest first as before.
        listed = (await store.list_runs("default", job_id=job.job_id)).items
        assert [run.run_id for run in listed] == before
        assert {run.run_id for run in listed} == {scheduled.run_id, *(run.run_id for run in manual)}
        assert [run.scheduled_for for run in listed] == sorted((run.scheduled_for for run in listed), reverse=True)

        # A new instant still writes a run...
        await make_due_at(store, job.job_id, instant + timedelta(seconds=1))
        [later] = await materialise(store, leases, job.job_id)
        assert later.state is RunState.SCHEDULED and later.scheduled_for == instant + timedelta(seconds=1)
        # ...an occurrence already written is still written once (the job pointed back at its
        # instant materialises nothing new), and manual runs still write at any instant.
        await make_due_at(store, job.job_id, instant)
        assert await materialise(store, leases, job.job_id) == []
        await asyncio.gather(*(store.create_manual_run("default", job.job_id) for _ in range(2)))
        assert len((await store.list_runs("default", job_id=job.job_id)).items) == len(before) + 3
    finally:
        await store.close()
