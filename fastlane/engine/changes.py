"""Acting on changes committed through other nodes (PostgreSQL NOTIFY), as soon as they commit.

Jobs created or changed, and runs triggered, replayed or cancelled through any node reach the
owner of their shard here; the owner's periodic full scan remains the safety net for anything a
dropped connection lost. Changes made through this node arrive twice (direct call, then the
notification): every action is idempotent. The actions themselves are the steps of
:mod:`.operations`, the same the servicers take.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from fastlane.domain.errors import NotFound, StorageError
from fastlane.domain.models import RunState, ShardLease
from fastlane.engine.operations import Operations
from fastlane.storage import Change, ChangeKind, Store

log = logging.getLogger("fastlane.changes")


class Ownership(Protocol):
    def fence(self, shard_id: int) -> ShardLease | None: ...

    def wake(self) -> None: ...


class ChangeFollower:
    def __init__(self, store: Store, *, operations: Operations, ownership: Ownership) -> None:
        self._store = store
        self._operations = operations
        self._ownership = ownership
        self._queue: asyncio.Queue[Change] = asyncio.Queue()

    def enqueue(self, change: Change) -> None:
        """Called from the listener: cheap, never blocks."""
        if change.kind is ChangeKind.MEMBERS:
            self._ownership.wake()
        elif self._ownership.fence(change.shard_id) is not None:
            self._queue.put_nowait(change)

    async def run(self) -> None:
        while True:
            change = await self._queue.get()
            try:
                await self._apply(change)
            except NotFound:
                if change.kind is ChangeKind.JOB:
                    self._operations.job_gone(change.key)
            except StorageError as error:
                log.warning("could not follow %s %s (the full scan will): %s", change.kind, change.key, error)
            except Exception:
                # One change this code cannot handle must not stop the others from being followed.
                log.exception("following %s %s failed; set aside (the full scan will pick it up)",
                              change.kind, change.key)

    async def _apply(self, change: Change) -> None:
        operations = self._operations
        if change.kind is ChangeKind.JOB:
            operations.job_changed(await self._store.jobs.get_job(change.tenant, change.key))
        elif change.kind is ChangeKind.JOB_DELETED:
            operations.job_deleted(change.key)
        elif change.kind is ChangeKind.RUN:
            run = await self._store.runs.get_run(change.tenant, change.key)
            if run.state is RunState.SCHEDULED:
                operations.run_scheduled(run, recovered=True)
            elif run.state is RunState.CANCELLED:
                operations.run_cancelled(run)
            elif run.cancel_requested:
                operations.run_cancel_requested(run)
