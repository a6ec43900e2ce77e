"""PostgreSQL connections: the asyncpg pool, with every driver error classified on its way out."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from fastlane.storage.driver_errors import POSTGRES_DRIVER_ERRORS, classify_postgres

# What the pool lends: a proxy to a connection, with its methods. A string, as asyncpg's class is
# generic only in its stubs.
PoolConnection: TypeAlias = "PoolConnectionProxy[asyncpg.Record]"


class PostgresConnections:
    """The connection pool of a store on PostgreSQL, opened on first use."""

    def __init__(self, url: str, *, pool_size: int) -> None:
        self.url = url
        self._pool_size = pool_size
        self._pool: asyncpg.Pool | None = None

    async def _open(self) -> asyncpg.Pool:
        if self._pool is None:
            try:
                self._pool = await asyncpg.create_pool(
                    self.url, min_size=1, max_size=self._pool_size, command_timeout=60
                )
            except POSTGRES_DRIVER_ERRORS as error:
                raise classify_postgres(error, doing="connecting") from error
        return self._pool

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[PoolConnection]:
        """A pooled connection; every driver error, from acquiring to releasing it, leaves as a
        StorageError (StorageUnavailable when retrying may work)."""
        pool = await self._open()
        try:
            async with pool.acquire() as connection:
                try:
                    yield connection
                except POSTGRES_DRIVER_ERRORS as error:
                    # Whatever asyncpg raised (a transaction exit even raises InterfaceError), a
                    # connection found closed means the database went away.
                    raise classify_postgres(error, connection_closed=connection.is_closed()) from error
        except POSTGRES_DRIVER_ERRORS as error:
            raise classify_postgres(error, doing="acquiring a connection") from error

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[PoolConnection]:
        async with self._connection() as connection, connection.transaction():
            yield connection

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
