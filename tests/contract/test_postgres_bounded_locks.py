"""PostgreSQL sessions hold no lock past a shard lease: a frozen owner's shards are taken over
within a lease, its writes after waking are refused, and every wait and statement is bounded,
surfacing as StorageUnavailable (retryable), while migrations run without those bounds.

(SQLite has one writer at a time and no row locks that could outlive a lease: nothing to test
there.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from old_schemas import read_without_later_columns

from fastlane.domain.errors import StaleFence, StorageUnavailable
from fastlane.domain.models import AttemptOutcome, JobSpec, Schedule, ShardLease
from fastlane.storage import AttemptResult, Change, ChangeKind, Dispatch, Store, open_store
from fastlane.storage.migrations import Migration, migrations_for
from fastlane.storage.postgres import PostgresStore
from fastlane.storage.postgres.connection import SessionLimits
from fastlane.storage.postgres.queries import SUCCEED_ATTEMPTS
from fastlane.storage.store.statements import Statements

pytestmark = pytest.mark.postgres

LEASE = timedelta(seconds=3)
LIMITS = SessionLimits.for_lease(LEASE)  # idle in transaction 0.6 s, lock 0.75 s, statement 1.5 s, calls 2.25 s
SETTINGS = ("idle_in_transaction_session_timeout", "lock_timeout", "statement_timeout")


@pytest.fixture
async def stores(pg_dsn: str) -> AsyncIterator[tuple[Store, Store]]:
    """Two nodes' stores on one database, both with the session limits of a 3 s lease."""
    owner = open_store(pg_dsn, shard_count=4, lease_ttl=LEASE)
    other = open_store(pg_dsn, shard_count=4, lease_ttl=LEASE)
    await owner.migrate()
    yield owner, other
    await owner.close()
    await other.close()


def postgres(store: Store) -> PostgresStore:
    assert isinstance(store, PostgresStore)
    return store


async def seconds_left(store: Store, lease: ShardLease) -> float:
    """How long ``lease`` has left by the database clock."""
    assert lease.lease_expires_at is not None
    return (lease.lease_expires_at - await store.db_now()).total_seconds()


async def lease_ran_out(store: Store, lease: ShardLease) -> None:
    """Return once ``lease`` has expired by the database clock."""
    while await seconds_left(store, lease) >= 0:
        await asyncio.sleep(0.01)


def test_the_limits_sit_well_under_the_lease() -> None:
    limits = SessionLimits.for_lease(timedelta(seconds=10))
    assert limits.server_settings() == {
        "idle_in_transaction_session_timeout": "2000",
        "lock_timeout": "2500",
        "statement_timeout": "5000",
    }
    # A takeover waiting for a frozen owner's lock outlasts the frozen session; a frozen node's
    # locks die within a lease even if it froze mid-statement.
    assert limits.idle_in_transaction < limits.lock_wait < timedelta(seconds=10) / 3
    assert limits.statement + limits.idle_in_transaction < timedelta(seconds=10)
    assert limits.statement < limits.call < timedelta(seconds=10)


async def test_a_frozen_owners_shard_is_taken_over_within_a_lease(stores: tuple[Store, Store]) -> None:
    owner, other = stores
    [lease] = await owner.shards.acquire_shards("node-a", LEASE, limit=1, shard_ids=[1])
    # Freeze at the worst moment, just before the lease runs out: the lease then expires while
    # the frozen transaction still holds the row, so a takeover that skipped locked rows would
    # find nothing to take.
    await asyncio.sleep(max(0.0, await seconds_left(owner, lease) - 0.3))
    taken: list[ShardLease] = []
    with pytest.raises(StorageUnavailable) as woke:
        # A connection of the owner's own pool: the session settings a node really has.
        async with postgres(owner).database._connection() as frozen:
            await frozen.execute("BEGIN")
            # The lock materialise_runs and requeue_expired hold until they commit.
            assert await frozen.fetch(Statements.FENCE, [1], ["node-a"], [lease.token])
            frozen_at = time.monotonic()
            await lease_ran_out(other, lease)
            expired_at = time.monotonic()
            taken = await other.shards.acquire_shards("node-b", LEASE, limit=1, shard_ids=[1])  # one call
            taken_at = time.monotonic()
            # Woken up, the owner finds its transaction gone: the server ended the session.
            await frozen.fetchval("SELECT 1")
    print(
        f"\nfrozen owner: lease expired {expired_at - frozen_at:.3f} s into the freeze; "
        f"shard taken over {taken_at - frozen_at:.3f} s into it, {taken_at - expired_at:.3f} s after expiry"
    )
    assert [(t.shard_id, t.owner, t.token) for t in taken] == [(1, "node-b", lease.token + 1)]
    # Within a lease (plus a second) of the freeze, and so of the expiry.
    assert taken_at - frozen_at <= LEASE.total_seconds() + 1
    # (What asyncpg raises on a connection the server closed while it was idle varies: the
    # server's FATAL error, the closed connection, or a protocol state error on it.)
    assert isinstance(
        woke.value.__cause__, asyncpg.PostgresError | asyncpg.InterfaceError | asyncpg.InternalClientError
    )
    # And a fenced write with its old token, on a new connection, is refused.
    with pytest.raises(StaleFence):
        await owner.lane.requeue_expired(lease)
    with pytest.raises(StaleFence):
        await owner.lane.materialise_runs([lease], [])


async def test_a_takeover_that_cannot_get_the_row_in_time_leaves_it_to_the_next_cycle(
    stores: tuple[Store, Store], pg_dsn: str
) -> None:
    owner, other = stores
    [held, free] = await owner.shards.acquire_shards("node-a", timedelta(milliseconds=300), limit=2, shard_ids=[1, 2])
    await owner.shards.release_shards([free])
    # A session without the limits (another client, say) keeps the expired shard's row locked.
    stubborn = await asyncpg.connect(pg_dsn)
    try:
        async with stubborn.transaction():
            assert await stubborn.fetch(Statements.FENCE, [1], ["node-a"], [held.token])
            await lease_ran_out(other, held)
            started = time.monotonic()
            taken = await other.shards.acquire_shards("node-b", LEASE, limit=2, shard_ids=[1, 2])
            waited = time.monotonic() - started
            # The free shard is taken; the locked one is left, without an error, once
            # lock_timeout has run out.
            assert [t.shard_id for t in taken] == [2]
            assert LIMITS.lock_wait.total_seconds() * 0.9 <= waited < LIMITS.call_seconds
        [taken_later] = await other.shards.acquire_shards("node-b", LEASE, limit=1, shard_ids=[1])
        assert taken_later.token == held.token + 1
    finally:
        await stubborn.close()


async def test_a_statement_longer_than_statement_timeout_is_storage_unavailable(stores: tuple[Store, Store]) -> None:
    owner, _ = stores
    started = time.monotonic()
    with pytest.raises(StorageUnavailable) as raised:
        async with postgres(owner).database._connection() as db:
            await db.execute(f"SELECT pg_sleep({LIMITS.statement.total_seconds() + 1})")
    assert isinstance(raised.value.__cause__, asyncpg.exceptions.QueryCanceledError)
    assert time.monotonic() - started < LIMITS.call_seconds


async def test_a_lock_wait_longer_than_lock_timeout_is_storage_unavailable(
    stores: tuple[Store, Store], pg_dsn: str
) -> None:
    owner, _ = stores
    job, _ = await owner.jobs.create_job(
        JobSpec(name="locked", job_type="t", schedule=Schedule.interval(timedelta(hours=1)))
    )
    holder = await asyncpg.connect(pg_dsn)
    try:
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM jobs WHERE job_id = $1 FOR UPDATE", job.job_id)
            started = time.monotonic()
            with pytest.raises(StorageUnavailable) as raised:
                await owner.jobs.pause_job(job.tenant, job.job_id)
            waited = time.monotonic() - started
    finally:
        await holder.close()
    assert isinstance(raised.value.__cause__, asyncpg.exceptions.LockNotAvailableError)
    assert LIMITS.lock_wait.total_seconds() * 0.9 <= waited < LIMITS.call_seconds


async def test_waiting_for_a_pooled_connection_is_bounded_and_storage_unavailable(pg_dsn: str) -> None:
    store = PostgresStore(pg_dsn, shard_count=4, pool_size=1, lease_ttl=LEASE)
    try:
        await store.migrate()
        async with store.database._connection():  # the only connection, lent out
            started = time.monotonic()
            with pytest.raises(StorageUnavailable) as raised:
                await store.db_now()
            waited = time.monotonic() - started
        assert isinstance(raised.value.__cause__, TimeoutError)
        assert LIMITS.call_seconds * 0.9 <= waited < LIMITS.call_seconds + 1
        await store.db_now()  # and the pool goes on
    finally:
        await store.close()


async def test_migrations_run_without_the_statement_and_lock_limits(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = timedelta(seconds=1)  # statement_timeout 0.5 s, lock_timeout 0.25 s, asyncpg's timeout 0.75 s
    limits = SessionLimits.for_lease(lease)
    real = migrations_for("postgres")
    key = 4242
    slow = [
        # Longer than statement_timeout and than the pool's command_timeout.
        Migration(len(real) + 1, "slow", f"SELECT pg_sleep({limits.call_seconds + 0.25})"),
        # Waits for a lock longer than lock_timeout.
        Migration(len(real) + 2, "waits", f"SELECT pg_advisory_xact_lock({key})"),
    ]
    monkeypatch.setattr("fastlane.storage.store.migrations_for", lambda dialect: real + slow)
    store = PostgresStore(pg_dsn, shard_count=4, lease_ttl=lease)
    holder = await asyncpg.connect(pg_dsn)
    try:
        await holder.execute("SELECT pg_advisory_lock($1)", key)
        migrating = asyncio.create_task(store.migrate())
        async with asyncio.timeout(10):
            while not await holder.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ):
                await asyncio.sleep(0.01)
        await asyncio.sleep(limits.lock_wait.total_seconds() * 3)
        assert not migrating.done()
        await holder.execute("SELECT pg_advisory_unlock($1)", key)
        assert await asyncio.wait_for(migrating, 10) == len(real) + 2
        # The pool's sessions keep their limits.
        async with store.database._connection() as db:
            assert await db.fetchval("SHOW statement_timeout") == "500ms"
    finally:
        await holder.close()
        await store.close()


async def test_every_pooled_connection_carries_the_session_limits(pg_dsn: str) -> None:
    store = PostgresStore(pg_dsn, shard_count=4, pool_size=1, lease_ttl=LEASE)
    query = "SELECT name, setting FROM pg_settings WHERE name = ANY($1::text[]) ORDER BY name"
    expected = {"idle_in_transaction_session_timeout": "600", "lock_timeout": "750", "statement_timeout": "1500"}
    try:
        async with store.database._connection() as db:
            first_pid = await db.fetchval("SELECT pg_backend_pid()")
            assert dict(await db.fetch(query, list(SETTINGS))) == expected
            await db.execute("SET statement_timeout = 0")  # as careless code might
        # The pool resets a connection it gets back (RESET ALL): the limits come back with it,
        # as they are the session's own defaults, set when it connected.
        async with store.database._connection() as db:
            assert await db.fetchval("SELECT pg_backend_pid()") == first_pid
            assert dict(await db.fetch(query, list(SETTINGS))) == expected
    finally:
        await store.close()


async def test_a_pooled_connection_prepares_its_statements_again_after_their_lifetime(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan made while the tables were nearly empty (a new database) does not stay: a connection
    prepares a statement again once STATEMENT_LIFETIME has passed, and PostgreSQL plans it anew."""
    monkeypatch.setattr("fastlane.storage.postgres.connection.STATEMENT_LIFETIME", timedelta(seconds=1))
    store = PostgresStore(pg_dsn, shard_count=4, pool_size=1, lease_ttl=LEASE)
    query = "SELECT $1::integer + 1"
    prepared_as = "SELECT name FROM pg_prepared_statements WHERE statement = $1"
    try:
        async with store.database._connection() as db:
            assert await db.fetchval(query, 1) == 2
            (first,) = [row["name"] for row in await db.fetch(prepared_as, query)]
        deadline = time.monotonic() + 10
        while True:
            async with store.database._connection() as db:
                assert await db.fetchval(query, 1) == 2
                names = {row["name"] for row in await db.fetch(prepared_as, query)}
            if names and first not in names:  # (between the old one's close and the new prepare: none)
                break
            assert time.monotonic() < deadline, f"{first} was still the statement's only preparation after 10 s"
            await asyncio.sleep(0.1)
        assert len(names) == 1  # prepared again, under another name, and the old one closed
    finally:
        await store.close()


async def test_the_change_listener_outlives_the_idle_in_transaction_timeout(pg_dsn: str) -> None:
    lease = timedelta(seconds=1)  # idle_in_transaction_session_timeout 0.2 s
    store = PostgresStore(pg_dsn, shard_count=4, lease_ttl=lease)
    changes: list[Change] = []
    await store.migrate()
    watcher = asyncio.create_task(store.watch_changes(changes.append))
    try:
        async with asyncio.timeout(10):
            while not changes:
                await asyncio.sleep(0.01)
        await asyncio.sleep(SessionLimits.for_lease(lease).idle_in_transaction.total_seconds() * 5)
        job, _ = await store.jobs.create_job(
            JobSpec(name="heard", job_type="t", schedule=Schedule.interval(timedelta(hours=1)))
        )
        async with asyncio.timeout(5):
            while not any(change.key == job.job_id for change in changes):
                await asyncio.sleep(0.01)
        # One MEMBERS change, on listening: no reconnection since.
        assert sum(change.kind == ChangeKind.MEMBERS for change in changes) == 1
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await store.close()


async def test_a_populated_database_migrates_to_vacuuming_its_churning_tables_often(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 10 sets runs, attempts and jobs to be vacuumed and analysed after a fiftieth of
    their rows change (PostgreSQL's defaults wait for a fifth and a tenth), also on a database
    that already holds jobs and runs."""
    store = open_store(pg_dsn, shard_count=4)
    monkeypatch.setattr("fastlane.storage.store.migrations_for", lambda dialect: migrations_for(dialect)[:9])
    read_without_later_columns(monkeypatch)
    reader = await asyncpg.connect(pg_dsn)
    try:
        assert await store.migrate() == 9
        job, _ = await store.jobs.create_job(JobSpec(name="old", job_type="t", schedule=Schedule.cron_expr("* * * * *")))
        await store.runs.create_manual_run("default", job.job_id)
        monkeypatch.setattr("fastlane.storage.store.migrations_for", lambda dialect: migrations_for(dialect)[:10])
        assert await store.migrate() == 10
        options = {row["relname"]: set(row["reloptions"] or ()) for row in await reader.fetch(
            "SELECT relname, reloptions FROM pg_class WHERE relname IN ('runs', 'attempts', 'jobs')")}
        assert options["runs"] == options["attempts"] == {
            "autovacuum_vacuum_scale_factor=0.02", "autovacuum_analyze_scale_factor=0.02",
            "autovacuum_vacuum_insert_scale_factor=0.02"}
        assert options["jobs"] == {"autovacuum_vacuum_scale_factor=0.02", "autovacuum_analyze_scale_factor=0.02"}
        assert len((await store.runs.list_runs("default", job_id=job.job_id)).items) == 1
    finally:
        await reader.close()
        await store.close()


async def test_a_populated_database_migrates_to_attempts_with_one_index(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Version 11 drops attempts_by_token (it duplicated the primary key), on a database with
    attempts in flight; a result then finds its attempt by the primary key, and its update (no
    indexed column changed, room in the page) is heap-only."""
    store = open_store(pg_dsn, shard_count=4)
    monkeypatch.setattr("fastlane.storage.store.migrations_for", lambda dialect: migrations_for(dialect)[:10])
    read_without_later_columns(monkeypatch)
    reader = await asyncpg.connect(pg_dsn)
    try:
        assert await store.migrate() == 10
        leases = {lease.shard_id: lease for lease in await store.shards.acquire_shards("node-a", timedelta(seconds=30), limit=4)}
        job, _ = await store.jobs.create_job(JobSpec(name="old", job_type="t", schedule=Schedule.cron_expr("* * * * *")))
        run = await store.runs.create_manual_run("default", job.job_id)
        (attempt,) = await store.attempts.record_dispatches([Dispatch(
            run_id=run.run_id, lease_token=77, worker_id="w", node_id="node-a", lease_ttl=timedelta(seconds=30),
            dispatched_at=datetime.now(UTC))])
        assert leases and attempt.lease_token == 77
        monkeypatch.setattr("fastlane.storage.store.migrations_for", lambda dialect: migrations_for(dialect)[:11])
        assert await store.migrate() == 11
        indexes = {row["indexname"] for row in await reader.fetch("SELECT indexname FROM pg_indexes WHERE tablename = 'attempts'")}
        assert indexes == {"attempts_pkey"}
        async with reader.transaction():  # the result's own statement; its counts are visible inside
            await reader.execute(SUCCEED_ATTEMPTS, [run.run_id], [1], [77], [None], [None], [None], [None])
            assert await reader.fetchval("SELECT pg_stat_get_xact_tuples_hot_updated('attempts'::regclass)") == 1
        (outcome,) = await store.attempts.record_results([AttemptResult(run_id=run.run_id, lease_token=77,
                                                               outcome=AttemptOutcome.SUCCEEDED)])
        assert outcome.accepted
        (stored,) = await store.runs.list_attempts(run.run_id)
        assert stored.outcome is AttemptOutcome.SUCCEEDED and stored.lease_token == 77
    finally:
        await reader.close()
        await store.close()


async def test_a_current_attempts_success_is_found_by_its_primary_key(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attempt of a result for the run's current lease is the run's count of attempts: the
    update by primary key finds it, and the update by token (for attempts a late report numbered
    past) is not needed. (Its use is covered by tests/contract/test_late_reports.py.)"""
    store = open_store(pg_dsn, shard_count=4)
    try:
        await store.migrate()
        await store.shards.acquire_shards("node-a", timedelta(seconds=30), limit=4)
        job, _ = await store.jobs.create_job(JobSpec(name="j", job_type="t", schedule=Schedule.cron_expr("* * * * *")))
        run = await store.runs.create_manual_run("default", job.job_id)
        for token in (7, 8):  # two attempts: the second is the one that succeeds
            await store.attempts.record_dispatches([Dispatch(run_id=run.run_id, lease_token=token, worker_id="w",
                                                    node_id="node-a", lease_ttl=timedelta(seconds=30),
                                                    dispatched_at=datetime.now(UTC))])
            if token == 7:
                await store.attempts.record_results([AttemptResult(run_id=run.run_id, lease_token=7,
                                                          outcome=AttemptOutcome.FAILED)])
        monkeypatch.setattr("fastlane.storage.postgres.queries.SUCCEED_ATTEMPTS_BY_TOKEN", "SELECT 1 / 0")
        (outcome,) = await store.attempts.record_results([AttemptResult(run_id=run.run_id, lease_token=8,
                                                               outcome=AttemptOutcome.SUCCEEDED)])
        assert outcome.accepted
        attempts = await store.runs.list_attempts(run.run_id)
        assert [(a.attempt, a.lease_token, a.outcome) for a in attempts] == [
            (1, 7, AttemptOutcome.FAILED), (2, 8, AttemptOutcome.SUCCEEDED)]
    finally:
        await store.close()
