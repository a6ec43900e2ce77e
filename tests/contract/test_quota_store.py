"""The store's side of tenant quotas, on both backends: the counts and the overrides."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fastlane.domain.models import JobSpec, Schedule
from fastlane.domain.quotas import TenantQuota
from fastlane.errors import InvalidArgument

HOURLY = Schedule.interval(timedelta(hours=1))


@pytest.fixture
async def store(make_store):
    store = make_store(shard_count=4)
    await store.migrate()
    yield store
    await store.close()


async def test_jobs_are_counted_per_tenant(store):
    for tenant, names in (("a", ["j1", "j2", "j3"]), ("b", ["j1"])):
        for name in names:
            await store.jobs.create_job(JobSpec(tenant=tenant, name=name, job_type="t", schedule=HOURLY))
    assert [await store.quotas.count_tenant_jobs(t) for t in ("a", "b", "c")] == [3, 1, 0]
    job = (await store.jobs.list_jobs("a")).items[0]
    await store.jobs.delete_job("a", job.job_id)
    assert await store.quotas.count_tenant_jobs("a") == 2


async def test_waiting_runs_are_the_tenant_due_runs_no_worker_took(store):
    a_job, _ = await store.jobs.create_job(JobSpec(tenant="a", name="j", job_type="t", schedule=HOURLY))
    b_job, _ = await store.jobs.create_job(JobSpec(tenant="b", name="j", job_type="t", schedule=HOURLY))
    first = await store.runs.create_manual_run("a", a_job.job_id)
    await store.runs.create_manual_run("a", a_job.job_id)
    await store.runs.create_manual_run("b", b_job.job_id)
    assert (await store.quotas.count_waiting_runs("a"), await store.quotas.count_waiting_runs("b")) == (2, 1)

    await store.runs.cancel_run("a", first.run_id)  # no longer waiting
    assert await store.quotas.count_waiting_runs("a") == 1


async def test_an_override_is_set_replaced_and_removed(store):
    assert await store.quotas.list_quota_overrides() == {}
    await store.quotas.set_quota_override("a", TenantQuota(max_jobs=10, job_creations_per_second=2.5))
    await store.quotas.set_quota_override("b", TenantQuota(max_waiting_runs=0))
    assert await store.quotas.list_quota_overrides() == {
        "a": TenantQuota(max_jobs=10, job_creations_per_second=2.5),
        "b": TenantQuota(max_waiting_runs=0),
    }
    await store.quotas.set_quota_override("a", TenantQuota(max_waiting_runs=7))  # replaced whole, not merged
    assert (await store.quotas.list_quota_overrides())["a"] == TenantQuota(max_waiting_runs=7)
    await store.quotas.set_quota_override("a", None)
    await store.quotas.set_quota_override("b", TenantQuota())  # nothing set: the same as removing it
    assert await store.quotas.list_quota_overrides() == {}


@pytest.mark.parametrize("tenant, quota, field", [
    ("no spaces", TenantQuota(max_jobs=1), "tenant"),
    ("a", TenantQuota(max_jobs=-1), "max_jobs"),
    ("a", TenantQuota(max_waiting_runs=10**12), "max_waiting_runs"),
    ("a", TenantQuota(job_creations_per_second=float("nan")), "job_creations_per_second"),
    ("a", TenantQuota(job_creations_per_second=-0.5), "job_creations_per_second"),
])
async def test_an_override_out_of_bounds_is_refused(store, tenant, quota, field):
    with pytest.raises(InvalidArgument) as refused:
        await store.quotas.set_quota_override(tenant, quota)
    assert refused.value.field == field
    assert await store.quotas.list_quota_overrides() == {}


def test_an_override_falls_back_to_the_defaults_field_by_field():
    defaults = TenantQuota(max_jobs=100, job_creations_per_second=10.0, max_waiting_runs=1000)
    assert TenantQuota(max_jobs=5).over(defaults) == TenantQuota(max_jobs=5, job_creations_per_second=10.0,
                                                                 max_waiting_runs=1000)
    assert TenantQuota().over(defaults) == defaults
