"""A node's PostgreSQL sessions are a fixed number, whatever its load; a one-shot command's are as
few as it uses."""

from __future__ import annotations

import asyncio

import asyncpg

from fastlane.storage import open_store

POOL = 10  # PostgresStore's pool_size


async def sessions_on(dsn: str) -> int:
    """The sessions open on ``dsn``'s database, this one left out."""
    connection = await asyncpg.connect(dsn)
    try:
        return await connection.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
    finally:
        await connection.close()


async def test_a_nodes_store_opens_its_whole_pool_and_keeps_it_under_load(pg_dsn: str) -> None:
    store = open_store(pg_dsn, node=True)
    try:
        await store.migrate()
        await store.db_now()
        assert await sessions_on(pg_dsn) == POOL
        # More callers than sessions: they queue for the pool; no session is opened beyond it.
        await asyncio.gather(*(store.db_now() for _ in range(50)))
        assert await sessions_on(pg_dsn) == POOL
    finally:
        await store.close()
    assert await sessions_on(pg_dsn) == 0


async def test_a_command_store_opens_only_what_it_uses(pg_dsn: str) -> None:
    store = open_store(pg_dsn)
    try:
        await store.migrate()
        await store.db_now()
        assert await sessions_on(pg_dsn) == 1
    finally:
        await store.close()
