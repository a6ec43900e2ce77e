"""Exactly-once side effects: a ledger of idempotency keys in your own database.

Workers get each run at least once, so a handler may run again after a crash or a lost result.
:func:`apply_once` makes a database write happen once per idempotency key: it records the key in a
ledger table and runs your effect in the same transaction on your connection, so the key and the
effect commit together or not at all. A redelivered run finds its key and skips the effect.

Example::

    from fastlane.worker.effects import apply_once

    @worker.handler("billing.charge")
    async def charge(ctx: RunContext) -> None:
        order = ctx.json()
        async with pool.acquire() as conn:
            result = await apply_once(
                conn, ctx.idempotency_key,
                lambda tx: tx.execute("INSERT INTO charges (customer, cents) VALUES ($1, $2)",
                                      order["customer"], order["cents"]),
            )
        if not result.applied:
            log.info("charge already made at %s", result.applied_at)

Only what the effect writes through the connection it is given is covered. Anything else it does
(an HTTP call, a message sent) may happen again: the transaction can still roll back after it.

PostgreSQL (asyncpg) and SQLite (aiosqlite) are supported; neither driver is needed to import this
module. The ledger table (``fastlane_effects`` unless told otherwise) is created on first use.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar

from fastlane.runtime.clock import from_micros

if TYPE_CHECKING:
    import aiosqlite
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

    from fastlane.worker.sdk import RunContext

    Connection: TypeAlias = asyncpg.Connection | PoolConnectionProxy | aiosqlite.Connection

__all__ = ["DEFAULT_TABLE", "EffectResult", "apply_once", "apply_once_for", "ensure_ledger"]

DEFAULT_TABLE = "fastlane_effects"

T = TypeVar("T")

# ASCII letters, digits and underscores, not starting with a digit, so every name is valid once
# quoted; 63 characters because PostgreSQL would silently truncate anything longer.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

_IN_TRANSACTION = (
    "the connection is already in a transaction; apply_once must own the transaction it commits "
    "(commit or roll back yours first, or use another connection)"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class EffectResult(Generic[T]):
    """What :func:`apply_once` did.

    Attributes:
        applied: True if this call ran the effect and committed it; False if the key was
            already in the ledger, so the effect was not run.
        value: What the effect returned, when this call applied it; otherwise None.
        applied_at: When the key was claimed by the transaction that applied the effect (this
            call's, or an earlier one's), which committed once the effect returned.
    """

    applied: bool
    value: T | None
    applied_at: datetime | None


class _Dialect(StrEnum):
    POSTGRES = "postgres"
    SQLITE = "sqlite"


class _LedgerMissing(Exception):
    """The ledger table does not exist yet: create it and try again."""


async def apply_once(
    connection: Connection | asyncpg.Pool,
    key: str,
    effect: Callable[[Connection], Awaitable[T]],
    *,
    table: str = DEFAULT_TABLE,
) -> EffectResult[T]:
    """Run ``effect`` at most once for ``key``, atomically with recording the key.

    Opens a transaction on ``connection``, inserts ``key`` into the ledger and, if the key was new,
    awaits ``effect(connection)`` inside that transaction and commits. If the key was already
    there, the effect is not run. A concurrent call with the same key waits for this one's
    transaction and then reports ``applied=False``.

    Args:
        connection: An asyncpg ``Connection`` (a pool's connection too) or ``Pool`` (one
            connection is acquired for the call), or an aiosqlite ``Connection`` in any
            isolation mode. It must not be in a transaction already.
        key: The idempotency key, e.g. ``RunContext.idempotency_key``.
        effect: Writes the side effect using the connection it is passed; must not commit.
        table: The ledger table, ``name`` or (PostgreSQL only) ``schema.name``; used quoted, so
            case matters.

    Returns:
        Whether the effect was applied by this call, its value, and when the key was claimed.

    Raises:
        ValueError: ``key`` is empty, or ``table`` is not a safe identifier.
        TypeError: ``connection`` is not an asyncpg or aiosqlite connection.
        RuntimeError: The connection is already in a transaction, or the effect ended ours.
        Exception: Whatever ``effect`` raises, after the transaction has rolled back.
    """
    if not isinstance(key, str) or not key:
        # An empty key would make every run share one ledger row: all but the first would skip.
        raise ValueError(f"the idempotency key must be a non-empty string, got {key!r}")
    dialect, is_pool = _dialect_of(connection)
    ledger = _ledger_name(table, dialect)
    async with _borrowed(connection, is_pool) as borrowed:
        return await _apply(borrowed, dialect, ledger, key, effect)


async def apply_once_for(
    ctx: RunContext,
    connection: Connection | asyncpg.Pool,
    effect: Callable[[Connection], Awaitable[T]],
    *,
    table: str = DEFAULT_TABLE,
) -> EffectResult[T]:
    """:func:`apply_once` keyed by the run's ``ctx.idempotency_key``, the same across attempts."""
    return await apply_once(connection, ctx.idempotency_key, effect, table=table)


async def ensure_ledger(connection: Connection | asyncpg.Pool, *, table: str = DEFAULT_TABLE) -> None:
    """Create the ledger table if it is missing (``apply_once`` also does so on first use).

    Columns: ``key`` (text, primary key) and ``applied_at`` (``timestamptz`` on PostgreSQL,
    integer microseconds since the Unix epoch, UTC, on SQLite).

    Raises:
        ValueError: ``table`` is not a safe identifier.
        TypeError: ``connection`` is not an asyncpg or aiosqlite connection.
    """
    dialect, is_pool = _dialect_of(connection)
    ledger = _ledger_name(table, dialect)
    async with _borrowed(connection, is_pool) as borrowed:
        await _create_ledger(borrowed, dialect, ledger)


# -- one application ---------------------------------------------------------------------------


async def _apply(
    connection: Any, dialect: _Dialect, ledger: str, key: str, effect: Callable[[Any], Awaitable[T]]
) -> EffectResult[T]:
    transact = _transact_postgres if dialect is _Dialect.POSTGRES else _transact_sqlite
    try:
        return await transact(connection, ledger, key, effect, ledger_may_be_missing=True)
    except _LedgerMissing:
        # First use on this database. Checking for the table on every call would cost a round
        # trip per run for a table that, once there, stays; a failed first claim costs one.
        await _create_ledger(connection, dialect, ledger)
        return await transact(connection, ledger, key, effect, ledger_may_be_missing=False)


async def _transact_postgres(
    connection: Any, ledger: str, key: str, effect: Callable[[Any], Awaitable[T]], *, ledger_may_be_missing: bool
) -> EffectResult[T]:
    import asyncpg

    if connection.is_in_transaction():
        raise RuntimeError(_IN_TRANSACTION)
    async with connection.transaction():
        try:
            # On a conflict with an uncommitted claim this waits for that transaction to end.
            claimed_at = await connection.fetchval(
                f"INSERT INTO {ledger} (key, applied_at) VALUES ($1, clock_timestamp()) "
                "ON CONFLICT (key) DO NOTHING RETURNING applied_at",
                key,
            )
        except asyncpg.UndefinedTableError as exc:
            if ledger_may_be_missing:
                raise _LedgerMissing from exc
            raise
        if claimed_at is None:
            # A new statement takes a new snapshot, so it sees the claim that just committed.
            earlier = await connection.fetchval(f"SELECT applied_at FROM {ledger} WHERE key = $1", key)
            return EffectResult(applied=False, value=None, applied_at=earlier)
        value = await effect(connection)
    return EffectResult(applied=True, value=value, applied_at=claimed_at)


async def _transact_sqlite(
    connection: Any, ledger: str, key: str, effect: Callable[[Any], Awaitable[T]], *, ledger_may_be_missing: bool
) -> EffectResult[T]:
    import sqlite3

    # Checked rather than trusted to BEGIN: in the default isolation mode the sqlite3 module may
    # have opened a transaction implicitly, and ours must not merge into it.
    if connection.in_transaction:
        raise RuntimeError(_IN_TRANSACTION)
    # IMMEDIATE takes the write lock at BEGIN, where a racing claim can safely wait out the busy
    # timeout; taken later, after a read lock, SQLite may refuse at once to avoid a deadlock.
    await connection.execute("BEGIN IMMEDIATE")
    try:
        claimed_at = time.time_ns() // 1000
        try:
            async with connection.execute(
                f"INSERT INTO {ledger} (key, applied_at) VALUES (?, ?) ON CONFLICT (key) DO NOTHING",
                (key, claimed_at),
            ) as cursor:
                claimed = cursor.rowcount == 1
        except sqlite3.OperationalError as exc:
            if ledger_may_be_missing and "no such table" in str(exc):
                raise _LedgerMissing from exc
            raise
        if not claimed:
            async with connection.execute(f"SELECT applied_at FROM {ledger} WHERE key = ?", (key,)) as cursor:
                cursor.row_factory = None  # plain tuples, whatever factory the caller set
                row = await cursor.fetchone()
            await connection.execute("COMMIT")
            return EffectResult(applied=False, value=None, applied_at=None if row is None else from_micros(row[0]))
        value = await effect(connection)
        if not connection.in_transaction:
            raise RuntimeError(
                "the effect committed or rolled back apply_once's transaction itself, so the key "
                "and the effect were not recorded together; let apply_once commit"
            )
        await connection.execute("COMMIT")
    except BaseException:
        # Also on cancellation, and if COMMIT failed (busy): never leave the caller's connection
        # holding the write lock.
        if connection.in_transaction:
            await asyncio.shield(connection.rollback())
        raise
    return EffectResult(applied=True, value=value, applied_at=from_micros(claimed_at))


# -- the ledger table --------------------------------------------------------------------------


async def _create_ledger(connection: Any, dialect: _Dialect, ledger: str) -> None:
    if dialect is _Dialect.POSTGRES:
        # IF NOT EXISTS is not atomic: two first uses racing can both pass the check, and the
        # loser fails on the table's row type or name ("type ... already exists"). A transaction
        # lock keyed by the ledger's name makes the second creator wait and then find the table.
        async with connection.transaction():
            await connection.execute("SELECT pg_advisory_xact_lock(hashtext($1))", ledger)
            await connection.execute(
                f"CREATE TABLE IF NOT EXISTS {ledger} (key text PRIMARY KEY, applied_at timestamptz NOT NULL)"
            )
    else:
        # WITHOUT ROWID: a text-keyed ledger is then one B-tree, looked up once per claim.
        await connection.execute(
            f"CREATE TABLE IF NOT EXISTS {ledger} "
            "(key TEXT PRIMARY KEY NOT NULL, applied_at INTEGER NOT NULL) WITHOUT ROWID"
        )


def _ledger_name(table: str, dialect: _Dialect) -> str:
    """``table`` checked and quoted for SQL; the only text from a caller that SQL ever contains."""
    parts = table.split(".") if isinstance(table, str) else []
    most = 2 if dialect is _Dialect.POSTGRES else 1
    if not 1 <= len(parts) <= most or not all(_IDENTIFIER.fullmatch(part) for part in parts):
        shape = "name or schema.name" if dialect is _Dialect.POSTGRES else "name (no schema on SQLite)"
        raise ValueError(
            f"unsafe ledger table {table!r}: use a {shape} made of ASCII letters, digits and "
            "underscores, not starting with a digit, at most 63 characters each"
        )
    return ".".join(f'"{part}"' for part in parts)


@asynccontextmanager
async def _borrowed(connection: Any, is_pool: bool) -> AsyncIterator[Any]:
    """The connection itself, or one acquired from the pool for the duration."""
    if is_pool:
        async with connection.acquire() as acquired:
            yield acquired
    else:
        yield connection


def _dialect_of(connection: object) -> tuple[_Dialect, bool]:
    """The connection's dialect, and whether it is a pool; drivers that were never imported are skipped."""
    asyncpg = sys.modules.get("asyncpg")
    if asyncpg is not None:
        if isinstance(connection, asyncpg.Pool):
            return _Dialect.POSTGRES, True
        if isinstance(connection, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
            return _Dialect.POSTGRES, False
    aiosqlite = sys.modules.get("aiosqlite")
    if aiosqlite is not None and isinstance(connection, aiosqlite.Connection):
        return _Dialect.SQLITE, False
    raise TypeError(
        "apply_once needs an asyncpg Connection or Pool, or an aiosqlite Connection; "
        f"got {type(connection).__module__}.{type(connection).__qualname__}"
    )
