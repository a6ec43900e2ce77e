"""PostgreSQL's fence locks: an open fenced transaction holds off a takeover (which waits for it,
within lock_timeout) but not a renewal. How long such a lock can last is bounded by the session
limits: see test_postgres_bounded_locks.

(SQLite has one writer at a time, so there the question does not arise.)
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest

from fastlane.storage import open_store
from fastlane.storage.store.statements import Statements

_FENCE = Statements.FENCE

pytestmark = pytest.mark.postgres

TTL = timedelta(seconds=30)


@pytest.fixture
async def stores(pg_dsn):
    owner, other = open_store(pg_dsn, shard_count=4), open_store(pg_dsn, shard_count=4)
    await owner.migrate()
    yield owner, other
    await owner.close()
    await other.close()


async def lease_ran_out(dsn: str, shard_id: int, timeout: float = 5.0) -> None:
    """Wait until the shard's lease has expired by the database clock."""
    watcher = await asyncpg.connect(dsn)
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        query = "SELECT lease_expires_at < clock_timestamp() FROM shards WHERE shard_id = $1"
        while not await watcher.fetchval(query, shard_id):
            assert asyncio.get_running_loop().time() < deadline, "the lease never ran out"
            await asyncio.sleep(0.02)
    finally:
        await watcher.close()


async def test_renewal_does_not_wait_for_an_open_fenced_transaction(stores, pg_dsn):
    owner, _ = stores
    [lease] = await owner.shards.acquire_shards("node-a", TTL, limit=1, shard_ids=[2])
    fenced = await asyncpg.connect(pg_dsn)
    try:
        async with fenced.transaction():
            held = await fenced.fetch(_FENCE, [lease.shard_id], [lease.owner], [lease.token])
            assert [row["shard_id"] for row in held] == [2]
            renewed = await asyncio.wait_for(owner.shards.renew_shards([lease], TTL), timeout=5)
            assert [r.shard_id for r in renewed] == [2] and renewed[0].lease_expires_at > lease.lease_expires_at
    finally:
        await fenced.close()


async def test_a_takeover_waits_until_the_fenced_transaction_ends(stores, pg_dsn):
    owner, other = stores
    [lease] = await owner.shards.acquire_shards("node-a", timedelta(milliseconds=300), limit=1, shard_ids=[1])
    fenced = await asyncpg.connect(pg_dsn)
    try:
        transaction = fenced.transaction()
        await transaction.start()
        assert await fenced.fetch(_FENCE, [lease.shard_id], [lease.owner], [lease.token])
        await lease_ran_out(pg_dsn, shard_id=1)  # while the fenced transaction is still open
        # The expired shard is not skipped: the takeover waits for the row (up to lock_timeout)...
        takeover = asyncio.create_task(other.shards.acquire_shards("node-b", TTL, limit=1, shard_ids=[1]))
        await waiting_for_a_lock(pg_dsn)
        assert not takeover.done()
        # ...and gets it once the fenced transaction has committed, not before.
        await transaction.commit()
        [taken] = await asyncio.wait_for(takeover, timeout=5)
        assert taken.owner == "node-b" and taken.token == lease.token + 1
    finally:
        await fenced.close()


async def waiting_for_a_lock(dsn: str, timeout: float = 5.0) -> None:
    """Return once some session waits for a row lock (the takeover, blocked on the fence)."""
    probe = await asyncpg.connect(dsn)
    try:
        async with asyncio.timeout(timeout):
            while not await probe.fetchval("SELECT count(*) FROM pg_locks WHERE NOT granted"):
                await asyncio.sleep(0.01)
    finally:
        await probe.close()
