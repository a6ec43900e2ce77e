"""The PostgreSQL store's transactions for workflows (the logic is in :mod:`fastlane.storage.workflows`)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Collection, Sequence
from typing import Any

from fastlane.domain.models import Run, RunState
from fastlane.domain.records import Change, ChangeKind
from fastlane.storage.postgres.changes import notify
from fastlane.storage.postgres.connection import PoolConnection, PostgresConnections
from fastlane.storage.postgres.runs import release_buffered
from fastlane.storage.workflows import WorkflowMethods, WorkflowTx


@functools.cache
def _sql(template: str) -> str:
    return template.format(NOW="clock_timestamp()", LOCK="FOR UPDATE", IN="= ANY($1::integer[])")


class _Tx:
    def __init__(self, db: PoolConnection, released_here: Collection[int]) -> None:
        self._db = db
        self._released_here = released_here

    async def fetch(self, sql: str, *params: Any) -> list[Any]:
        return list(await self._db.fetch(_sql(sql), *params))

    async def fetchrow(self, sql: str, *params: Any) -> Any | None:
        return await self._db.fetchrow(_sql(sql), *params)

    async def execute(self, sql: str, *params: Any) -> None:
        await self._db.execute(_sql(sql), *params)

    async def release_buffered(self, job_ids: Collection[str]) -> list[Run]:
        return await release_buffered(self._db, job_ids)

    async def notify(self, runs: Sequence[Run]) -> None:
        for run in runs:
            if run.state is not RunState.SCHEDULED or run.shard_id not in self._released_here:
                await notify(self._db, Change(ChangeKind.RUN, run.shard_id, run.tenant, run.run_id))


class PostgresWorkflows(WorkflowMethods, PostgresConnections):
    """Workflow methods of :class:`~fastlane.storage.postgres.PostgresStore`."""

    @contextlib.asynccontextmanager
    async def _workflow_tx(self, *, write: bool = True, released_here: Collection[int] = ()) -> AsyncIterator[WorkflowTx]:
        async with self._transaction() if write else self._connection() as db:
            yield _Tx(db, released_here)
