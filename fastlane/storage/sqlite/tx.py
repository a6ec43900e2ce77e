"""A transaction on the SQLite file, as the store speaks to it (:class:`~fastlane.storage.store.database.Tx`).

Parameters are bound as SQLite keeps them: instants as integer microseconds, lists and batches
as one JSON array (orjson writes the batch's instants as microseconds too). The hot-path
procedures take the shape SQLite needs: two statements where PostgreSQL's one statement both
updates runs and inserts attempts, and a row at a time where a value is bytes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Sequence
from datetime import datetime
from typing import Any, cast

import aiosqlite
import orjson

from fastlane.domain.records import AttemptResult, Change, Dispatch, Heartbeat
from fastlane.runtime.clock import from_micros, to_micros
from fastlane.storage import common
from fastlane.storage.codec import Row
from fastlane.storage.sqlite import queries
from fastlane.storage.sqlite.connection import fetch_all, fetch_one, fetch_value, instant_columns, with_instants
from fastlane.storage.store.database import Batch


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
    """One transaction (or the read connection) of :class:`~fastlane.storage.sqlite.connection.SQLiteDatabase`."""

    __slots__ = ("_db",)

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def fetch(self, sql: str, *params: Any) -> list[Row]:
        return cast("list[Row]", await fetch_all(self._db, sql, _bind(params)))

    async def fetchrow(self, sql: str, *params: Any) -> Row | None:
        return await fetch_one(self._db, sql, _bind(params))

    async def fetchval(self, sql: str, *params: Any) -> Any:
        return await fetch_value(self._db, sql, _bind(params))

    async def execute(self, sql: str, *params: Any) -> None:
        await self._db.execute(sql, _bind(params))

    async def execute_each(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._db.executemany(sql, [_bind(row) for row in rows])

    async def now(self) -> datetime:
        return from_micros(await fetch_value(self._db, queries.STATEMENTS.DB_NOW))

    async def notify(self, change: Change) -> None:
        """One node uses the file: it learns of its own changes by direct call."""

    async def stream(self, sql: str, *params: Any, chunk: int) -> AsyncIterator[list[tuple[Any, ...]]]:
        async with self._db.execute(sql, _bind(params)) as cursor:
            instants = instant_columns([column[0] for column in cursor.description])
            while rows := await cursor.fetchmany(chunk):
                yield [tuple(values) for values in with_instants(rows, instants)]

    async def run_script(self, sql: str) -> None:
        for statement in _statements(sql):
            await self._db.execute(statement)

    async def dispatch(self, dispatches: Sequence[Dispatch]) -> list[Row]:
        started = await self.fetch(queries.DISPATCH_RUNS, Batch(
            ((d.run_id, d.lease_token, d.worker_id, common.micros_of_delta(d.lease_ttl), d.dispatched_at)
             for d in dispatches), 5))
        if not started:
            return []
        sent = {d.run_id: d for d in dispatches}
        return await self.fetch(queries.INSERT_ATTEMPTS, Batch(
            ((run["run_id"], run["attempts"], run["lease_token"], run["worker_id"], sent[run["run_id"]].node_id,
              sent[run["run_id"]].dispatched_at) for run in started), 6))

    async def extend_leases(self, heartbeats: Sequence[Heartbeat]) -> list[Heartbeat]:
        current = await self._current_attempts(h.run_id for h in heartbeats)
        live = [h for h in heartbeats if (h.run_id, h.lease_token) in current]
        await self._db.executemany(
            queries.EXTEND_LEASES, [(h.run_id, h.lease_token, h.progress, h.checkpoint, h.started) for h in live]
        )
        return live

    async def succeed(self, successes: Sequence[AttemptResult]) -> list[Row]:
        current = await self._current_attempts(r.run_id for r in successes)
        applied = {r.run_id: r for r in successes if (r.run_id, r.lease_token) in current}
        if not applied:
            return []
        rows = await fetch_all(self._db, queries.SUCCEED_RUNS, [_json(list(applied))])
        await self._db.executemany(queries.SUCCEED_ATTEMPTS, [
            (r.run_id, r.lease_token, r.error_code, r.error_message, _bound(r.started_at), _bound(r.finished_at))
            for r in applied.values()
        ])
        for row in rows:
            row["attempt_token"] = applied[row["run_id"]].lease_token
        return cast("list[Row]", rows)

    async def _current_attempts(self, run_ids: Any) -> set[tuple[str, int]]:
        rows = await fetch_all(self._db, queries.CURRENT_ATTEMPTS, [_json(list(set(run_ids)))])
        return {(row["run_id"], row["lease_token"]) for row in rows}

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


def _statements(script: str) -> list[str]:
    """Split a migration into statements (they hold no semicolons inside literals)."""
    lines = [line for line in script.splitlines() if not line.strip().startswith("--")]
    return [statement.strip() for statement in "\n".join(lines).split(";") if statement.strip()]
