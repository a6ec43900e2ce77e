"""The one store: every :class:`~fastlane.storage.base.Store` method, written once over a dialect's
:class:`~fastlane.storage.store.database.Database` (SQLite or PostgreSQL).

Its parts, one concept each: ``jobs``, ``lane`` (the fast lane), ``runs``, ``attempts``
(dispatches, heartbeats, results), ``shards`` (leases and membership), ``records`` (API tokens,
the audit trail, quotas, history retention), ``backfills`` (runs of past fire times) and the
workflow methods of
:mod:`fastlane.storage.workflows`; ``statements`` holds the SQL, written once.
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from datetime import datetime
from typing import Any

from fastlane.domain.errors import StorageError, StorageUnavailable
from fastlane.domain.models import Run, RunState
from fastlane.domain.records import Change, ChangeKind
from fastlane.errors import ConfigurationError
from fastlane.storage.base import Store
from fastlane.storage.capabilities import Capabilities
from fastlane.storage.migrations import migrations_for
from fastlane.storage.store.attempts import SQLAttempts, release_buffered
from fastlane.storage.store.backfills import SQLBackfills
from fastlane.storage.store.database import Database, Tx
from fastlane.storage.store.jobs import SQLJobs
from fastlane.storage.store.lane import SQLLane
from fastlane.storage.store.records import SQLAudit, SQLHistory, SQLQuotas, SQLTokens
from fastlane.storage.store.runs import SQLRuns
from fastlane.storage.store.shards import SQLShards
from fastlane.storage.store.statements import Statements
from fastlane.storage.workflows import SQLWorkflows, WorkflowTx

__all__ = ["Capabilities", "Database", "SQLStore"]


class SQLStore(Store):
    """The store over one database, whichever its dialect: the lifecycle here, composed of one
    part per concept (see :class:`~fastlane.storage.base.Store`)."""

    def __init__(self, database: Database, *, shard_count: int, rng: random.Random | None = None) -> None:
        self._db = database
        self._q = database.statements
        self._requested_shards = shard_count
        self._shard_count: int | None = None
        self.url = database.url
        rng = rng or random.Random()
        count = self.shard_count
        self.jobs = SQLJobs(database, count, rng)
        self.lane = SQLLane(database, count, rng)
        self.runs = SQLRuns(database, count, rng)
        self.attempts = SQLAttempts(database, count, rng)
        self.shards = SQLShards(database, count, rng)
        self.tokens = SQLTokens(database, count, rng)
        self.audit = SQLAudit(database, count, rng)
        self.quotas = SQLQuotas(database, count, rng)
        self.history = SQLHistory(database, count, rng)
        self.workflows = SQLWorkflows(self._workflow_tx, self.jobs, count)
        self.backfills = SQLBackfills(database, count, rng)

    @property
    def database(self) -> Database:
        """The dialect's connections (for tests and tools that need the database itself)."""
        return self._db

    @property
    def capabilities(self) -> Capabilities:
        return self._db.capabilities

    @property
    def dialect(self) -> str:
        """The dialect's name, as its migrations folder is named."""
        return self._db.name

    @property
    def server_epoch(self) -> int:
        return self._db.server_epoch

    @property
    def write_fault(self) -> str | None:
        """What keeps every write from committing, with its fix, or None (see
        :attr:`Capabilities.write_faults`; always None where the backend does not report them)."""
        return self._db.write_fault

    async def write_fault_changed(self, fault: str | None) -> None:
        """Return once :attr:`write_fault` differs from ``fault``."""
        await self._db.write_fault_changed(fault)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def migrate(self) -> int:
        q = self._q
        async with self._db.migrating() as tx:
            current = int(await tx.fetchval(q.SCHEMA_VERSION)) if await tx.fetchval(q.META_TABLE_EXISTS) else 0
            migrations = migrations_for(self._db.name)
            for migration in migrations:
                if migration.version > current:
                    await tx.run_script(migration.sql)
                    await tx.execute(q.SET_SCHEMA_VERSION, str(migration.version))
            await tx.execute(q.INIT_SHARD_COUNT, str(self._requested_shards))
            count = int(await tx.fetchval(q.SHARD_COUNT))
            await tx.execute(q.CREATE_SHARDS, count)
            self._shard_count = count
            return migrations[-1].version if migrations else 0

    async def shard_count(self) -> int:
        if self._shard_count is None:
            async with self._db.read() as tx:
                try:
                    value = await tx.fetchval(self._q.SHARD_COUNT)
                except StorageUnavailable:
                    raise
                except StorageError:  # no such table yet
                    value = None
            if value is None:
                raise ConfigurationError("the database is not migrated: run `fastlane migrate --db URL`")
            self._shard_count = int(value)
        return self._shard_count

    async def db_now(self) -> datetime:
        async with self._db.read() as tx:
            return await tx.now()

    async def close(self) -> None:
        await self._db.close()

    async def watch_changes(self, on_change: Callable[[Change], None]) -> None:
        await self._db.watch_changes(on_change)

    # -- workflows' transactions -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _workflow_tx(self, *, write: bool = True,
                           released_here: Collection[int] = ()) -> AsyncIterator[WorkflowTx]:
        async with self._db.write() if write else self._db.read() as tx:
            yield _WorkflowTx(tx, self._q, self._db.translate, released_here)


class _WorkflowTx:
    """A transaction as :mod:`fastlane.storage.workflows` speaks to it: its SQL is PostgreSQL's
    with three placeholders (``{NOW}``, ``{LOCK}``, ``{IN}``), said in the dialect's SQL."""

    def __init__(self, tx: Tx, q: Statements, translate: Callable[[str], str], released_here: Collection[int]) -> None:
        self._tx = tx
        self._q = q
        self._translate = translate
        self._released_here = released_here

    def _sql(self, template: str) -> str:
        return _workflow_sql(template, self._translate)

    async def fetch(self, sql: str, *params: Any) -> list[Any]:
        return list(await self._tx.fetch(self._sql(sql), *params))

    async def fetchrow(self, sql: str, *params: Any) -> Any | None:
        return await self._tx.fetchrow(self._sql(sql), *params)

    async def execute(self, sql: str, *params: Any) -> None:
        await self._tx.execute(self._sql(sql), *params)

    async def release_buffered(self, job_ids: Collection[str]) -> list[Run]:
        return await release_buffered(self._tx, self._q, job_ids)

    async def notify(self, runs: Sequence[Run]) -> None:
        for run in runs:
            if run.state is not RunState.SCHEDULED or run.shard_id not in self._released_here:
                await self._tx.notify(Change(ChangeKind.RUN, run.shard_id, run.tenant, run.run_id))


@functools.cache
def _workflow_sql(template: str, translate: Callable[[str], str]) -> str:
    return translate(template.format(NOW="clock_timestamp()", LOCK="FOR UPDATE", IN="= ANY($1::integer[])"))
