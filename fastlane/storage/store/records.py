"""The store's records around the runs: API tokens (their records and secret hashes, never a
secret), the audit trail, tenant quotas, and history retention.

Nothing here is notified: a node reads a token when a call presents it (so a revocation reaches
other nodes as soon as they read it again), no node acts on an audit event, and quotas are read
when they are judged.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime

from fastlane.domain import validation
from fastlane.domain.access import ApiToken
from fastlane.domain.audit import DEFAULT_AUDIT_LIMIT, AuditEvent, AuditTarget
from fastlane.domain.errors import Conflict, TokenNotFound
from fastlane.domain.quotas import TenantQuota
from fastlane.domain.validation import validate_audit_event, validate_token
from fastlane.runtime.clock import ensure_utc
from fastlane.storage import codec, common
from fastlane.storage.results import TrimmedHistory
from fastlane.storage.store.database import Batch, StorePart


class SQLTokens(StorePart):
    async def create_token(self, token: ApiToken, secret_hash: bytes) -> ApiToken:
        validate_token(token)
        async with self._db.write() as tx:
            row = await tx.fetchrow(
                self._q.INSERT_TOKEN,
                token.token_id, token.tenant, token.role.value, token.name, secret_hash, token.expires_at,
            )
        if row is None:
            raise Conflict(f"token {token.token_id!r} already exists; make the new token with another id")
        return codec.build_token(row)

    async def find_token(self, token_id: str) -> tuple[ApiToken, bytes] | None:
        async with self._db.read() as tx:
            row = await tx.fetchrow(self._q.GET_TOKEN, token_id)
        return None if row is None else (codec.build_token(row), bytes(row["secret_hash"]))

    async def list_tokens(self, tenant: str | None = None) -> list[ApiToken]:
        async with self._db.read() as tx:
            rows = await tx.fetch(self._q.LIST_TOKENS, tenant)
        return [codec.build_token(row) for row in rows]

    async def revoke_token(self, token_id: str, *, tenant: str | None = None) -> ApiToken:
        async with self._db.write() as tx:
            row = await tx.fetchrow(self._q.REVOKE_TOKEN, token_id, tenant)
        if row is None:
            raise TokenNotFound(token_id)
        return codec.build_token(row)

    async def touch_tokens(self, used: Mapping[str, datetime]) -> None:
        if not used:
            return
        # In id order, so that two nodes touching the same tokens lock their rows in the same
        # order and cannot deadlock each other; ensure_utc refuses a naive time.
        batch = Batch(((token_id, ensure_utc(used[token_id])) for token_id in sorted(used)), 2)
        async with self._db.write() as tx:
            await tx.execute(self._q.TOUCH_TOKENS, batch)


class SQLAudit(StorePart):
    async def record_audit(self, events: Sequence[AuditEvent]) -> None:
        if not events:
            return
        checked = [validate_audit_event(event) for event in events]
        batch = Batch(
            ((event.tenant, str(event.action), str(event.target_kind), event.target_id, event.job_id,
              event.token_id, event.actor, event.detail) for event in checked),
            8,
        )
        async with self._db.write() as tx:
            await tx.execute(self._q.INSERT_AUDIT_EVENTS, batch)

    async def list_audit(
        self, tenant: str, *, target_kind: str, target_id: str, limit: int = DEFAULT_AUDIT_LIMIT
    ) -> list[AuditEvent]:
        kind = common.audit_listing(target_kind, target_id, limit)
        query = self._q.LIST_JOB_AUDIT if kind is AuditTarget.JOB else self._q.LIST_RUN_AUDIT
        async with self._db.read() as tx:
            rows = await tx.fetch(query, tenant, target_id, limit)
        return [codec.build_audit_event(row) for row in rows]


class SQLQuotas(StorePart):
    async def count_tenant_jobs(self, tenant: str) -> int:
        async with self._db.read() as tx:
            return int(await tx.fetchval(self._q.COUNT_TENANT_JOBS, tenant))

    async def count_waiting_runs(self, tenant: str) -> int:
        async with self._db.read() as tx:
            return int(await tx.fetchval(self._q.COUNT_WAITING_RUNS, tenant))

    async def list_quota_overrides(self) -> dict[str, TenantQuota]:
        async with self._db.read() as tx:
            rows = await tx.fetch(self._q.LIST_QUOTA_OVERRIDES)
        return {row["tenant"]: codec.build_quota(row) for row in rows}

    async def set_quota_override(self, tenant: str, quota: TenantQuota | None) -> None:
        validation.name("tenant", tenant)
        quota = quota.validated() if quota is not None else None
        async with self._db.write() as tx:
            if quota is None or quota == TenantQuota():
                await tx.execute(self._q.DELETE_QUOTA_OVERRIDE, tenant)
            else:
                await tx.execute(self._q.SET_QUOTA_OVERRIDE, tenant, quota.max_jobs, quota.job_creations_per_second,
                                 quota.max_waiting_runs)


class SQLHistory(StorePart):
    """History retention: finished runs deleted oldest first, in small batches (see
    :meth:`Tx.trim_finished` of each dialect for why batches and not partitions)."""

    async def trim_history(self, shard_ids: Collection[int], finished_before: datetime, limit: int) -> TrimmedHistory:
        common.trim_limit(limit)
        if not shard_ids:
            return TrimmedHistory(runs=0, busy_seconds=0.0)
        async with self._db.write() as tx:
            started = time.perf_counter()  # from the transaction's start (the writer's turn) to its commit
            runs = await tx.trim_finished(shard_ids, finished_before, limit)
        return TrimmedHistory(runs=runs, busy_seconds=time.perf_counter() - started)
