"""The PostgreSQL dialect as the store uses it (:class:`~fastlane.storage.store.database.Database`):
its pool (``connection``), its transactions (``tx``), its change watch (``changes``) and its SQL
(``queries``)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

from fastlane.domain.limits import DEFAULT_SHARD_LEASE_TTL
from fastlane.domain.records import Change
from fastlane.storage.capabilities import Capabilities
from fastlane.storage.postgres import queries
from fastlane.storage.postgres.changes import ChangeListener
from fastlane.storage.postgres.connection import PostgresConnections
from fastlane.storage.postgres.tx import PostgresTx
from fastlane.storage.store.database import Tx

CAPABILITIES = Capabilities(one_writer=False, listens=True, prompt_results=True, trim_batch=1_000, write_faults=False)


class PostgresDatabase(PostgresConnections):
    """A PostgreSQL database through an asyncpg pool."""

    name = "postgres"
    capabilities = CAPABILITIES
    statements = queries.STATEMENTS

    def __init__(self, url: str, *, pool_size: int = 10, lease_ttl: timedelta = DEFAULT_SHARD_LEASE_TTL,
                 rng: random.Random | None = None, fixed_pool: bool = False) -> None:
        """``lease_ttl`` is the nodes' shard lease TTL: the session limits of every connection
        derive from it (see :class:`~fastlane.storage.postgres.connection.SessionLimits`)."""
        super().__init__(url, pool_size=pool_size, lease_ttl=lease_ttl, fixed_pool=fixed_pool)
        self._changes = ChangeListener(self._hosts, self._limits, rng or random.Random())

    async def watch_changes(self, on_change: Callable[[Change], None]) -> None:
        await self._changes.watch(on_change)

    def translate(self, sql: str) -> str:
        return sql  # the store's statements are PostgreSQL's SQL

    @contextlib.asynccontextmanager
    async def write(self, *, urgent: bool = False, one_statement: bool = False) -> AsyncIterator[Tx]:
        # One statement is atomic on its own: no BEGIN and COMMIT, two round trips fewer.
        async with self._connection() if one_statement else self._transaction() as db:
            yield PostgresTx(db)

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[Tx]:
        async with self._connection() as db:
            yield PostgresTx(db)

    @contextlib.asynccontextmanager
    async def migrating(self) -> AsyncIterator[Tx]:
        # On a connection without the statement and lock limits of the pool's (see
        # SessionLimits.migration_settings): a migration may rightly take long.
        async with self._migration_transaction() as db:
            await db.execute(queries.LOCK_MIGRATIONS, queries.MIGRATION_LOCK)
            yield PostgresTx(db)  # type: ignore[arg-type]  # a plain connection speaks as a pooled one
        # The pool's connections prepared their statements against the tables as they were: a column
        # a migration added invalidates those plans, which PostgreSQL refuses inside a transaction.
        if self._pool is not None:
            await self._pool.expire_connections()

    @property
    def write_fault(self) -> str | None:
        return None  # a server that cannot write says so to every statement, as StorageError

    async def write_fault_changed(self, fault: str | None) -> None:
        await asyncio.Event().wait()
