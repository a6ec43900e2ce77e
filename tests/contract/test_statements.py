"""Every statement of the store, in each dialect's SQL, is one its database accepts on the
migrated schema: a translation that went wrong fails here, not on the path that runs it."""

from __future__ import annotations

import re
import sqlite3

import asyncpg
import pytest

from fastlane.storage import open_store
from fastlane.storage.postgres import queries as postgres_queries
from fastlane.storage.sqlite import queries as sqlite_queries
from fastlane.storage.store.statements import Statements, statement_names

PARAMETER = re.compile(r"\?(\d+)")


def test_sqlite_translation_rules() -> None:
    translate = sqlite_queries.translate
    assert translate("SELECT * FROM runs WHERE run_id = ANY($1::text[]) AND tenant = $2 FOR UPDATE") == (
        "SELECT * FROM runs WHERE run_id IN (SELECT value FROM json_each(?1)) AND tenant = ?2"
    )
    assert translate("SELECT clock_timestamp() + $1 * interval '1 microsecond'") == "SELECT fl_now_us() + ?1"
    assert translate("greatest(a, $3::bigint) FOR UPDATE SKIP LOCKED") == "max(a, ?3)"
    assert translate("cardinality($3::text[]) = 0") == "json_array_length(?3) = 0"


def test_a_dialect_statement_overrides_the_translation() -> None:
    assert sqlite_queries.STATEMENTS.FENCE != sqlite_queries.translate(Statements.FENCE)
    assert sqlite_queries.STATEMENTS.GET_RUN == sqlite_queries.translate(Statements.GET_RUN)
    assert postgres_queries.STATEMENTS.GET_RUN == Statements.GET_RUN


async def test_every_sqlite_statement_prepares(sqlite_url) -> None:
    store = open_store(sqlite_url, shard_count=4)
    await store.migrate()
    await store.close()
    connection = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    connection.create_function("fl_now_us", 0, lambda: 0)
    refused = {}
    try:
        for name in statement_names():
            sql = getattr(sqlite_queries.STATEMENTS, name)
            count = max((int(n) for n in PARAMETER.findall(sql)), default=0)
            try:
                connection.execute(f"EXPLAIN {sql}", [None] * count)
            except sqlite3.Error as error:
                refused[name] = str(error)
    finally:
        connection.close()
    assert refused == {}


@pytest.mark.postgres
async def test_every_postgres_statement_prepares(pg_dsn) -> None:
    store = open_store(pg_dsn, shard_count=4)
    await store.migrate()
    await store.close()
    connection = await asyncpg.connect(pg_dsn)
    refused = {}
    try:
        for name in statement_names():
            try:
                await connection.prepare(getattr(postgres_queries.STATEMENTS, name))
            except asyncpg.PostgresError as error:
                refused[name] = str(error)
    finally:
        await connection.close()
    assert refused == {}
