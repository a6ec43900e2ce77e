"""Smoke tests for the PostgreSQL test infrastructure (bench/pgcluster.py, tests/conftest.py)."""

from __future__ import annotations

import asyncpg
import pytest

from fastlane.testing.postgres import DURABLE_SETTINGS, FAST_SETTINGS, ThrowawayPostgres

pytestmark = pytest.mark.postgres

_seen_databases: set[str] = set()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_db_url_postgres_connects(db_url):
    conn = await asyncpg.connect(db_url)
    try:
        assert await conn.fetchval("select 1") == 1
        assert int(await conn.fetchval("select current_setting('server_version_num')")) >= 150000
    finally:
        await conn.close()


@pytest.mark.parametrize("run", [1, 2])
async def test_pg_dsn_is_a_fresh_empty_database(pg_dsn, run):
    conn = await asyncpg.connect(pg_dsn)
    try:
        name = await conn.fetchval("select current_database()")
        assert name.startswith("fl_test_")
        assert name not in _seen_databases
        _seen_databases.add(name)
        user_tables = await conn.fetchval(
            "select count(*) from pg_catalog.pg_tables"
            " where schemaname not in ('pg_catalog', 'information_schema')"
        )
        assert user_tables == 0
        # Left behind on purpose: the other run must not see it.
        await conn.execute("create table leftover (id int)")
    finally:
        await conn.close()


async def _durability(dsn: str) -> dict[str, str]:
    conn = await asyncpg.connect(dsn)
    try:
        return {name: await conn.fetchval(f"SHOW {name}") for name in FAST_SETTINGS}
    finally:
        await conn.close()


async def test_a_throwaway_cluster_runs_fast_by_default_and_durable_when_asked() -> None:
    with ThrowawayPostgres() as fast:
        assert fast.dsn is not None
        assert await _durability(fast.dsn) == FAST_SETTINGS == fast.durability
    with ThrowawayPostgres(settings=DURABLE_SETTINGS) as durable:
        assert durable.dsn is not None
        assert await _durability(durable.dsn) == DURABLE_SETTINGS == durable.durability
