"""Tenant quotas through a real node on both backends: beyond a limit the API answers
RESOURCE_EXHAUSTED naming the quota and its limit; overrides are an admin's to set."""

from __future__ import annotations

from datetime import timedelta

import grpc
import pytest

from fastlane.domain.models import Schedule
from fastlane.domain.quotas import TenantQuota
from fastlane.errors import RemoteError
from fastlane.server.settings import DEFAULT_QUOTAS

HOURLY = Schedule.interval(timedelta(hours=1))


async def exhausted(call) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(RemoteError) as refused:
        await call
    assert refused.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
    return str(refused.value)


async def test_each_quota_refuses_the_call_beyond_it_and_names_itself(secured):
    node = secured
    async with node.client("admin") as admin, node.client("client-a") as a, node.client("client-b") as b:
        in_force, override = await admin.set_quota("a", TenantQuota(max_jobs=2, max_waiting_runs=1))
        assert override == TenantQuota(max_jobs=2, max_waiting_runs=1)
        assert in_force == TenantQuota(max_jobs=2, max_waiting_runs=1,
                                       job_creations_per_second=DEFAULT_QUOTAS.job_creations_per_second)
        await admin.set_quota("b", TenantQuota(job_creations_per_second=1))

        first = await a.create("one", "t", HOURLY)
        await a.create("two", "t", HOURLY)
        message = await exhausted(a.create("three", "t", HOURLY))
        assert "max_jobs is 2" in message and "'a'" in message
        await b.create("b-one", "t", HOURLY)  # b's limits are its own
        assert "job_creations_per_second of 1" in await exhausted(b.create("b-two", "t", HOURLY))

        await a.trigger_job(first.job_id)  # no worker: it waits
        assert "max_waiting_runs is 1" in await exhausted(a.trigger_job(first.job_id))

        # Raised again, the same calls pass: nothing but the quota stood in the way.
        await admin.set_quota("a", TenantQuota(max_jobs=3, max_waiting_runs=2))
        await a.create("three", "t", HOURLY)
        await a.trigger_job(first.job_id)
        await admin.set_quota("a", None)
        assert await a.get_quota() == (DEFAULT_QUOTAS, TenantQuota())


async def test_only_an_admin_sets_quotas_and_a_tenant_sees_only_its_own(secured):
    node = secured
    async with node.client("client-a") as a, node.client("viewer-a") as viewer, node.client("admin") as admin:
        await admin.set_quota("b", TenantQuota(max_jobs=5))
        for caller in (a, viewer):
            with pytest.raises(RemoteError) as refused:
                await caller.set_quota("a", TenantQuota(max_jobs=10**6))
            assert refused.value.code is grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(RemoteError) as other_tenant:
                await caller.get_quota("b")
            assert other_tenant.value.code is grpc.StatusCode.PERMISSION_DENIED
            assert await caller.get_quota() == (DEFAULT_QUOTAS, TenantQuota())
        assert (await admin.get_quota("b"))[1] == TenantQuota(max_jobs=5)
        with pytest.raises(RemoteError) as bad:
            await admin.set_quota("b", TenantQuota(max_jobs=-3))
        assert bad.value.code is grpc.StatusCode.INVALID_ARGUMENT and "max_jobs" in str(bad.value)
