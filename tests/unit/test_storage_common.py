"""The names the stores call the domain's decisions by (fastlane.storage.common): the lifecycle's
sets in the shapes the stores take, and the result decision with outcomes a store returns."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from fastlane.domain.models import AttemptOutcome, Delivery, JobState, RetryPolicy, Run, RunState
from fastlane.domain.records import AttemptResult
from fastlane.storage import common

T0 = datetime(2027, 1, 1, 12, 0, tzinfo=UTC)


def test_the_state_names_keep_their_shapes() -> None:
    assert common.WITH_A_WORKER == (RunState.DISPATCHED, RunState.RUNNING)
    assert common.ACTIVE_STATES == ("buffered", "dispatched", "running", "scheduled")
    assert all(type(state) is str for state in common.ACTIVE_STATES)
    assert common.PAUSE_FROM == (JobState.ACTIVE,)
    assert common.RESUME_FROM == (JobState.ERRORED, JobState.PAUSED)
    assert common.FINAL_STATES_SQL == "'cancelled', 'dead', 'failed', 'lost', 'skipped', 'succeeded'"


def running(run_id: str, token: int, job_id: str) -> Run:
    return Run(run_id=run_id, job_id=job_id, tenant="default", job_type="t", shard_id=0, scheduled_for=T0,
               available_at=T0, state=RunState.RUNNING, attempts=3, payload=b"", priority=0, manual=False,
               delivery=Delivery.AT_LEAST_ONCE, lease_ttl=timedelta(seconds=30), created_at=T0, updated_at=T0,
               retry=RetryPolicy(max_attempts=3), lease_token=token)


def test_decide_results_answers_with_result_outcomes() -> None:
    runs = {"a": running("a", 1, "ja"), "b": running("b", 2, "jb")}
    results = [AttemptResult(run_id="a", lease_token=1, outcome=AttemptOutcome.FAILED),
               AttemptResult(run_id="b", lease_token=9, outcome=AttemptOutcome.SUCCEEDED)]
    decided = common.decide_results(runs, results, T0 + timedelta(minutes=1), random.Random(1))
    assert [(o.run.run_id, o.state.value, o.accepted, o.released) for o in decided.outcomes] == [
        ("a", "dead", True, False), ("b", "running", False, False)]
    assert [run.run_id for run in decided.runs] == ["a"]
    assert [(u.result.run_id, u.outcome.value) for u in decided.attempts] == [("a", "failed"), ("b", "superseded")]
    assert decided.finished_jobs == {"ja"}
