"""Writing audit events: durable before the call that made them returns, grouped under load.

Each user step waits for its event to be written (the trail is history, not a best effort), but
the events of calls that arrive while a write is under way go together in the next one: one
transaction for many events (a group commit). A lone call costs one write; 200 concurrent job
creations cost a handful of writes instead of 200. A write per call would add a transaction to
every job creation, and on SQLite, whose one writer serves every transaction in turn, that would
bound how many jobs the API creates a second.

A write that fails is not the caller's failure: the change it records is already committed, and
failing the call would invite the caller to make it again. The event is logged whole instead, so
the trail can be restored from the log.
"""

from __future__ import annotations

import asyncio
import logging

from fastlane.domain.audit import AuditEvent
from fastlane.domain.errors import StorageUnavailable
from fastlane.storage import Store

log = logging.getLogger("fastlane.audit")


class AuditTrail:
    """Records audit events for the user steps of one node."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._pending: list[tuple[AuditEvent, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def record(self, event: AuditEvent) -> None:
        """Return once ``event`` is written (or its failure logged). A caller cancelled meanwhile
        stops waiting; the event is written all the same."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((event, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_pending(), name="audit-trail")
        await asyncio.shield(done)

    async def _write_pending(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            await self._write([event for event, _ in batch])
            for _, done in batch:
                if not done.done():
                    done.set_result(None)

    async def _write(self, events: list[AuditEvent]) -> None:
        try:
            await self._store.audit.record_audit(events)
            return
        except StorageUnavailable as error:
            failed: list[tuple[AuditEvent, Exception]] = [(event, error) for event in events]
        except Exception as error:  # one bad event must not cost the others their record
            if len(events) == 1:
                failed = [(events[0], error)]
            else:
                for event in events:
                    await self._write([event])
                return
        for event, reason in failed:
            log.warning("audit event not recorded (%s): %r", reason, event)
