"""apply_once on both backends: one effect per key, atomic with its ledger row, also across a crash.

Each test gets the user's own table ``effects (note)``; an effect's write is a row in it. The crash
tests kill a real worker process with SIGKILL, once after its effect committed (before it could
report the run) and once inside the effect, before the commit.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiosqlite
import asyncpg
import pytest

from fastlane.testing.processes import ROOT, child_environment
from fastlane.worker.effects import DEFAULT_TABLE, apply_once, apply_once_for, ensure_ledger

WAIT = 10.0  # upper bound for anything that should happen promptly
SQLITE_PREFIX = "sqlite:///"

# A worker that applies the effect for one run and is then killed, as a crash would: either
# after apply_once returned (the run is never reported, so it is redelivered) or inside the effect.
CRASHING_WORKER = """
import asyncio, os, signal, sys

import aiosqlite, asyncpg

from fastlane.worker.effects import apply_once


async def main(db_url: str, key: str, kill_point: str) -> None:
    if db_url.startswith("sqlite:///"):
        conn = await aiosqlite.connect(db_url.removeprefix("sqlite:///"), timeout=10)
    else:
        conn = await asyncpg.connect(db_url, timeout=10)

    async def charge(tx):
        await tx.execute("INSERT INTO effects (note) VALUES ('charged')")
        if kill_point == "inside_effect":
            os.kill(os.getpid(), signal.SIGKILL)

    result = await apply_once(conn, key, charge)
    print(f"applied={result.applied}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # before the run's result is reported


asyncio.run(main(*sys.argv[1:]))
"""


# -- helpers -----------------------------------------------------------------------------------


@asynccontextmanager
async def connect(db_url: str, **sqlite_options: Any) -> AsyncIterator[Any]:
    """A plain driver connection, as a user's handler would hold one."""
    if db_url.startswith(SQLITE_PREFIX):
        conn: Any = await aiosqlite.connect(db_url.removeprefix(SQLITE_PREFIX), timeout=WAIT, **sqlite_options)
    else:
        conn = await asyncpg.connect(db_url, timeout=WAIT)
    try:
        yield conn
    finally:
        await conn.close()


async def fetch_all(conn: Any, sql: str) -> list[tuple[Any, ...]]:
    if isinstance(conn, aiosqlite.Connection):
        async with conn.execute(sql) as cursor:
            return [tuple(row) for row in await cursor.fetchall()]
    return [tuple(row) for row in await conn.fetch(sql)]


async def notes(conn: Any) -> list[str]:
    """The user's effect rows."""
    return [note for (note,) in await fetch_all(conn, "SELECT note FROM effects ORDER BY note")]


async def ledger_keys(conn: Any, table: str = DEFAULT_TABLE) -> list[str]:
    return [key for (key,) in await fetch_all(conn, f"SELECT key FROM {table} ORDER BY key")]


def in_transaction(conn: Any) -> bool:
    return conn.in_transaction if isinstance(conn, aiosqlite.Connection) else conn.is_in_transaction()


def record(note: str) -> Callable[[Any], Awaitable[str]]:
    """An effect that writes one row into the user's table and returns its note."""

    async def effect(tx: Any) -> str:
        await tx.execute(f"INSERT INTO effects (note) VALUES ('{note}')")
        return note

    return effect


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Any]:
    """A connection to the test's database, which has the user's table ``effects``."""
    async with connect(db_url) as conn:
        await conn.execute("CREATE TABLE effects (note TEXT NOT NULL)")
        yield conn


# -- once per key ------------------------------------------------------------------------------


async def test_effect_runs_once_per_key(db: Any) -> None:
    first = await apply_once(db, "run-1", record("a"))
    again = await apply_once(db, "run-1", record("b"))
    other = await apply_once(db, "run-2", record("c"))

    assert first.applied and first.value == "a" and first.applied_at is not None
    assert not again.applied and again.value is None
    assert again.applied_at == first.applied_at
    assert other.applied and other.value == "c"
    assert await notes(db) == ["a", "c"]
    assert await ledger_keys(db) == ["run-1", "run-2"]
    assert not in_transaction(db)


async def test_failed_effect_is_rolled_back_and_leaves_the_key_free(db: Any) -> None:
    async def charge_then_fail(tx: Any) -> None:
        await tx.execute("INSERT INTO effects (note) VALUES ('half-done')")
        raise RuntimeError("card declined")

    with pytest.raises(RuntimeError, match="card declined"):
        await apply_once(db, "run-1", charge_then_fail)

    assert not in_transaction(db)
    assert await notes(db) == []
    assert await ledger_keys(db) == []

    retried = await apply_once(db, "run-1", record("charged"))
    assert retried.applied
    assert await notes(db) == ["charged"]


async def test_racing_calls_with_one_key_apply_the_effect_once(db_url: str, db: Any) -> None:
    async def slow_charge(tx: Any) -> str:
        await tx.execute("INSERT INTO effects (note) VALUES ('charged')")
        await asyncio.sleep(0.2)  # hold the transaction open while the other caller claims the key
        return "charged"

    await ensure_ledger(db)
    async with connect(db_url) as first, connect(db_url) as second:
        results = await asyncio.wait_for(
            asyncio.gather(apply_once(first, "run-1", slow_charge), apply_once(second, "run-1", slow_charge)),
            WAIT,
        )

    winner, loser = sorted(results, key=lambda result: not result.applied)
    assert winner.applied and winner.value == "charged"
    assert not loser.applied and loser.applied_at == winner.applied_at
    assert await notes(db) == ["charged"]


async def test_racing_first_uses_both_create_the_ledger_safely(db_url: str, db: Any) -> None:
    async with connect(db_url) as first, connect(db_url) as second:
        results = await asyncio.wait_for(
            asyncio.gather(apply_once(first, "run-1", record("a")), apply_once(second, "run-1", record("a"))),
            WAIT,
        )

    assert sorted(result.applied for result in results) == [False, True]
    assert await notes(db) == ["a"]


async def test_many_connections_creating_ledgers_at_once_all_succeed(db_url: str) -> None:
    # IF NOT EXISTS alone lets racing creators both pass the check; the loser then fails on the
    # table's name or row type. Several fresh ledgers, each raced from several connections.
    racers, ledgers = 6, 5

    async def returns_done(tx: Any) -> str:
        return "done"

    async with AsyncExitStack() as stack:
        connections = [await stack.enter_async_context(connect(db_url)) for _ in range(racers)]
        for number in range(ledgers):
            table = f"raced_ledger_{number}"
            await asyncio.wait_for(asyncio.gather(*(ensure_ledger(conn, table=table) for conn in connections)), WAIT)
            result = await apply_once(connections[0], "key", returns_done, table=table)
            assert result.applied and result.value == "done"


# -- crashes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kill_point", ["after_commit", "inside_effect"])
async def test_worker_killed_around_its_effect_leaves_exactly_one_application(
    db_url: str, db: Any, tmp_path: Path, kill_point: str
) -> None:
    script = tmp_path / "crashing_worker.py"
    script.write_text(CRASHING_WORKER)
    worker = await asyncio.create_subprocess_exec(
        sys.executable, str(script), db_url, "run-1", kill_point,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=child_environment(), cwd=ROOT,
    )
    out, err = await asyncio.wait_for(worker.communicate(), 6 * WAIT)
    assert worker.returncode == -signal.SIGKILL, err.decode()

    if kill_point == "after_commit":
        assert out == b"applied=True\n"
        assert await notes(db) == ["charged"]
        assert await ledger_keys(db) == ["run-1"]
    else:
        assert out == b""
        assert await notes(db) == []  # the killed transaction took its write with it
        assert await ledger_keys(db) == []

    # The node never got a result, so the run is delivered again.
    redelivered = await asyncio.wait_for(apply_once(db, "run-1", record("charged")), WAIT)

    assert redelivered.applied is (kill_point == "inside_effect")
    assert redelivered.applied_at is not None
    assert await notes(db) == ["charged"]


# -- arguments and connection states -----------------------------------------------------------


@pytest.mark.parametrize(
    "table",
    [
        "",
        "effects; DROP TABLE effects",
        'ledger"; DROP TABLE effects; --',
        "1ledger",
        "ledger-2",
        "my ledger",
        "ledgér",
        "a.b.c",
        ".ledger",
        "ledger.",
        "x" * 64,
    ],
)
async def test_unsafe_ledger_table_names_are_rejected(db: Any, table: str) -> None:
    with pytest.raises(ValueError, match="unsafe ledger table"):
        await apply_once(db, "run-1", record("a"), table=table)
    with pytest.raises(ValueError, match="unsafe ledger table"):
        await ensure_ledger(db, table=table)
    assert await notes(db) == []


async def test_schema_qualified_ledger_only_on_postgres(db: Any) -> None:
    if isinstance(db, aiosqlite.Connection):
        with pytest.raises(ValueError, match="no schema on SQLite"):
            await apply_once(db, "run-1", record("a"), table="app.ledger")
        return
    await db.execute("CREATE SCHEMA app")
    assert (await apply_once(db, "run-1", record("a"), table="app.Ledger")).applied
    assert not (await apply_once(db, "run-1", record("b"), table="app.Ledger")).applied
    assert await ledger_keys(db, 'app."Ledger"') == ["run-1"]
    assert await notes(db) == ["a"]


async def test_empty_key_is_rejected(db: Any) -> None:
    with pytest.raises(ValueError, match="non-empty string"):
        await apply_once(db, "", record("a"))
    assert await notes(db) == []


async def test_other_connection_types_are_rejected() -> None:
    with pytest.raises(TypeError, match="asyncpg Connection or Pool, or an aiosqlite Connection"):
        await apply_once(object(), "run-1", record("a"))


async def test_connection_already_in_a_transaction_is_refused(db: Any) -> None:
    await db.execute("BEGIN")
    await db.execute("INSERT INTO effects (note) VALUES ('mine')")

    with pytest.raises(RuntimeError, match="already in a transaction"):
        await apply_once(db, "run-1", record("a"))

    assert in_transaction(db)  # the caller's transaction is left alone
    await db.execute("ROLLBACK")
    assert (await apply_once(db, "run-1", record("a"))).applied


async def test_apply_once_for_keys_by_the_runs_idempotency_key(db: Any) -> None:
    ctx: Any = SimpleNamespace(idempotency_key="job-1:2030-01-02T03:04:05Z")

    assert (await apply_once_for(ctx, db, record("a"))).applied
    assert not (await apply_once_for(ctx, db, record("b"))).applied
    assert await ledger_keys(db) == ["job-1:2030-01-02T03:04:05Z"]


@pytest.mark.parametrize("isolation_level", [None, "", "DEFERRED", "IMMEDIATE"])
async def test_sqlite_commits_in_every_isolation_mode(sqlite_url: str, isolation_level: str | None) -> None:
    async with connect(sqlite_url, isolation_level=isolation_level) as conn:
        await conn.execute("CREATE TABLE effects (note TEXT NOT NULL)")
        assert (await apply_once(conn, "run-1", record("a"))).applied
        assert not conn.in_transaction
        async with connect(sqlite_url) as other:
            assert await notes(other) == ["a"]  # committed, not merely visible to its own connection

        if isolation_level is not None:
            # The sqlite3 module opens a transaction implicitly before this write.
            await conn.execute("INSERT INTO effects (note) VALUES ('pending')")
            with pytest.raises(RuntimeError, match="already in a transaction"):
                await apply_once(conn, "run-2", record("b"))
            await conn.rollback()
        assert await notes(conn) == ["a"]


async def test_sqlite_effect_that_commits_itself_is_reported(sqlite_url: str) -> None:
    async with connect(sqlite_url) as conn:
        await conn.execute("CREATE TABLE effects (note TEXT NOT NULL)")

        async def charge_and_commit(tx: Any) -> None:
            await tx.execute("INSERT INTO effects (note) VALUES ('a')")
            await tx.commit()

        with pytest.raises(RuntimeError, match="committed or rolled back"):
            await apply_once(conn, "run-1", charge_and_commit)
        assert not conn.in_transaction


@pytest.mark.postgres
async def test_pool_lends_a_connection_for_the_call(pg_dsn: str) -> None:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2, timeout=WAIT)
    try:
        await pool.execute("CREATE TABLE effects (note TEXT NOT NULL)")
        assert (await apply_once(pool, "run-1", record("a"))).applied
        async with pool.acquire() as conn:
            repeated = await apply_once(conn, "run-1", record("b"))
            assert not repeated.applied and repeated.applied_at is not None
            assert await notes(conn) == ["a"]
    finally:
        await asyncio.wait_for(pool.close(), WAIT)
