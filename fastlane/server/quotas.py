"""Checking a tenant's quotas before the API adds work for it.

Counts come from the database at the moment of the call (the tenant's jobs; its runs waiting for a
worker), so every node judges the same numbers. They are checked before the write, not in its
transaction: two calls racing at the limit may both pass, so a quota can be exceeded by the
number of calls in flight at that moment — a soft limit, traded for not serialising every
creation of a tenant. The creation rate is a token bucket per tenant on each node: N nodes admit
up to N times the rate, and no database write is spent on counting calls.

Per-tenant overrides are read from the database every few seconds (and at once after a change
made through this node).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from fastlane.domain.errors import QuotaExceeded
from fastlane.domain.quotas import TenantQuota
from fastlane.storage import Store

OVERRIDES_TTL_SECONDS = 5.0
MAX_BUCKETS = 100_000  # tenants with a creation bucket in memory; beyond it every bucket is refilled


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float  # monotonic seconds


class QuotaGuard:
    """Admits or refuses, per tenant, the API calls that add jobs or runs.

    Args:
        store: Where the counts and the per-tenant overrides are.
        defaults: The node's quotas for tenants without an override.
    """

    def __init__(self, store: Store, defaults: TenantQuota, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._defaults = defaults
        self._monotonic = monotonic
        self._overrides: dict[str, TenantQuota] = {}
        self._overrides_read_at: float | None = None
        self._buckets: dict[str, _Bucket] = {}

    async def quota_of(self, tenant: str) -> TenantQuota:
        """The quotas in force for ``tenant``: its override over the node's defaults."""
        now = self._monotonic()
        if self._overrides_read_at is None or now - self._overrides_read_at >= OVERRIDES_TTL_SECONDS:
            self._overrides = await self._store.quotas.list_quota_overrides()
            self._overrides_read_at = now
        override = self._overrides.get(tenant)
        return override.over(self._defaults) if override is not None else self._defaults

    def overrides_changed(self) -> None:
        """An override was set through this node: read them again on the next call."""
        self._overrides_read_at = None

    async def admit_job(self, tenant: str, *, adds_a_run: bool = False) -> None:
        """Before creating a job: its creation rate, its job count and, for a job that runs at once
        (``adds_a_run``), its waiting runs. Raises :class:`QuotaExceeded` naming the quota."""
        quota = await self.quota_of(tenant)
        self._take_creation(tenant, quota.job_creations_per_second)
        if quota.max_jobs is not None:
            jobs = await self._store.quotas.count_tenant_jobs(tenant)
            if jobs >= quota.max_jobs:
                raise QuotaExceeded(f"tenant {tenant!r} has {jobs:,} jobs; its quota max_jobs is {quota.max_jobs:,}")
        if adds_a_run:
            await self._check_waiting(tenant, quota)

    async def admit_run(self, tenant: str) -> None:
        """Before adding a run through the API (trigger, retry): the tenant's waiting runs."""
        await self._check_waiting(tenant, await self.quota_of(tenant))

    async def _check_waiting(self, tenant: str, quota: TenantQuota) -> None:
        if quota.max_waiting_runs is None:
            return
        waiting = await self._store.quotas.count_waiting_runs(tenant)
        if waiting >= quota.max_waiting_runs:
            raise QuotaExceeded(f"tenant {tenant!r} has {waiting:,} runs waiting for a worker; its quota "
                                f"max_waiting_runs is {quota.max_waiting_runs:,}")

    def _take_creation(self, tenant: str, rate: float | None) -> None:
        if rate is None:
            return
        now = self._monotonic()
        capacity = max(1.0, rate)  # one second's worth: a short burst passes, a flood does not
        bucket = self._buckets.get(tenant)
        if bucket is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self._buckets.clear()
            bucket = self._buckets[tenant] = _Bucket(capacity, now)
        bucket.tokens = min(capacity, bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens < 1.0:
            raise QuotaExceeded(f"tenant {tenant!r} creates jobs faster than its quota job_creations_per_second "
                                f"of {rate:g} allows; try again shortly")
        bucket.tokens -= 1.0
