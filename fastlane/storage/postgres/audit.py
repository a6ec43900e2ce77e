"""The PostgreSQL store's audit trail: who changed which job or run, and when (:mod:`fastlane.domain.audit`).

Nothing here is notified: no node acts on an audit event; they are only read back.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastlane.domain.audit import DEFAULT_AUDIT_LIMIT, AuditEvent, AuditTarget
from fastlane.domain.validation import validate_audit_event
from fastlane.storage import codec, common
from fastlane.storage.postgres import queries
from fastlane.storage.postgres.connection import PostgresConnections


class PostgresAudit(PostgresConnections):
    """Audit trail methods of :class:`~fastlane.storage.postgres.PostgresStore`."""

    async def record_audit(self, events: Sequence[AuditEvent]) -> None:
        if not events:
            return
        checked = [validate_audit_event(event) for event in events]
        async with self._transaction() as db:
            await db.execute(
                queries.INSERT_AUDIT_EVENTS,
                [event.tenant for event in checked],
                [str(event.action) for event in checked],
                [str(event.target_kind) for event in checked],
                [event.target_id for event in checked],
                [event.job_id for event in checked],
                [event.token_id for event in checked],
                [event.actor for event in checked],
                [event.detail for event in checked],
            )

    async def list_audit(
        self, tenant: str, *, target_kind: str, target_id: str, limit: int = DEFAULT_AUDIT_LIMIT
    ) -> list[AuditEvent]:
        kind = common.audit_listing(target_kind, target_id, limit)
        query = queries.LIST_JOB_AUDIT if kind is AuditTarget.JOB else queries.LIST_RUN_AUDIT
        async with self._connection() as db:
            rows = await db.fetch(query, tenant, target_id, limit)
        return [codec.build_audit_event(row) for row in rows]
