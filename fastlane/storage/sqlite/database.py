"""The SQLite dialect as the store uses it (:class:`~fastlane.storage.store.database.Database`):
its connections (``connection``), its transactions (``tx``) and its SQL (``queries``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from fastlane.domain.records import Change
from fastlane.storage.capabilities import Capabilities
from fastlane.storage.sqlite import queries
from fastlane.storage.sqlite.connection import SQLiteConnections
from fastlane.storage.sqlite.tx import SQLiteTx
from fastlane.storage.store.database import Tx

CAPABILITIES = Capabilities(one_writer=True, listens=False, prompt_results=False, trim_batch=100, write_faults=True)


class SQLiteDatabase(SQLiteConnections):
    """One SQLite file: a write connection (serialised) and a read connection."""

    name = "sqlite"
    capabilities = CAPABILITIES
    statements = queries.STATEMENTS

    def translate(self, sql: str) -> str:
        return queries.translate(sql)

    @contextlib.asynccontextmanager
    async def write(self, *, urgent: bool = False, one_statement: bool = False) -> AsyncIterator[Tx]:
        async with self._transaction(urgent=urgent) as db:
            yield SQLiteTx(db, begin=True)

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[Tx]:
        async with self._read() as db:
            yield SQLiteTx(db)

    def migrating(self) -> contextlib.AbstractAsyncContextManager[Tx]:
        return self.write()  # the one writer: one migrator at a time already

    @property
    def server_epoch(self) -> int:
        return 0  # one file, no failover

    async def watch_changes(self, on_change: Callable[[Change], None]) -> None:
        # One node owns an SQLite database, and it learns of its own changes by direct call.
        await asyncio.Event().wait()
