"""A journal round (``record_round``): dispatches, heartbeats and results in one transaction, on
each backend; what it writes is what the three calls write, and it lands whole or not at all."""

from __future__ import annotations

import pytest
from test_store import NOW, TTL, due_now, materialise_job, own_all, scheduled_run, spec, store  # noqa: F401  (store: the fixture)

from fastlane.domain.models import AttemptOutcome, RunState
from fastlane.storage import AttemptResult, Dispatch, Heartbeat


def dispatch_of(run, token: int = 11) -> Dispatch:  # type: ignore[no-untyped-def]
    return Dispatch(run_id=run.run_id, lease_token=token, worker_id="w1", node_id="n1", lease_ttl=TTL, dispatched_at=NOW)


async def test_a_round_dispatches_beats_and_settles_in_that_order(store):  # noqa: F811
    leases = await own_all(store)
    runs = []
    for name in ("billing", "other"):
        job, _ = await store.jobs.create_job(spec(name))
        await due_now(store, job.job_id)
        runs += await materialise_job(store, leases, job.job_id)
    run, other = runs
    [before] = await store.attempts.record_dispatches([dispatch_of(other, 5)])
    written = await store.attempts.record_round(
        [dispatch_of(run)],
        [Heartbeat(run_id=run.run_id, lease_token=11, progress=0.5, started=True),
         Heartbeat(run_id=other.run_id, lease_token=6)],  # not the attempt's token: stale
        [AttemptResult(run_id=run.run_id, lease_token=11, outcome=AttemptOutcome.SUCCEEDED),
         AttemptResult(run_id=other.run_id, lease_token=5, outcome=AttemptOutcome.PERMANENT_FAILURE)])
    [attempt] = written.attempts
    assert (attempt.run_id, attempt.attempt, attempt.worker_id) == (run.run_id, 1, "w1")
    assert written.stale == [other.run_id]
    assert sorted((o.run.run_id, o.accepted, o.state) for o in written.outcomes) == sorted([
        (run.run_id, True, RunState.SUCCEEDED), (other.run_id, True, RunState.DEAD)])
    done = await store.runs.get_run("default", run.run_id)
    assert done.state is RunState.SUCCEEDED and done.progress == 0.5 and done.attempts == 1
    [recorded] = await store.runs.list_attempts(run.run_id)
    assert recorded.outcome is AttemptOutcome.SUCCEEDED and recorded.started_at is not None
    assert before.attempt == 1


async def test_a_round_that_fails_in_its_results_leaves_its_dispatches_unwritten(store):  # noqa: F811
    _, run = await scheduled_run(store)
    bad = AttemptResult(run_id=run.run_id, lease_token=11, outcome=AttemptOutcome.FAILED,
                        error_code="E", error_message="a lone surrogate \ud800 cannot be encoded")
    with pytest.raises(Exception):  # noqa: B017, PT011  (each driver words it its own way)
        await store.attempts.record_round([dispatch_of(run)], [], [bad])
    untouched = await store.runs.get_run("default", run.run_id)
    assert untouched.state is RunState.SCHEDULED and untouched.attempts == 0
    assert await store.runs.list_attempts(run.run_id) == []
    # The same dispatch alone lands: it was the round's result that failed.
    assert len(await store.attempts.record_dispatches([dispatch_of(run)])) == 1
