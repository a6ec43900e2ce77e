"""What a dialect gives the one store: transactions that speak a few statement-level verbs, its
statements, and what it can and cannot do.

The store (:class:`~fastlane.storage.store.SQLStore`) decides; a dialect runs SQL. A dialect holds
only what truly differs between databases: its connections, its driver-error mapping, how a batch
travels (PostgreSQL: one array per column for ``unnest``; SQLite: one JSON array for ``json_each``),
the few statements whose SQL must differ, the hot-path procedures whose *shape* differs (one
statement on PostgreSQL where SQLite needs two), and its migrations.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol

from fastlane.domain.records import AttemptResult, Change, Dispatch, Heartbeat
from fastlane.storage.capabilities import Capabilities
from fastlane.storage.codec import Row
from fastlane.storage.store.statements import Statements


class Batch:
    """The rows of one set-based statement, in the order the statement's columns name them.

    The dialect's transaction encodes it where it stands among the parameters: PostgreSQL as
    ``width`` array parameters (one per column, for ``unnest``), SQLite as one JSON array of rows
    (for ``json_each``). The store writes each batch once, whatever the dialect.
    """

    __slots__ = ("rows", "width")

    def __init__(self, rows: Iterable[Sequence[Any]], width: int) -> None:
        self.rows = list(rows)
        self.width = width


class Tx(Protocol):
    """One transaction (or, for reads, one connection) of a dialect.

    Parameters are Python values: aware datetimes, lists (bound as arrays or JSON), bytes and
    :class:`Batch`; the dialect converts them. Rows read back have their instants as aware
    datetimes, whatever the database stores.
    """

    async def fetch(self, sql: str, *params: Any) -> list[Row]: ...

    async def fetchrow(self, sql: str, *params: Any) -> Row | None: ...

    async def fetchval(self, sql: str, *params: Any) -> Any:
        """The first column of the first row, as the driver returns it (not for instants)."""
        ...

    async def execute(self, sql: str, *params: Any) -> None: ...

    async def execute_each(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """The statement once per row (``executemany``)."""
        ...

    async def now(self) -> datetime:
        """The database clock, which judges every lease."""
        ...

    async def notify(self, change: Change) -> None:
        """Tell every other node of a change once this transaction commits (nothing where
        one node uses the database)."""
        ...

    def stream(self, sql: str, *params: Any, chunk: int) -> AsyncIterator[list[tuple[Any, ...]]]:
        """The rows of a large read ``chunk`` at a time, as tuples with instants as datetimes."""
        ...

    async def run_script(self, sql: str) -> None:
        """A migration's statements, in order."""
        ...

    # -- hot-path procedures whose shape differs between dialects ----------------------------------

    async def dispatch(self, dispatches: Sequence[Dispatch]) -> list[Row]:
        """Start an attempt of each run still ``scheduled``; returns the attempt rows made."""
        ...

    async def extend_leases(self, heartbeats: Sequence[Heartbeat]) -> list[Heartbeat]:
        """Extend the leases of the current attempts among these heartbeats (with their
        progress, checkpoint and start) and return those heartbeats; the others are stale."""
        ...

    async def succeed(self, successes: Sequence[AttemptResult]) -> list[Row]:
        """End as succeeded the runs whose current attempt these successes are, runs and
        attempts alike; returns the run rows ended, each with ``attempt_token``, the lease token of
        the attempt that ended it (a success of another attempt matches none)."""
        ...

    async def lock_concurrency_keys(self, keys: Sequence[tuple[str, str]]) -> None:
        """Hold these (tenant, key) pairs until commit, so two nodes do not count one key at once
        (nothing where the one writer already serialises)."""
        ...

    async def trim_finished(self, shard_ids: Collection[int], finished_before: datetime, limit: int) -> int:
        """Delete up to ``limit`` runs of these shards finished before the time, oldest first,
        with their attempts; returns how many."""
        ...


class Database(Protocol):
    """A dialect's connections to one database, as the store uses them."""

    url: str
    name: str  # names the dialect's migrations folder
    capabilities: Capabilities
    statements: Statements

    def translate(self, sql: str) -> str:
        """PostgreSQL's SQL of a statement as this dialect says it."""
        ...

    def write(self, *, urgent: bool = False, one_statement: bool = False) -> contextlib.AbstractAsyncContextManager[Tx]:
        """A write transaction. ``urgent`` (lease and membership upkeep) goes ahead of queued
        writes where there is one writer; ``one_statement``: the caller runs a single statement,
        atomic on its own, so a dialect may spare the BEGIN and COMMIT."""
        ...

    def read(self) -> contextlib.AbstractAsyncContextManager[Tx]: ...

    def migrating(self) -> contextlib.AbstractAsyncContextManager[Tx]:
        """The transaction migrations run in: one migrator at a time, without the limits
        ordinary statements have."""
        ...

    @property
    def server_epoch(self) -> int: ...

    @property
    def write_fault(self) -> str | None: ...

    async def write_fault_changed(self, fault: str | None) -> None: ...

    async def watch_changes(self, on_change: Callable[[Change], None]) -> None: ...

    async def close(self) -> None: ...


class StorePart:
    """What each part of the store works with: the dialect's connections and statements, the
    store's shard count (read from the database once) and its random source (retry jitter).
    Parts are separate objects the store is composed of; none reaches another through ``self``."""

    def __init__(self, database: Database, shard_count: Callable[[], Awaitable[int]], rng: random.Random) -> None:
        self._db = database
        self._q: Statements = database.statements
        self._rng = rng
        self._count_shards = shard_count

    async def shard_count(self) -> int:
        return await self._count_shards()
