"""PostgreSQL connections: the asyncpg pool, with every driver error classified on its way out,
and the session limits that keep a node's locks from outliving its shard leases."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeAlias, cast

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from fastlane.domain.limits import DEFAULT_SHARD_LEASE_TTL
from fastlane.errors import ConfigurationError
from fastlane.storage.driver_errors import POSTGRES_DRIVER_ERRORS, classify_postgres
from fastlane.storage.postgres.hosts import HostRotation
from fastlane.storage.postgres.server_identity import IdentityWatch

# What the pool lends: a proxy to a connection, with its methods. A string, as asyncpg's class is
# generic only in its stubs.
PoolConnection: TypeAlias = "PoolConnectionProxy[asyncpg.Record]"
Connection: TypeAlias = "asyncpg.Connection[asyncpg.Record]"

# How long a connection keeps a prepared statement, and so its plan, before preparing it again.
# PostgreSQL plans a prepared statement for the tables as they are then, and after a few runs keeps
# a generic plan until the table's statistics change (an ANALYZE, usually autovacuum's, within a
# minute or more). On a new database the hot statements are planned while `runs` and `attempts`
# are nearly empty, so they scan them whole and joined by hash; as the tables grow each result's
# update reads every attempt, a cost that grows with the table. Prepared again every few seconds, a
# plan follows the tables as they
# grow; a prepare costs a round trip and a few planned runs, a few dozen a second in all.
STATEMENT_LIFETIME = timedelta(seconds=5)

"""The shard lease TTL the session limits are derived from when the store is not told (the
default of ``Settings.shard_lease_ttl``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionLimits:
    """How long a node's PostgreSQL session may sit idle inside a transaction, wait for a lock,
    run one statement, and wait for the server (client side), all derived from the shard lease
    TTL: a node that freezes inside a fenced transaction (SIGSTOP, a long GC pause, a VM stall)
    holds its shard rows locked ``FOR KEY SHARE`` until the server ends its session, and a
    takeover cannot go past that lock.

    Use :meth:`for_lease`; see there for the fractions and why.
    """

    idle_in_transaction: timedelta
    lock_wait: timedelta
    statement: timedelta
    call: timedelta

    @classmethod
    def for_lease(cls, ttl: timedelta) -> SessionLimits:
        """The limits for nodes whose shard leases last ``ttl``.

        - ``idle_in_transaction_session_timeout`` = TTL/5. The server ends a frozen node's
          session, and so drops its locks, a fifth of a lease after its last statement. A node
          renews every third of a TTL, so when it last fenced its lease normally had two thirds
          left: its locks are gone well before the lease runs out.
        - ``lock_timeout`` = TTL/4. Longer than the idle timeout, so a takeover that waits for a
          frozen owner's lock outlasts the frozen session (the server frees the row first);
          shorter than the node's lease cycle (TTL/3), which the wait runs inside. Any other wait
          behind a frozen peer's locks gives up as retryable weather instead of hanging.
        - ``statement_timeout`` = TTL/2. No statement of a node should take half a lease; with
          the idle timeout it bounds how long the locks of a node that froze mid-statement can
          live: TTL/2 + TTL/5, under one lease.
        - the client side: asyncpg's ``command_timeout``, the bound on taking a connection from
          the pool and on connecting, 3/4 TTL. The backstop for a server or network that stops
          answering (when no server timeout can reach us); longer than ``statement_timeout``
          so that the server's own, clearer cancellation normally comes first.

        Raises:
            ConfigurationError: ``ttl`` is not positive.
        """
        if ttl <= timedelta(0):
            raise ConfigurationError(f"shard lease TTL {ttl.total_seconds():g} s must be positive")
        return cls(idle_in_transaction=ttl / 5, lock_wait=ttl / 4, statement=ttl / 2, call=ttl * 3 / 4)

    def server_settings(self) -> dict[str, str]:
        """The session settings, sent when each connection starts (so ``RESET ALL``, run by the
        pool when a connection comes back, keeps them)."""
        return {
            "idle_in_transaction_session_timeout": _milliseconds(self.idle_in_transaction),
            "lock_timeout": _milliseconds(self.lock_wait),
            "statement_timeout": _milliseconds(self.statement),
        }

    def migration_settings(self) -> dict[str, str]:
        """The settings of the migration session: no statement or lock limit (a migration may
        rightly take long on a big database, and waits for the sessions using a table it
        alters, and a node starting meanwhile waits for it on the migration lock); the idle
        limit stays, as a migration is never idle between its statements, and a frozen migrator
        would otherwise hold exclusive table locks that stop every node."""
        return {**self.server_settings(), "lock_timeout": "0", "statement_timeout": "0"}

    @property
    def call_seconds(self) -> float:
        return self.call.total_seconds()


def _milliseconds(duration: timedelta) -> str:
    return str(max(1, round(duration / timedelta(milliseconds=1))))  # 0 would turn the limit off


class PostgresConnections:
    """The connection pool of a store on PostgreSQL, opened on first use.

    Every connection carries the :class:`SessionLimits` of ``lease_ttl``, and reads the identity
    of its server first (see ``server_identity``). ``url`` may name several hosts
    (``postgresql://h1:5432,h2:5432/db?target_session_attrs=read-write``): a connection goes to
    the first that accepts writes, so after a failover the pool's new connections find the
    promoted standby (see ``hosts``).
    """

    def __init__(self, url: str, *, pool_size: int, lease_ttl: timedelta = DEFAULT_SHARD_LEASE_TTL,
                 fixed_pool: bool = False) -> None:
        self.url = url
        self._pool_size = pool_size
        self._fixed_pool = fixed_pool
        self._limits = SessionLimits.for_lease(lease_ttl)
        self._pool: asyncpg.Pool | None = None
        self._hosts = HostRotation(url)
        self._identity = IdentityWatch()

    @property
    def server_epoch(self) -> int:
        """How many times the pool found itself on another server history (a failover)."""
        return self._identity.epoch

    async def _open(self) -> asyncpg.Pool:
        if self._pool is None:
            try:
                self._pool = await asyncpg.create_pool(
                    self.url,
                    # A node's pool is fixed: it opens every session at start and keeps them
                    # (no idle timeout), so its connections and open files are the same at any
                    # load, and a server that cannot take them all says so at start-up, not
                    # under the first busy minute. A one-shot command opens only what it uses.
                    min_size=self._pool_size if self._fixed_pool else 1,
                    max_size=self._pool_size,
                    max_inactive_connection_lifetime=0 if self._fixed_pool else 300.0,
                    command_timeout=self._limits.call_seconds,
                    timeout=self._limits.call_seconds,
                    server_settings=self._limits.server_settings(),
                    # cast: the stubs spell out every keyword of asyncpg.connect; this passes them on.
                    connect=cast(Any, self._hosts.connect),
                    init=self._identity.check,
                    # Whole seconds, at least 1: asyncpg reads 0 as "keep for ever".
                    max_cached_statement_lifetime=max(1, round(STATEMENT_LIFETIME.total_seconds())),
                )
            except POSTGRES_DRIVER_ERRORS as error:
                raise classify_postgres(error, doing="connecting") from error
        return self._pool

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[PoolConnection]:
        """A pooled connection; every driver error, from acquiring to releasing it, leaves as a
        StorageError (StorageUnavailable when retrying may work, a timeout included)."""
        pool = await self._open()
        try:
            async with pool.acquire(timeout=self._limits.call_seconds) as connection:
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

    @contextlib.asynccontextmanager
    async def _migration_transaction(self) -> AsyncIterator[Connection]:
        """A transaction on a connection of its own, outside the pool, with
        :meth:`SessionLimits.migration_settings` and no client-side statement timeout."""
        try:
            connection = await self._hosts.connect(
                timeout=self._limits.call_seconds, server_settings=self._limits.migration_settings()
            )
        except POSTGRES_DRIVER_ERRORS as error:
            raise classify_postgres(error, doing="connecting to migrate") from error
        try:
            async with connection.transaction():
                yield connection
        except POSTGRES_DRIVER_ERRORS as error:
            raise classify_postgres(error, connection_closed=connection.is_closed(), doing="migrating") from error
        finally:
            with contextlib.suppress(*POSTGRES_DRIVER_ERRORS):
                await connection.close(timeout=self._limits.call_seconds)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            # Waits for the connections lent out to come back: bounded, as one may never.
            async with asyncio.timeout(self._limits.call_seconds):
                await pool.close()
        except POSTGRES_DRIVER_ERRORS:  # a timeout among them
            pool.terminate()
