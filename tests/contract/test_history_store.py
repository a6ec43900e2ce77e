"""History retention in the store: what ``trim_history`` deletes and what it never does (both backends)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fastlane.domain.errors import RunNotFound
from fastlane.domain.models import AttemptOutcome, DueJob, JobSpec, RunState, Schedule
from fastlane.domain.policies import plan_occurrence
from fastlane.errors import InvalidArgument
from fastlane.storage import AttemptResult, Dispatch
from fastlane.storage.late_reports import Reporter

SHARDS = 4
TTL = timedelta(seconds=30)
NOW = datetime.now(UTC)


@pytest.fixture
async def store(make_store):
    store = make_store(shard_count=SHARDS)
    await store.migrate()
    await store.shards.acquire_shards("node-a", TTL, limit=SHARDS)  # as the node whose runs these are
    yield store
    await store.close()


async def scheduled_run(store, name: str):  # type: ignore[no-untyped-def]
    leases = {shard.shard_id: shard for shard in await store.shards.list_shards()}
    job, _ = await store.jobs.create_job(JobSpec(name=name, job_type="t", schedule=Schedule.at_instant(NOW)))
    now = await store.db_now()
    [run] = (await store.lane.materialise_runs([leases[job.shard_id]], [plan_occurrence(DueJob.of(job), now, now)])).runs
    return run


async def finished_run(store, name: str, outcome: AttemptOutcome = AttemptOutcome.SUCCEEDED):  # type: ignore[no-untyped-def]
    run = await scheduled_run(store, name)
    await store.attempts.record_dispatches(
        [Dispatch(run_id=run.run_id, lease_token=7, worker_id="w", node_id="n", lease_ttl=TTL, dispatched_at=NOW)]
    )
    [result] = await store.attempts.record_results([AttemptResult(run_id=run.run_id, lease_token=7, outcome=outcome)])
    assert result.run.finished_at is not None
    return result.run


async def test_trimming_deletes_finished_runs_oldest_first_with_their_attempts(store):
    first = await finished_run(store, "first")
    second = await finished_run(store, "second", AttemptOutcome.PERMANENT_FAILURE)
    waiting = await scheduled_run(store, "waiting")
    cutoff = await store.db_now() + timedelta(seconds=1)
    every_shard = range(SHARDS)

    trimmed = await store.history.trim_history(every_shard, cutoff, 1)
    assert trimmed.runs == 1 and trimmed.busy_seconds > 0  # the batch limit holds
    with pytest.raises(RunNotFound):
        await store.runs.get_run("default", first.run_id)
    assert await store.runs.list_attempts(first.run_id) == []
    assert (await store.runs.get_run("default", second.run_id)).state is RunState.DEAD

    assert (await store.history.trim_history(every_shard, cutoff, 100)).runs == 1
    with pytest.raises(RunNotFound):
        await store.runs.get_run("default", second.run_id)
    assert (await store.history.trim_history(every_shard, cutoff, 100)).runs == 0
    assert (await store.runs.get_run("default", waiting.run_id)).state is RunState.SCHEDULED


async def test_a_run_not_finished_is_never_trimmed_however_far_the_cutoff(store):
    retrying = await scheduled_run(store, "retrying")  # a failed attempt behind it, waiting for the next
    await store.attempts.record_dispatches(
        [Dispatch(run_id=retrying.run_id, lease_token=7, worker_id="w", node_id="n", lease_ttl=TTL, dispatched_at=NOW)]
    )
    [failed] = await store.attempts.record_results(
        [AttemptResult(run_id=retrying.run_id, lease_token=7, outcome=AttemptOutcome.FAILED)]
    )
    assert failed.run.state is RunState.SCHEDULED
    running = await scheduled_run(store, "running")
    await store.attempts.record_dispatches(
        [Dispatch(run_id=running.run_id, lease_token=8, worker_id="w", node_id="n", lease_ttl=TTL, dispatched_at=NOW)]
    )
    far_future = await store.db_now() + timedelta(days=3650)
    assert (await store.history.trim_history(range(SHARDS), far_future, 100)).runs == 0
    assert (await store.runs.get_run("default", retrying.run_id)).state is RunState.SCHEDULED
    assert len(await store.runs.list_attempts(retrying.run_id)) == 1
    assert (await store.runs.get_run("default", running.run_id)).state is RunState.DISPATCHED


async def test_trimming_keeps_runs_that_ended_after_the_cutoff_or_on_other_shards(store):
    run = await finished_run(store, "recent")
    assert (await store.history.trim_history(range(SHARDS), run.finished_at - timedelta(seconds=1), 100)).runs == 0
    others = [shard for shard in range(SHARDS) if shard != run.shard_id]
    assert (await store.history.trim_history(others, run.finished_at + timedelta(seconds=1), 100)).runs == 0
    assert (await store.history.trim_history([], run.finished_at + timedelta(seconds=1), 100)).runs == 0
    assert (await store.runs.get_run("default", run.run_id)).state is RunState.SUCCEEDED
    assert len(await store.runs.list_attempts(run.run_id)) == 1


async def test_a_result_reported_for_a_trimmed_run_changes_nothing(store):
    run = await finished_run(store, "gone")
    assert (await store.history.trim_history(range(SHARDS), await store.db_now() + timedelta(seconds=1), 100)).runs == 1
    late = AttemptResult(run_id=run.run_id, lease_token=7, outcome=AttemptOutcome.SUCCEEDED)
    assert await store.attempts.record_results([late]) == []  # no run, nothing to decide
    # Nor as a report whose dispatch was never recorded (the node's path for unknown attempts).
    assert await store.attempts.record_results([late], reporter_of=lambda run_id, token: Reporter("w", "n", None)) == []
    assert await store.runs.list_attempts(run.run_id) == []
    with pytest.raises(RunNotFound):
        await store.runs.get_run("default", run.run_id)


@pytest.mark.parametrize("limit", [0, -1, 10_001])
async def test_a_trim_batch_out_of_range_is_refused(store, limit):
    with pytest.raises(InvalidArgument, match="limit"):
        await store.history.trim_history(range(SHARDS), NOW, limit)
