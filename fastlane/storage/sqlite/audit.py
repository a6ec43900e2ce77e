"""The SQLite store's audit trail: who changed which job or run, and when (:mod:`fastlane.domain.audit`)."""

from __future__ import annotations

from collections.abc import Sequence

from fastlane.domain.audit import DEFAULT_AUDIT_LIMIT, AuditEvent, AuditTarget
from fastlane.domain.validation import validate_audit_event
from fastlane.storage import codec, common
from fastlane.storage.sqlite import queries
from fastlane.storage.sqlite.connection import SQLiteConnections, fetch_all, json_array


class SQLiteAudit(SQLiteConnections):
    """Audit trail methods of :class:`~fastlane.storage.sqlite.SQLiteStore`."""

    async def record_audit(self, events: Sequence[AuditEvent]) -> None:
        if not events:
            return
        checked = [validate_audit_event(event) for event in events]
        batch = json_array(
            [event.tenant, str(event.action), str(event.target_kind), event.target_id, event.job_id,
             event.token_id, event.actor, event.detail]
            for event in checked
        )
        async with self._transaction() as db:
            await db.execute(queries.INSERT_AUDIT_EVENTS, (batch,))

    async def list_audit(
        self, tenant: str, *, target_kind: str, target_id: str, limit: int = DEFAULT_AUDIT_LIMIT
    ) -> list[AuditEvent]:
        kind = common.audit_listing(target_kind, target_id, limit)
        query = queries.LIST_JOB_AUDIT if kind is AuditTarget.JOB else queries.LIST_RUN_AUDIT
        async with self._read() as db:
            rows = await fetch_all(db, query, (tenant, target_id, limit))
        return [codec.build_audit_event(row) for row in rows]
