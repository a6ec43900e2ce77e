"""Database faults reach the engine as StorageUnavailable (retryable) or StorageError (permanent),
never as a driver exception, and the stores recover from them by themselves."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from datetime import timedelta

import asyncpg
import pytest

from fastlane.domain.errors import StorageError, StorageUnavailable
from fastlane.domain.models import JobSpec, Schedule
from fastlane.storage import Change
from fastlane.storage.postgres import PostgresStore
from fastlane.storage.sqlite import SQLiteStore
from fastlane.testing import until

TTL = timedelta(seconds=30)


@pytest.fixture
async def postgres_store(pg_dsn):  # type: ignore[no-untyped-def]
    store = PostgresStore(pg_dsn, shard_count=4)
    await store.migrate()
    try:
        yield store
    finally:
        await store.close()


@pytest.mark.postgres
async def test_a_connection_killed_inside_a_transaction_is_storage_unavailable(postgres_store, pg_dsn):
    leases = await postgres_store.shards.acquire_shards("node-a", TTL, limit=4)
    admin = await asyncpg.connect(pg_dsn)
    try:
        # How asyncpg reports the killed connection varies (the server's FATAL error, the closed
        # connection, or the transaction's exit on it): a few rounds meet more than one.
        for _ in range(3):
            async with admin.transaction():
                await admin.execute("LOCK TABLE shards IN SHARE MODE")  # the renewal waits inside its transaction
                renewal = asyncio.create_task(postgres_store.shards.renew_shards(leases, TTL))
                waiting = await until(
                    lambda: admin.fetchval("SELECT pid FROM pg_locks WHERE NOT granted LIMIT 1"), 10,
                    "the renewal to wait on the lock",
                )
                await admin.execute("SELECT pg_terminate_backend($1)", waiting)
                with pytest.raises(StorageUnavailable) as raised:
                    await renewal
            assert isinstance(raised.value.__cause__, asyncpg.PostgresError | asyncpg.InterfaceError)
            # The pool replaces the dead connection: the next call works.
            leases = await postgres_store.shards.renew_shards(leases, TTL)
            assert len(leases) == 4
    finally:
        await admin.close()


@pytest.mark.postgres
async def test_a_statement_error_is_a_permanent_storage_error(postgres_store):
    with pytest.raises(StorageError) as raised:
        async with postgres_store.database._connection() as db:
            await db.execute("SELECT * FROM no_such_table")
    assert not isinstance(raised.value, StorageUnavailable)
    assert isinstance(raised.value.__cause__, asyncpg.UndefinedTableError)


@pytest.mark.postgres
async def test_an_unreachable_server_is_storage_unavailable():
    store = PostgresStore("postgresql://nobody@127.0.0.1:9/fastlane", shard_count=4)  # port 9: discard, closed
    try:
        with pytest.raises(StorageUnavailable) as raised:
            await store.db_now()
        assert isinstance(raised.value.__cause__, OSError)
    finally:
        await store.close()


@pytest.mark.postgres
async def test_the_change_listener_listens_again_at_once_after_its_connection_is_killed(postgres_store, pg_dsn):
    changes: list[Change] = []
    watcher = asyncio.create_task(postgres_store.watch_changes(changes.append))
    admin = await asyncpg.connect(pg_dsn)
    try:
        await until(lambda: any(change.kind == "members" for change in changes), 10, "the listener to start")

        async def listener_pid() -> int | None:
            return await admin.fetchval("SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%'")

        first = await until(listener_pid, 10, "the LISTEN session")
        await admin.execute("SELECT pg_terminate_backend($1)", first)
        # Well within the 10 s liveness ping: the listener learns of the loss from the driver.
        await until(lambda: sum(change.kind == "members" for change in changes) >= 2, 5,
                    "the listener to LISTEN again")
        job, _ = await postgres_store.jobs.create_job(
            JobSpec(name="after-reconnect", job_type="t", schedule=Schedule.interval(timedelta(minutes=1)))
        )
        await until(lambda: any(change.key == job.job_id for change in changes), 5,
                    "a change committed after the reconnection")
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await admin.close()


async def test_sqlite_a_missing_table_is_permanent_and_the_store_goes_on(tmp_path):
    store = SQLiteStore(f"sqlite:///{tmp_path}/faults.db", shard_count=4)
    await store.migrate()
    try:
        with pytest.raises(StorageError) as raised:
            async with store.database._transaction() as db:
                await db.execute("INSERT INTO no_such_table VALUES (1)")
        assert not isinstance(raised.value, StorageUnavailable)
        assert isinstance(raised.value.__cause__, sqlite3.OperationalError)
        # The failed transaction was rolled back: the writer takes the next one.
        assert len(await store.shards.acquire_shards("node-a", TTL, limit=4)) == 4
    finally:
        await store.close()


async def test_sqlite_a_file_that_cannot_be_opened_is_storage_unavailable(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    store = SQLiteStore(f"sqlite:///{blocker}/fastlane.db", shard_count=4)
    try:
        with pytest.raises(StorageUnavailable) as raised:
            await store.migrate()
        assert isinstance(raised.value.__cause__, OSError)
    finally:
        await store.close()
