"""SQLite connections: one serialised writer and one reader, driver errors classified here.

Writes take ``BEGIN IMMEDIATE``, so two stores on one file (two processes, or a test's two
connections) serialise on SQLite's write lock. Also the small query helpers that turn rows into
dicts with instants (integer microseconds) back as aware datetimes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import sqlite3
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar, cast

import aiosqlite
import orjson

from fastlane.domain.errors import StorageUnavailable
from fastlane.errors import ConfigurationError
from fastlane.runtime.clock import from_micros, to_micros
from fastlane.storage.driver_errors import SQLITE_DRIVER_ERRORS, classify_sqlite, sqlite_write_fault
from fastlane.storage.sqlite.node_lock import NodeLock
from fastlane.storage.turns import WriteTurns

T = TypeVar("T")

# How much lower than the rest of the process SQLite's connection threads run (Linux nice levels).
# Their work has a deadline of the write lead (250 ms or more ahead), while the event loop's timers
# and a worker's start of a held run on the same machine are due within a millisecond: when they
# compete for a core, the kernel should give it to the wake-up. Lowered, they still have every
# core nothing more urgent wants, which is soon enough for a deadline that far ahead (`fastlane
# bench spread` and `sustained` on SQLite show start lag and throughput).
CONNECTION_THREAD_NICENESS = 10


def lower_this_threads_priority() -> None:
    """Run the calling thread :data:`CONNECTION_THREAD_NICENESS` nice levels lower than it does now.

    Linux only, where ``setpriority`` on a thread id affects that thread alone; a no-op elsewhere
    and when the system refuses (lowering one's own priority needs no privilege)."""
    if sys.platform != "linux":
        return
    thread_id = threading.get_native_id()
    with contextlib.suppress(OSError):
        niceness = os.getpriority(os.PRIO_PROCESS, thread_id)
        os.setpriority(os.PRIO_PROCESS, thread_id, min(niceness + CONNECTION_THREAD_NICENESS, 19))


def _now_us() -> int:
    """The ``fl_now_us()`` SQL function behind :data:`fastlane.storage.sqlite.queries.NOW`."""
    return time.time_ns() // 1000


class SQLiteConnections:
    """The connections of a store on one SQLite file: a write connection (serialised) and a read one.

    ``node_lock``: the store of a node, which holds the file alone (:mod:`.node_lock`) from its
    first connection until :meth:`close`.
    """

    def __init__(self, url: str, *, node_lock: bool = False) -> None:
        """Raises:
            ConfigurationError: The file's directory does not exist (it is not made: a typo in
                the path would otherwise start a node on an empty database somewhere else).
        """
        self.url = url
        # sqlite:///relative.db and sqlite:////absolute/path.db, as SQLAlchemy reads them.
        self.path = Path(url.removeprefix("sqlite:///"))
        if not os.path.lexists(self.path.parent):
            raise ConfigurationError(f"the directory {self.path.parent} does not exist; create it first ({url})")
        self._node_lock = NodeLock(self.path, url) if node_lock else None
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._write_lock = WriteTurns()
        self._read_lock = asyncio.Lock()
        self._write_fault: str | None = None
        self._write_fault_changed = asyncio.Event()

    @property
    def write_fault(self) -> str | None:
        """What keeps the last write transaction from committing, with its fix ("the disk holding
        /var/lib/fastlane.db is full: free space on it; ..."), or None once one commits again.

        Set by a full disk, a read-only file or mount, an I/O error or a file that cannot be
        opened; a lock taken by another process or an error in a statement leaves it as it is.
        """
        return self._write_fault

    async def write_fault_changed(self, fault: str | None) -> None:
        """Return once :attr:`write_fault` differs from ``fault``."""
        while self._write_fault == fault:
            await self._write_fault_changed.wait()

    def _writes(self, fault: str | None) -> None:
        if fault != self._write_fault:
            self._write_fault = fault
            self._write_fault_changed.set()  # wakes every waiter; each compares again
            self._write_fault_changed = asyncio.Event()

    async def _connect(self) -> aiosqlite.Connection:
        """A new connection, set up.

        Raises:
            StorageUnavailable: The file cannot be opened now (retried).
            ConfigurationError: Another node holds the file (with ``node_lock``).
        """
        connection: aiosqlite.Connection | None = None
        try:
            _check_directory(self.path.parent)  # gone since start-up, or never one: retried
            if self._node_lock is not None:
                self._node_lock.acquire()
            connection = await _opened(aiosqlite.connect(self.path, isolation_level=None))
            connection.row_factory = sqlite3.Row
            await connection.create_function("fl_now_us", 0, _now_us)
            # aiosqlite runs each connection in a thread of its own, and an SQL function runs in it.
            await connection.create_function("fl_lower_priority", 0, lower_this_threads_priority)
            await connection.execute("SELECT fl_lower_priority()")
            await connection.execute("PRAGMA journal_mode = WAL")
            await connection.execute("PRAGMA synchronous = NORMAL")  # durable in WAL mode except on power loss
            await connection.execute("PRAGMA busy_timeout = 10000")
        except SQLITE_DRIVER_ERRORS as error:
            if connection is not None:  # half set up: its thread must not linger
                with contextlib.suppress(Exception):
                    await connection.close()
            raise classify_sqlite(error, doing="opening it", path=str(self.path)) from error
        return connection

    @contextlib.asynccontextmanager
    async def _transaction(self, *, urgent: bool = False) -> AsyncIterator[aiosqlite.Connection]:
        """The write transaction; ``urgent`` (lease and membership upkeep) goes ahead of queued ones."""
        async with self._write_lock.turn(urgent=urgent):
            try:
                if self._writer is None:
                    self._writer = await self._connect()
            except StorageUnavailable as unavailable:
                self._writes(sqlite_write_fault(unavailable.__cause__, path=str(self.path))
                             if unavailable.__cause__ is not None else None)
                raise
            db = self._writer
            changes = db.total_changes
            try:
                # BEGIN IMMEDIATE goes with the transaction's first statement, in the same hop to
                # the connection's thread (SQLiteTx, begin=True): the write turn is this
                # process's already, and a transaction that ran nothing has nothing to commit.
                try:
                    yield db
                except BaseException:
                    await self._roll_back(db)
                    raise
                if db.in_transaction:
                    await db.execute("COMMIT")
            except SQLITE_DRIVER_ERRORS as error:
                if self._writer is db and db.in_transaction:  # a failed COMMIT leaves it open
                    await self._roll_back(db)
                fault = sqlite_write_fault(error, path=str(self.path))
                if fault is not None:
                    await self._reopen_all(db)
                    self._writes(fault)
                raise classify_sqlite(error, path=str(self.path)) from error
            if db.total_changes != changes:
                self._writes(None)
            elif self._write_fault is not None:
                # A transaction that changed nothing commits even on a full disk or a read-only
                # file: it says nothing about the fault, and the next one opens the file afresh.
                await self._reopen_all(db)

    async def _roll_back(self, db: aiosqlite.Connection) -> None:
        """Roll back; a writer that cannot (its file gone, say) is closed, so the next
        transaction starts on a fresh connection instead of failing on this one forever."""
        try:
            if db.in_transaction:  # SQLite rolls back by itself after some errors
                await db.execute("ROLLBACK")
        except (sqlite3.Error, ValueError):  # ValueError: aiosqlite's connection is already closed
            await self._drop_writer(db)

    async def _reopen_all(self, db: aiosqlite.Connection) -> None:
        """Close both connections after a write fault: the next use opens the file again.

        A connection that opened the file read-only (or lost it to a remount or an I/O error)
        stays so; and while any connection of this process has the file open, SQLite hands a
        new one the descriptor a closed one left, so the reader goes too. Then the next
        transaction sees the file as it is now, and succeeds as soon as the cause is gone,
        without a restart.
        """
        await self._drop_writer(db)
        async with self._read_lock:
            reader, self._reader = self._reader, None
            if reader is not None:
                with contextlib.suppress(Exception):
                    await reader.close()

    async def _drop_writer(self, db: aiosqlite.Connection) -> None:
        """Close ``db``, the writer: the next transaction starts on a fresh connection."""
        if self._writer is db:
            self._writer = None
        with contextlib.suppress(Exception):
            await db.close()

    @contextlib.asynccontextmanager
    async def _read(self) -> AsyncIterator[aiosqlite.Connection]:
        async with self._read_lock:
            if self._reader is None:
                self._reader = await self._connect()
            try:
                yield self._reader
            except SQLITE_DRIVER_ERRORS as error:
                raise classify_sqlite(error, path=str(self.path)) from error

    async def close(self) -> None:
        """Close both connections (waiting for their threads) and release the node's lock."""
        try:
            for name in ("_writer", "_reader"):
                connection = getattr(self, name)
                setattr(self, name, None)
                if connection is not None:
                    with contextlib.suppress(sqlite3.Error, ValueError):  # a broken one is closed all the same
                        await connection.close()
        finally:
            if self._node_lock is not None:
                self._node_lock.release()


def _check_directory(directory: Path) -> None:
    """Raise the OSError that keeps a file from being made in ``directory`` (a missing one, or a
    file in its place), before SQLite says only "unable to open database file"."""
    if not directory.is_dir():
        os.stat(directory)  # FileNotFoundError if it is missing
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(directory))


async def _opened(pending: aiosqlite.Connection) -> aiosqlite.Connection:
    """Await ``pending``'s connection; if that fails (or is cancelled), wait for its thread to end.

    aiosqlite stops a connection that could not open by queueing a stop whose answer its thread
    hands to the event loop, and nobody waits for it: when the loop closes first (a node stopped
    while it retries an unopenable file) the thread dies with "Event loop is closed". Joined here,
    the thread is gone before the error reaches anyone.
    """
    try:
        return await pending
    except BaseException:
        thread = getattr(pending, "_thread", None)  # aiosqlite's worker thread (0.20 and later)
        if isinstance(thread, threading.Thread) and thread.is_alive():
            await asyncio.shield(asyncio.to_thread(thread.join, 5.0))
        raise


# -- small query helpers ---------------------------------------------------------------------------

TIME_COLUMNS = frozenset({
    "heartbeat_at",
    "next_fire_at", "created_at", "updated_at", "scheduled_for", "available_at", "lease_expires_at",
    "first_attempt_at", "first_started_at", "finished_at", "dispatched_at", "started_at",
    "expires_at", "revoked_at", "last_used_at",
    "at",  # audit_events
})


def instant(value: datetime | None) -> int | None:
    return None if value is None else to_micros(value)


def json_array(values: Iterable[Any]) -> str:
    """A batch as the one JSON array parameter that ``json_each`` expands."""
    return orjson.dumps(list(values)).decode()


def row_dict(row: sqlite3.Row) -> dict[str, Any]:
    """A row as a dict with instants turned back into aware datetimes."""
    return row_dicts([row])[0]


def row_dicts(rows: Sequence[sqlite3.Row]) -> list[dict[str, Any]]:
    """Rows as dicts with instants turned back into aware datetimes (columns looked at once)."""
    if not rows:
        return []
    names = rows[0].keys()
    return [dict(zip(names, values, strict=True)) for values in with_instants(rows, instant_columns(names))]


def instant_columns(names: Sequence[str]) -> list[int]:
    """Where the instants are among these columns."""
    return [index for index, name in enumerate(names) if name in TIME_COLUMNS]


def with_instants(rows: Iterable[Sequence[Any]], instants: Sequence[int]) -> list[list[Any]]:
    """Each row's values, its instants (integer microseconds) as aware datetimes."""
    converted = []
    for row in rows:
        values = list(row)
        for index in instants:
            if values[index] is not None:
                values[index] = from_micros(values[index])
        converted.append(values)
    return converted


async def in_thread(db: aiosqlite.Connection, work: Callable[[sqlite3.Connection], T]) -> T:
    """``work(connection)`` in the connection's own thread: one hop there and back for as many
    statements as ``work`` runs. Each hop wakes that thread and then the event loop, and costs
    more than a small statement itself; the hot path's procedures are several statements each.

    aiosqlite has no public call for this: its ``_execute`` queues a function for the
    connection's thread, as each of its own methods does (a test holds it to that).
    """
    return cast(T, await db._execute(work, db._conn))  # type: ignore[no-untyped-call]
