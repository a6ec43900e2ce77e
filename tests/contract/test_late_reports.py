"""Results of attempts whose dispatch was never recorded (their node died first), on both stores.

Such a result is recorded as an attempt of its own, from the reporting worker; it completes a run
still waiting for its first delivery, and otherwise marks the run's redelivery.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from test_store import NOW, TTL, lease_expired, scheduled_run

from fastlane.domain.models import AttemptOutcome, RetryPolicy, RunState
from fastlane.storage import AttemptResult, Dispatch, Reporter

SHARDS = 4


@pytest.fixture
async def store(make_store):
    store = make_store(shard_count=SHARDS)
    await store.migrate()
    yield store
    await store.close()


def reported_by(worker_id: str, tenant: str | None = None, node_id: str = "node-b"):
    reporter = Reporter(worker_id, node_id, tenant)
    return lambda run_id, lease_token: reporter


def result(run_id: str, token: int, outcome: AttemptOutcome = AttemptOutcome.SUCCEEDED, *,
           started_at: datetime = NOW, error_message: str | None = None) -> AttemptResult:
    return AttemptResult(run_id=run_id, lease_token=token, outcome=outcome, started_at=started_at,
                         finished_at=started_at + timedelta(milliseconds=5), error_message=error_message)


async def test_a_late_success_of_a_waiting_run_is_its_first_attempt_and_ends_it(store):
    _, run = await scheduled_run(store)
    [outcome] = await store.attempts.record_results([result(run.run_id, 77)], reporter_of=reported_by("default#w1"))
    assert outcome.accepted and outcome.run.state is RunState.SUCCEEDED
    [attempt] = await store.runs.list_attempts(run.run_id)
    assert (attempt.attempt, attempt.lease_token, attempt.worker_id, attempt.node_id) == (1, 77, "default#w1", "node-b")
    assert attempt.outcome is AttemptOutcome.SUCCEEDED and attempt.reported_late and not attempt.redelivery
    assert attempt.started_at == NOW and attempt.dispatched_at == NOW
    done = await store.runs.get_run("default", run.run_id)
    assert done.state is RunState.SUCCEEDED and done.attempts == 1 and done.first_attempt_at == NOW
    # The new owner's copy, released meanwhile, is not recorded: the run is no longer waiting.
    assert await store.attempts.record_dispatches([Dispatch(run_id=run.run_id, lease_token=78, worker_id="default#w2",
                                                   node_id="node-c", lease_ttl=TTL, dispatched_at=NOW)]) == []


async def test_a_late_failure_of_a_waiting_run_is_retried_as_its_policy_says(store):
    _, run = await scheduled_run(store, retry=RetryPolicy(max_attempts=3, backoff_base=timedelta(seconds=1)))
    late = replace(result(run.run_id, 5, AttemptOutcome.FAILED, error_message="boom"),
                   error_traceback="Traceback:\nRuntimeError: boom")
    [outcome] = await store.attempts.record_results([late], reporter_of=reported_by("w1"))
    assert outcome.accepted and outcome.run.state is RunState.SCHEDULED and outcome.run.last_error == "boom"
    [dispatched] = await store.attempts.record_dispatches([Dispatch(run_id=run.run_id, lease_token=6, worker_id="w2",
                                                           node_id="n", lease_ttl=TTL, dispatched_at=NOW)])
    assert dispatched.attempt == 2  # numbered after the late one
    attempts = await store.runs.list_attempts(run.run_id)
    assert [(a.attempt, a.outcome, a.reported_late) for a in attempts] == [
        (1, AttemptOutcome.FAILED, True), (2, AttemptOutcome.PENDING, False)]
    assert attempts[0].error_traceback == "Traceback:\nRuntimeError: boom"


async def test_a_late_result_after_the_run_went_out_again_marks_the_redelivery(store):
    _, run = await scheduled_run(store)
    await store.attempts.record_dispatches([Dispatch(run_id=run.run_id, lease_token=2, worker_id="w2", node_id="node-c",
                                            lease_ttl=TTL, dispatched_at=NOW + timedelta(seconds=1))])
    [late] = await store.attempts.record_results([result(run.run_id, 1)], reporter_of=reported_by("w1"))
    assert not late.accepted
    current = await store.runs.get_run("default", run.run_id)
    assert current.state is RunState.DISPATCHED and current.lease_token == 2 and current.attempts == 2
    attempts = await store.runs.list_attempts(run.run_id)
    assert [(a.attempt, a.lease_token, a.outcome, a.reported_late, a.redelivery) for a in attempts] == [
        (1, 2, AttemptOutcome.PENDING, False, True), (2, 1, AttemptOutcome.SUCCEEDED, True, False)]
    # The redelivery ends as usual: the run has now succeeded twice, and history says so.
    [outcome] = await store.attempts.record_results([result(run.run_id, 2)], reporter_of=reported_by("w2"))
    assert outcome.accepted and outcome.run.state is RunState.SUCCEEDED
    outcomes = [(a.outcome, a.redelivery) for a in await store.runs.list_attempts(run.run_id)]
    assert outcomes == [(AttemptOutcome.SUCCEEDED, True), (AttemptOutcome.SUCCEEDED, False)]


async def test_an_attempt_finished_before_the_late_one_began_is_not_a_redelivery(store):
    leases, run = await scheduled_run(store)
    await store.attempts.record_dispatches([Dispatch(run_id=run.run_id, lease_token=1, worker_id="w1", node_id="n",
                                            lease_ttl=timedelta(milliseconds=200), dispatched_at=NOW)])
    await lease_expired(store, run.shard_id)
    await store.lane.requeue_expired(leases[run.shard_id])  # attempt 1 ends lease_expired, now
    await store.attempts.record_dispatches([Dispatch(run_id=run.run_id, lease_token=3, worker_id="w3", node_id="n",
                                            lease_ttl=TTL, dispatched_at=NOW)])
    later = NOW + timedelta(hours=1)  # began after attempt 1 ended, while attempt 2 is under way
    await store.attempts.record_results([result(run.run_id, 2, started_at=later)], reporter_of=reported_by("w2"))
    attempts = await store.runs.list_attempts(run.run_id)
    assert [(a.lease_token, a.outcome, a.redelivery) for a in attempts] == [
        (1, AttemptOutcome.LEASE_EXPIRED, False), (3, AttemptOutcome.PENDING, True),
        (2, AttemptOutcome.SUCCEEDED, False)]


async def test_a_late_report_is_not_recorded_for_another_tenants_run_nor_without_a_reporter(store):
    _, run = await scheduled_run(store)
    [foreign] = await store.attempts.record_results([result(run.run_id, 9)], reporter_of=reported_by("acme#w", "acme"))
    [anonymous] = await store.attempts.record_results([result(run.run_id, 9)])
    assert not foreign.accepted and not anonymous.accepted
    assert await store.runs.list_attempts(run.run_id) == []
    assert (await store.runs.get_run("default", run.run_id)).state is RunState.SCHEDULED
    [own] = await store.attempts.record_results([result(run.run_id, 9)], reporter_of=reported_by("default#w", "default"))
    assert own.accepted


async def test_a_late_cancelled_report_changes_nothing(store):
    _, run = await scheduled_run(store)
    [outcome] = await store.attempts.record_results([result(run.run_id, 4, AttemptOutcome.CANCELLED)],
                                           reporter_of=reported_by("w1"))
    assert not outcome.accepted
    assert await store.runs.list_attempts(run.run_id) == []
    assert (await store.runs.get_run("default", run.run_id)).state is RunState.SCHEDULED


async def test_a_repeated_late_report_is_recorded_once(store):
    _, run = await scheduled_run(store)
    reporter = reported_by("w1")
    await store.attempts.record_results([result(run.run_id, 4), result(run.run_id, 4)], reporter_of=reporter)
    await store.attempts.record_results([result(run.run_id, 4)], reporter_of=reporter)  # resent: the ack was lost
    [attempt] = await store.runs.list_attempts(run.run_id)
    assert attempt.outcome is AttemptOutcome.SUCCEEDED and attempt.reported_late
    assert (await store.runs.get_run("default", run.run_id)).attempts == 1
