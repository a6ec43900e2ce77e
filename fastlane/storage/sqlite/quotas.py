"""The SQLite store's side of tenant quotas: the counts they are judged on, and the overrides."""

from __future__ import annotations

from fastlane.domain import validation
from fastlane.domain.quotas import TenantQuota
from fastlane.storage import codec
from fastlane.storage.sqlite import queries
from fastlane.storage.sqlite.connection import SQLiteConnections, fetch_all, fetch_value


class SQLiteQuotas(SQLiteConnections):
    """Quota methods of :class:`~fastlane.storage.sqlite.SQLiteStore`."""

    async def count_tenant_jobs(self, tenant: str) -> int:
        async with self._read() as db:
            return int(await fetch_value(db, queries.COUNT_TENANT_JOBS, (tenant,)))

    async def count_waiting_runs(self, tenant: str) -> int:
        async with self._read() as db:
            return int(await fetch_value(db, queries.COUNT_WAITING_RUNS, (tenant,)))

    async def list_quota_overrides(self) -> dict[str, TenantQuota]:
        async with self._read() as db:
            rows = await fetch_all(db, queries.LIST_QUOTA_OVERRIDES, ())
        return {row["tenant"]: codec.build_quota(row) for row in rows}

    async def set_quota_override(self, tenant: str, quota: TenantQuota | None) -> None:
        validation.name("tenant", tenant)
        quota = quota.validated() if quota is not None else None
        async with self._transaction() as db:
            if quota is None or quota == TenantQuota():
                await db.execute(queries.DELETE_QUOTA_OVERRIDE, (tenant,))
            else:
                await db.execute(queries.SET_QUOTA_OVERRIDE, (tenant, quota.max_jobs, quota.job_creations_per_second,
                                                             quota.max_waiting_runs))
