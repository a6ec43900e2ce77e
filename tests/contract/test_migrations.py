"""Schema migrations applied to a database that already holds jobs and runs, on both backends.

The database is first migrated only as far as version 11 and filled by the store as that
version's code wrote it (runs waiting, in flight and ended); then the store migrates it the rest
of the way (12: one index of a job's runs; 13: the indexes of unfinished runs partial on
``finished_at``), and every run must still be found where it was.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import aiosqlite
import asyncpg
import pytest
from old_schemas import read_without_later_columns

from fastlane.domain.models import DueJob, JobSpec, RunState, Schedule
from fastlane.domain.policies import plan_occurrence
from fastlane.storage import Dispatch, open_store
from fastlane.storage.migrations import migrations_for
from fastlane.storage.postgres import queries as postgres_queries
from fastlane.storage.sqlite import queries as sqlite_queries

SHARDS = 4
TTL = timedelta(seconds=30)
SHORT_LEASE = timedelta(milliseconds=300)  # an attempt whose worker is gone: its lease runs out
WAIT = 10.0
V11_INDEXES = {"runs_one_per_occurrence", "runs_by_job", "runs_pending", "runs_leased", "runs_active_by_job",
               "runs_waiting_by_tenant", "runs_active_by_key"}
LATEST_INDEXES = {"runs_of_job", "runs_unfinished_by_shard", "runs_unfinished_by_job", "runs_unfinished_by_tenant",
                  "runs_unfinished_by_key", "runs_by_tenant", "runs_finished"}
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
    job = await store.jobs.get_job("default", job_id)
    now = await store.db_now()
    return (await store.lane.materialise_runs([leases[job.shard_id]], [plan_occurrence(DueJob.of(job), now, now)])).runs


async def make_due_at(store, job_id: str, at: datetime) -> None:
    """Point the job's schedule at one instant, as a user's update would."""
    current = await store.jobs.get_job("default", job_id)
    await store.jobs.update_job("default", job_id, replace(current.spec, schedule=Schedule.at_instant(at)))


async def test_a_populated_version_11_database_migrates_with_every_run_where_it_was(db_url, make_store, monkeypatch):
    dialect = "sqlite" if db_url.startswith(SQLITE_PREFIX) else "postgres"
    statements = (sqlite_queries if dialect == "sqlite" else postgres_queries).STATEMENTS
    store_module = "fastlane.storage.store"

    # Version 11, and version 11's insert of scheduled runs.
    monkeypatch.setattr(f"{store_module}.migrations_for", lambda name: migrations_for(name)[:11])
    read_without_later_columns(monkeypatch)
    monkeypatch.setattr(statements, "INSERT_RUNS", statements.INSERT_RUNS.replace(V12_CONFLICT, V11_CONFLICT[dialect]))
    store = make_store(shard_count=SHARDS)
    try:
        assert await store.migrate() == 11
        leases = {lease.shard_id: lease for lease in await store.shards.acquire_shards("node-a", TTL, limit=SHARDS)}
        job, _ = await store.jobs.create_job(JobSpec(name="billing", job_type="billing.run",
                                                schedule=Schedule.interval(timedelta(hours=1))))
        instant = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
        await make_due_at(store, job.job_id, instant)
        [scheduled] = await materialise(store, leases, job.job_id)
        manual = [await store.runs.create_manual_run("default", job.job_id) for _ in range(3)]
        in_flight, ended, waiting = manual
        await store.attempts.record_dispatches([Dispatch(run_id=in_flight.run_id, lease_token=7, worker_id="w1", node_id="n1",
                                                lease_ttl=SHORT_LEASE, dispatched_at=await store.db_now())])
        await store.runs.cancel_run("default", ended.run_id)
        before = [run.run_id for run in (await store.runs.list_runs("default", job_id=job.job_id)).items]
        assert V11_INDEXES <= await run_indexes(db_url)
    finally:
        await store.close()
    monkeypatch.undo()

    store = make_store(shard_count=SHARDS)
    try:
        assert await store.migrate() == len(migrations_for(dialect))
        indexes = await run_indexes(db_url)
        assert LATEST_INDEXES <= indexes and not indexes & V11_INDEXES

        # Every run is still there, listed newest first as before.
        listed = (await store.runs.list_runs("default", job_id=job.job_id)).items
        assert [run.run_id for run in listed] == before
        assert {run.run_id for run in listed} == {scheduled.run_id, *(run.run_id for run in manual)}
        assert [run.scheduled_for for run in listed] == sorted((run.scheduled_for for run in listed), reverse=True)

        # Waiting runs are still found by the lane's pending scan, the one in flight by the
        # lease scan once its lease is out, and the ended one by neither.
        far = datetime.now(UTC) + timedelta(days=1)
        pending = await store.lane.pending_runs(range(SHARDS), far)
        assert {run.run_id for run in pending} == {scheduled.run_id, waiting.run_id}
        shard = job.shard_id
        deadline = asyncio.get_running_loop().time() + WAIT
        while shard not in await store.lane.shards_with_expired_leases(range(SHARDS)):
            assert asyncio.get_running_loop().time() < deadline, "the in-flight run's lease never expired"
            await asyncio.sleep(0.05)
        assert (await store.lane.next_lease_expiry(range(SHARDS))) < timedelta(0)
        requeued = await store.lane.requeue_expired(leases[shard])
        assert [run.run_id for run in requeued] == [in_flight.run_id]  # retried per its policy
        assert await store.lane.shards_with_expired_leases(range(SHARDS)) == []

        # A new instant still writes a run...
        await make_due_at(store, job.job_id, instant + timedelta(seconds=1))
        [later] = await materialise(store, leases, job.job_id)
        assert later.state is RunState.SCHEDULED and later.scheduled_for == instant + timedelta(seconds=1)
        # ...an occurrence already written is still written once (the job pointed back at its
        # instant materialises nothing new), and manual runs still write at any instant.
        await make_due_at(store, job.job_id, instant)
        assert await materialise(store, leases, job.job_id) == []
        await asyncio.gather(*(store.runs.create_manual_run("default", job.job_id) for _ in range(2)))
        assert len((await store.runs.list_runs("default", job_id=job.job_id)).items) == len(before) + 3
    finally:
        await store.close()


@pytest.mark.postgres
async def test_dispatch_start_and_lease_renewal_of_a_run_are_heap_only_updates(pg_dsn):
    # Schema 13's point: none of these changes an indexed column (nor one in an index's
    # predicate), so with room on the page PostgreSQL rewrites the row in place and adds no index
    # entry. Each statement runs in a transaction of its own, where its counts are visible.
    store = open_store(pg_dsn, shard_count=SHARDS)
    reader = await asyncpg.connect(pg_dsn)
    try:
        await store.migrate()
        job, _ = await store.jobs.create_job(JobSpec(name="hot", job_type="t", schedule=Schedule.interval(timedelta(hours=1))))
        run = await store.runs.create_manual_run("default", job.job_id)
        # Counts not yet flushed to the statistics: compared before and after each statement.
        counts = ("SELECT pg_stat_get_xact_tuples_updated('runs'::regclass), "
                  "pg_stat_get_xact_tuples_hot_updated('runs'::regclass)")

        async def updates_of(statement: str, *args) -> tuple[int, int]:
            async with reader.transaction():
                updated, hot = await reader.fetchrow(counts)
                assert len(await reader.fetch(statement, *args)) == 1
                updated_after, hot_after = await reader.fetchrow(counts)
            return updated_after - updated, hot_after - hot

        dispatch = await updates_of(postgres_queries.DISPATCH_RUNS, [run.run_id], [5], ["w"], ["n"], [30_000_000],
                                    [datetime.now(UTC)])
        start = await updates_of(postgres_queries.EXTEND_LEASES, [run.run_id], [5], [None], [None], [True])
        renewal = await updates_of(postgres_queries.EXTEND_LEASES, [run.run_id], [5], [None], [None], [False])
        assert dispatch == start == renewal == (1, 1)  # one row updated, heap-only
        assert (await store.runs.get_run("default", run.run_id)).state is RunState.RUNNING
    finally:
        await reader.close()
        await store.close()
