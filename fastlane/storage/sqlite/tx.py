"""A transaction on the SQLite file, as the store speaks to it (:class:`~fastlane.storage.store.database.Tx`).

Parameters are bound as SQLite keeps them: instants as integer microseconds, lists and batches
as one JSON array (orjson writes the batch's instants as microseconds too). The hot-path
procedures take the shape SQLite needs: two statements where PostgreSQL's one statement both
updates runs and inserts attempts, and a row at a time where a value is bytes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from datetime import datetime
from typing import Any, TypeVar, cast

import aiosqlite
import orjson

from fastlane.domain.records import AttemptResult, Change, Dispatch, Heartbeat
from fastlane.runtime.clock import from_micros, to_micros
from fastlane.storage import common
from fastlane.storage.codec import Row
from fastlane.storage.sqlite import queries
from fastlane.storage.sqlite.connection import in_thread, instant_columns, row_dict, row_dicts, with_instants
from fastlane.storage.store.database import Batch

T = TypeVar("T")


def _micros(value: Any) -> int:
    if isinstance(value, datetime):
        return to_micros(value)
    raise TypeError(f"{type(value).__name__} cannot go into a JSON batch")


def _json(value: Any) -> str:
    return orjson.dumps(value, default=_micros, option=orjson.OPT_PASSTHROUGH_DATETIME).decode()


def _bound(value: Any) -> Any:
    if isinstance(value, datetime):
        return to_micros(value)
    if isinstance(value, Batch):
        return _json(value.rows)
    if isinstance(value, list | tuple):
        return _json(value)
    if isinstance(value, set | frozenset):
        return _json(list(value))
    return value


def _bind(params: Sequence[Any]) -> list[Any]:
    return [_bound(value) for value in params]


class SQLiteTx:
    """One transaction (or the read connection) of :class:`~fastlane.storage.sqlite.connection.SQLiteDatabase`.

    Every call is one hop to the connection's thread (:func:`in_thread`), however many statements
    it runs; a write transaction's ``BEGIN IMMEDIATE`` (``begin``) rides with its first.
    """

    __slots__ = ("_db", "_begin")

    def __init__(self, db: aiosqlite.Connection, *, begin: bool = False) -> None:
        self._db = db
        self._begin = begin

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if not self._begin:
            return await in_thread(self._db, work)
        self._begin = False

        def begun(connection: sqlite3.Connection) -> T:
            connection.execute("BEGIN IMMEDIATE")
            return work(connection)

        return await in_thread(self._db, begun)

    async def _rows(self, sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:
        bound = _bind(params)
        return await self._run(lambda connection: connection.execute(sql, bound).fetchall())

    async def fetch(self, sql: str, *params: Any) -> list[Row]:
        return cast("list[Row]", row_dicts(await self._rows(sql, params)))

    async def fetchrow(self, sql: str, *params: Any) -> Row | None:
        # Every row is read, so a RETURNING statement completes before the transaction ends.
        rows = await self._rows(sql, params)
        return row_dict(rows[0]) if rows else None

    async def fetchval(self, sql: str, *params: Any) -> Any:
        rows = await self._rows(sql, params)
        return rows[0][0] if rows else None

    async def execute(self, sql: str, *params: Any) -> None:
        bound = _bind(params)
        await self._run(lambda connection: connection.execute(sql, bound).close())

    async def execute_each(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        bound = [_bind(row) for row in rows]
        await self._run(lambda connection: connection.executemany(sql, bound).close())

    async def now(self) -> datetime:
        return from_micros(await self.fetchval(queries.STATEMENTS.DB_NOW))

    async def notify(self, change: Change) -> None:
        """One node uses the file: it learns of its own changes by direct call."""

    async def stream(self, sql: str, *params: Any, chunk: int) -> AsyncIterator[list[tuple[Any, ...]]]:
        if self._begin:
            await self._run(lambda connection: None)  # the cursor below is aiosqlite's own
        async with self._db.execute(sql, _bind(params)) as cursor:
            instants = instant_columns([column[0] for column in cursor.description])
            while rows := await cursor.fetchmany(chunk):
                yield [tuple(values) for values in with_instants(rows, instants)]

    async def run_script(self, sql: str) -> None:
        for statement in _statements(sql):
            await self.execute(statement)

    async def dispatch(self, dispatches: Sequence[Dispatch]) -> list[Row]:
        sent = {d.run_id: d for d in dispatches}
        runs = _bind([Batch(((d.run_id, d.lease_token, d.worker_id, common.micros_of_delta(d.lease_ttl),
                              d.dispatched_at) for d in dispatches), 5)])

        def start_and_insert(connection: sqlite3.Connection) -> list[sqlite3.Row]:
            started = connection.execute(queries.DISPATCH_RUNS, runs).fetchall()
            if not started:
                return []
            attempts = [(run["run_id"], run["attempts"], run["lease_token"], run["worker_id"],
                         sent[run["run_id"]].node_id, sent[run["run_id"]].dispatched_at) for run in started]
            return connection.execute(queries.INSERT_ATTEMPTS, _bind([Batch(attempts, 6)])).fetchall()

        return cast("list[Row]", row_dicts(await self._run(start_and_insert)))

    async def extend_leases(self, heartbeats: Sequence[Heartbeat]) -> list[Heartbeat]:
        run_ids = [_json(list({h.run_id for h in heartbeats}))]

        def extend(connection: sqlite3.Connection) -> list[Heartbeat]:
            current = _attempt_keys(connection, run_ids)
            live = [h for h in heartbeats if (h.run_id, h.lease_token) in current]
            connection.executemany(queries.EXTEND_LEASES, [
                (h.run_id, h.lease_token, h.progress, h.checkpoint, h.started) for h in live]).close()
            return live

        return await self._run(extend)

    async def succeed(self, successes: Sequence[AttemptResult]) -> list[Row]:
        run_ids = [_json(list({r.run_id for r in successes}))]

        def succeed_current(connection: sqlite3.Connection) -> tuple[dict[str, AttemptResult], list[sqlite3.Row]]:
            current = _attempt_keys(connection, run_ids)
            applied = {r.run_id: r for r in successes if (r.run_id, r.lease_token) in current}
            if not applied:
                return applied, []
            rows = connection.execute(queries.SUCCEED_RUNS, [_json(list(applied))]).fetchall()
            connection.executemany(queries.SUCCEED_ATTEMPTS, [
                (r.run_id, r.lease_token, r.error_code, r.error_message, _bound(r.started_at), _bound(r.finished_at))
                for r in applied.values()]).close()
            return applied, rows

        applied, rows = await self._run(succeed_current)
        succeeded = row_dicts(rows)
        for row in succeeded:
            row["attempt_token"] = applied[row["run_id"]].lease_token
        return cast("list[Row]", succeeded)

    async def lock_concurrency_keys(self, keys: Sequence[tuple[str, str]]) -> None:
        """BEGIN IMMEDIATE already keeps every other writer from counting meanwhile."""

    async def trim_finished(self, shard_ids: Collection[int], finished_before: datetime, limit: int) -> int:
        """SQLite has one writer: a batch holds it while it deletes, and the fire path's writes
        wait. The trimmer keeps batches small (:attr:`Capabilities.trim_batch`) so that wait stays short."""
        rows = await self.fetch(queries.DOOMED_RUNS, finished_before, list(shard_ids), limit)
        doomed = [row["run_id"] for row in rows]
        await self.execute(queries.DELETE_ATTEMPTS, doomed)
        await self.execute(queries.DELETE_RUNS, doomed)
        return len(doomed)


def _attempt_keys(connection: sqlite3.Connection, run_ids: list[str]) -> set[tuple[str, int]]:
    """The (run id, lease token) of the current attempt of each run in the JSON array ``run_ids``."""
    return {(row["run_id"], row["lease_token"]) for row in connection.execute(queries.CURRENT_ATTEMPTS, run_ids)}


def _statements(script: str) -> list[str]:
    """Split a migration into statements (they hold no semicolons inside literals)."""
    lines = [line for line in script.splitlines() if not line.strip().startswith("--")]
    return [statement.strip() for statement in "\n".join(lines).split(";") if statement.strip()]
