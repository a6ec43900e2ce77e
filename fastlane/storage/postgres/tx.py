"""A transaction on PostgreSQL, as the store speaks to it (:class:`~fastlane.storage.store.database.Tx`).

A :class:`~fastlane.storage.store.database.Batch` is bound as one array per column, for ``unnest``:
one statement per batch, never a statement per row. Every write another node must hear of is
notified inside its transaction (NOTIFY is delivered at commit).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Sequence
from datetime import datetime
from typing import Any

from fastlane.domain.records import AttemptResult, Change, Dispatch, Heartbeat
from fastlane.storage import common
from fastlane.storage.codec import Row
from fastlane.storage.postgres import queries
from fastlane.storage.postgres.connection import PoolConnection
from fastlane.storage.store.database import Batch

CHANGES_CHANNEL = "fastlane_changes"


def _bind(params: Sequence[Any]) -> Sequence[Any]:
    if not any(isinstance(value, Batch) for value in params):
        return params
    bound: list[Any] = []
    for value in params:
        if isinstance(value, Batch):
            bound += [list(column) for column in zip(*value.rows, strict=True)] if value.rows else [[]] * value.width
        else:
            bound.append(value)
    return bound


class PostgresTx:
    """One transaction (or, for reads, one pooled connection) on PostgreSQL."""

    __slots__ = ("_db",)

    def __init__(self, db: PoolConnection) -> None:
        self._db = db

    async def fetch(self, sql: str, *params: Any) -> list[Row]:
        return list(await self._db.fetch(sql, *_bind(params)))

    async def fetchrow(self, sql: str, *params: Any) -> Row | None:
        return await self._db.fetchrow(sql, *_bind(params))

    async def fetchval(self, sql: str, *params: Any) -> Any:
        return await self._db.fetchval(sql, *_bind(params))

    async def execute(self, sql: str, *params: Any) -> None:
        await self._db.execute(sql, *_bind(params))

    async def execute_each(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._db.executemany(sql, rows)

    async def now(self) -> datetime:
        now: datetime = await self._db.fetchval(queries.STATEMENTS.DB_NOW)
        return now

    async def notify(self, change: Change) -> None:
        """Tell every node of a change; PostgreSQL delivers it only if this transaction commits."""
        await self._db.execute(queries.NOTIFY, CHANGES_CHANNEL, common.encode_change(change))

    async def stream(self, sql: str, *params: Any, chunk: int) -> AsyncIterator[list[tuple[Any, ...]]]:
        async with self._db.transaction():  # a cursor lives in a transaction
            cursor = await self._db.cursor(sql, *_bind(params))
            while rows := await cursor.fetch(chunk):
                yield rows  # type: ignore[misc]  # asyncpg's Records unpack as tuples do

    async def run_script(self, sql: str) -> None:
        await self._db.execute(sql)

    async def dispatch(self, dispatches: Sequence[Dispatch]) -> list[Row]:
        return await self.fetch(queries.DISPATCH_RUNS, Batch(
            ((d.run_id, d.lease_token, d.worker_id, d.node_id, common.micros_of_delta(d.lease_ttl), d.dispatched_at)
             for d in dispatches), 6))

    async def extend_leases(self, heartbeats: Sequence[Heartbeat]) -> list[Heartbeat]:
        rows = await self.fetch(queries.EXTEND_LEASES, Batch(
            ((h.run_id, h.lease_token, h.progress, h.checkpoint, h.started) for h in heartbeats), 5))
        current = {(row["run_id"], row["lease_token"]) for row in rows}
        return [h for h in heartbeats if (h.run_id, h.lease_token) in current]

    async def succeed(self, successes: Sequence[AttemptResult]) -> list[Row]:
        rows = await self.fetch(queries.SUCCEED_RUNS, Batch(((r.run_id, r.lease_token) for r in successes), 2))
        attempt_of = {(row["run_id"], row["attempt_token"]): row["attempts"] for row in rows}
        if done := [r for r in successes if (r.run_id, r.lease_token) in attempt_of]:
            matched = await self.fetch(queries.SUCCEED_ATTEMPTS, Batch(
                ((r.run_id, attempt_of[r.run_id, r.lease_token], r.lease_token, r.error_code, r.error_message,
                  r.started_at, r.finished_at) for r in done), 7))
            # A run id is enough: SUCCEED_RUNS matched one token per run.
            numbered = {row["run_id"] for row in matched}
            if missed := [r for r in done if r.run_id not in numbered]:
                await self.execute(queries.SUCCEED_ATTEMPTS_BY_TOKEN, Batch(
                    ((r.run_id, r.lease_token, r.error_code, r.error_message, r.started_at, r.finished_at)
                     for r in missed), 6))
        return rows

    async def lock_concurrency_keys(self, keys: Sequence[tuple[str, str]]) -> None:
        await self.execute(queries.LOCK_CONCURRENCY_KEYS, Batch(keys, 2))

    async def trim_finished(self, shard_ids: Collection[int], finished_before: datetime, limit: int) -> int:
        return int(await self.fetchval(queries.TRIM_HISTORY, finished_before, list(shard_ids), limit))
