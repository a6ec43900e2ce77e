"""Concurrency keys in the Store contract, on SQLite and PostgreSQL: runs carry their job's key,
and a capped dispatch starts a run only while its key has room, also when two nodes race."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime, timedelta

import pytest
from old_schemas import read_without_later_columns

from fastlane.domain.models import AttemptOutcome, JobSpec, RetryPolicy, RunState, Schedule
from fastlane.domain.records import KeyCap
from fastlane.storage import AttemptResult, Dispatch
from fastlane.storage.base import Store
from fastlane.storage.migrations import migrations_for
from fastlane.storage.store import SQLStore

SHARDS = 4
TTL = timedelta(seconds=30)


@pytest.fixture
async def store(make_store):
    store = make_store(shard_count=SHARDS)
    await store.migrate()
    yield store
    await store.close()


async def keyed_runs(store: Store, count: int, *, key: str = "ledger", limit: int | None = 3, tenant: str = "default",
                     retry: RetryPolicy | None = None):
    """``count`` scheduled runs of as many jobs sharing ``key``, oldest first."""
    now = await store.db_now()
    runs = []
    for index in range(count):
        spec = JobSpec(name=f"{key}-{index}", tenant=tenant, job_type="ledger.post",
                       schedule=Schedule.at_instant(now + timedelta(minutes=5)),
                       concurrency_key=key, concurrency_limit=limit, retry=retry or RetryPolicy())
        job, _ = await store.jobs.create_job(spec)
        runs.append(await store.runs.create_manual_run(tenant, job.job_id))
    return runs


def dispatch(run, token: int, cap_limit: int | None = None) -> Dispatch:
    return Dispatch(run_id=run.run_id, lease_token=token, worker_id="w", node_id="n", lease_ttl=TTL,
                    dispatched_at=datetime.now(UTC),
                    cap=KeyCap(run.tenant, run.concurrency_key, cap_limit or run.concurrency_limit))


async def test_a_database_with_jobs_migrates_and_their_runs_have_no_key(make_store, monkeypatch):
    store = make_store(shard_count=SHARDS)
    store_module = sys.modules[SQLStore.__module__]
    monkeypatch.setattr(store_module, "migrations_for", lambda dialect: migrations_for(dialect)[:7])
    read_without_later_columns(monkeypatch)
    try:
        assert await store.migrate() == 7
        job, _ = await store.jobs.create_job(JobSpec(name="old", job_type="t", schedule=Schedule.cron_expr("* * * * *")))
        monkeypatch.undo()
        assert await store.migrate() == migrations_for(store.dialect)[-1].version
        old = await store.runs.create_manual_run("default", job.job_id)
        assert (old.concurrency_key, old.concurrency_limit) == (None, None)
        [new] = await keyed_runs(store, 1, limit=4)
        assert (new.concurrency_key, new.concurrency_limit) == ("ledger", 4)
    finally:
        await store.close()


async def test_runs_carry_their_jobs_key_and_limit(store):
    [run] = await keyed_runs(store, 1, limit=None)
    assert (run.concurrency_key, run.concurrency_limit) == ("ledger", 1)  # no limit given: one at a time
    stored = await store.runs.get_run("default", run.run_id)
    assert (stored.concurrency_key, stored.concurrency_limit) == ("ledger", 1)


async def test_a_capped_dispatch_starts_runs_up_to_the_limit_and_holds_the_rest_in_order(store):
    runs = await keyed_runs(store, 5, limit=3)
    outcome = await store.attempts.record_capped_dispatches([dispatch(run, index + 1) for index, run in enumerate(runs)])
    assert [attempt.run_id for attempt in outcome.attempts] == [run.run_id for run in runs[:3]]
    assert outcome.blocked == [run.run_id for run in runs[3:]]
    assert (await store.runs.get_run("default", runs[3].run_id)).state is RunState.SCHEDULED
    # Full: nothing more starts until one of the three ends.
    again = await store.attempts.record_capped_dispatches([dispatch(runs[3], 10)])
    assert again.attempts == [] and again.blocked == [runs[3].run_id]
    await store.attempts.record_results([AttemptResult(run_id=runs[0].run_id, lease_token=1, outcome=AttemptOutcome.SUCCEEDED)])
    freed = await store.attempts.record_capped_dispatches([dispatch(runs[3], 11), dispatch(runs[4], 12)])
    assert [a.run_id for a in freed.attempts] == [runs[3].run_id] and freed.blocked == [runs[4].run_id]


async def test_a_run_no_longer_scheduled_is_neither_started_nor_held(store):
    runs = await keyed_runs(store, 2, limit=1)
    await store.runs.cancel_run("default", runs[1].run_id)
    outcome = await store.attempts.record_capped_dispatches([dispatch(runs[1], 1), dispatch(runs[0], 2)])
    assert [a.run_id for a in outcome.attempts] == [runs[0].run_id] and outcome.blocked == []


async def test_a_failed_attempt_waiting_for_its_retry_frees_its_place(store):
    runs = await keyed_runs(store, 2, limit=1, retry=RetryPolicy(max_attempts=3, backoff_base=timedelta(seconds=30)))
    [first] = (await store.attempts.record_capped_dispatches([dispatch(runs[0], 1)])).attempts
    await store.attempts.record_results([AttemptResult(run_id=first.run_id, lease_token=1, outcome=AttemptOutcome.FAILED)])
    outcome = await store.attempts.record_capped_dispatches([dispatch(runs[1], 2)])
    assert [a.run_id for a in outcome.attempts] == [runs[1].run_id]


async def test_the_same_key_in_another_tenant_is_another_cap(store):
    [ours] = await keyed_runs(store, 1, limit=1)
    [theirs] = await keyed_runs(store, 1, limit=1, tenant="acme")
    outcome = await store.attempts.record_capped_dispatches([dispatch(ours, 1), dispatch(theirs, 2)])
    assert {a.run_id for a in outcome.attempts} == {ours.run_id, theirs.run_id}


async def test_two_nodes_racing_never_start_more_than_the_limit(store, make_store):
    runs = await keyed_runs(store, 12, limit=3)
    others = [make_store(shard_count=SHARDS) for _ in range(2)]
    try:
        # Each node offers runs of its own shards, four each: three starts in all, not nine.
        outcomes = await asyncio.gather(*(
            node.attempts.record_capped_dispatches([dispatch(run, 100 * n + i) for i, run in enumerate(runs[4 * n:4 * n + 4])])
            for n, node in enumerate([store, *others])
        ))
    finally:
        for other in others:
            await other.close()
    started = [a.run_id for outcome in outcomes for a in outcome.attempts]
    assert len(started) == 3 and len(set(started)) == 3
    active = [r for r in [await store.runs.get_run("default", run.run_id) for run in runs] if r.state is RunState.DISPATCHED]
    assert len(active) == 3
