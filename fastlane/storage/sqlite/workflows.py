"""The SQLite store's transactions for workflows (the logic is in :mod:`fastlane.storage.workflows`).

The shared SQL is PostgreSQL's: ``$n`` placeholders become SQLite's ``?n``, instants are bound as
microseconds and lists as the JSON array ``json_each`` expands.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import AsyncIterator, Collection, Sequence
from datetime import datetime
from typing import Any

import aiosqlite

from fastlane.domain.models import Run
from fastlane.storage.sqlite import queries
from fastlane.storage.sqlite.connection import SQLiteConnections, fetch_all, fetch_one, instant, json_array
from fastlane.storage.sqlite.runs import release_buffered
from fastlane.storage.workflows import WorkflowMethods, WorkflowTx

_PLACEHOLDER = re.compile(r"\$(\d+)")


@functools.cache
def _sql(template: str) -> str:
    sql = template.format(NOW=queries.NOW, LOCK="", IN="IN (SELECT value FROM json_each($1))")
    return _PLACEHOLDER.sub(r"?\1", sql)


def _bound(value: Any) -> Any:
    if isinstance(value, datetime):
        return instant(value)
    if isinstance(value, list):
        return json_array(value)
    return value


class _Tx:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def fetch(self, sql: str, *params: Any) -> list[Any]:
        return await fetch_all(self._db, _sql(sql), [_bound(p) for p in params])

    async def fetchrow(self, sql: str, *params: Any) -> Any | None:
        return await fetch_one(self._db, _sql(sql), [_bound(p) for p in params])

    async def execute(self, sql: str, *params: Any) -> None:
        await self._db.execute(_sql(sql), [_bound(p) for p in params])

    async def release_buffered(self, job_ids: Collection[str]) -> list[Run]:
        return await release_buffered(self._db, job_ids)

    async def notify(self, runs: Sequence[Run]) -> None:
        """One node: the engine is told by the caller, nothing to send."""


class SQLiteWorkflows(WorkflowMethods, SQLiteConnections):
    """Workflow methods of :class:`~fastlane.storage.sqlite.SQLiteStore`."""

    @contextlib.asynccontextmanager
    async def _workflow_tx(self, *, write: bool = True, released_here: Collection[int] = ()) -> AsyncIterator[WorkflowTx]:
        async with self._transaction() if write else self._read() as db:
            yield _Tx(db)
