"""What ended attempts, reported results, due occurrences and concurrency caps do to runs: the pure
decisions the stores write, against expectations typed out here. No database."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from fastlane.domain.lifecycle import admit_under_caps, capped_keys
from fastlane.domain.models import AttemptOutcome, Delivery, OverlapPolicy, RetryPolicy, Run, RunState
from fastlane.domain.records import AttemptResult, Dispatch, KeyCap, Occurrence
from fastlane.domain.run_results import (
    decide_results,
    finished_jobs,
    first_of_each_attempt,
    lease_expired_results,
    successes_first,
)
from fastlane.domain.transitions import (
    MISFIRE_SKIPPED,
    OVERLAP_SKIPPED,
    OVERLAP_SUPERSEDED,
    after_attempt,
    plan_materialisation,
    scheduled_in_order,
    skipped_by_policy,
)

T0 = datetime(2027, 1, 1, 12, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=1)
# No backoff: a retry is due at NOW exactly, so its time is known without the random source.
NO_BACKOFF = RetryPolicy(max_attempts=3, backoff_base=timedelta(0), backoff_cap=timedelta(0))


def run(run_id: str = "r1", *, state: RunState = RunState.RUNNING, token: int | None = 7, attempts: int = 1,
        delivery: Delivery = Delivery.AT_LEAST_ONCE, cancel_requested: bool = False, job_id: str = "j1",
        scheduled_for: datetime = T0) -> Run:
    return Run(run_id=run_id, job_id=job_id, tenant="default", job_type="t", shard_id=0, scheduled_for=scheduled_for,
               available_at=T0, state=state, attempts=attempts, payload=b"", priority=0, manual=False,
               delivery=delivery, lease_ttl=timedelta(seconds=30), created_at=T0, updated_at=T0, retry=NO_BACKOFF,
               cancel_requested=cancel_requested, first_attempt_at=T0, lease_token=token, worker_id="w1")


def result(run_id: str = "r1", outcome: AttemptOutcome = AttemptOutcome.FAILED, *, token: int = 7,
           finished_at: datetime | None = None) -> AttemptResult:
    return AttemptResult(run_id=run_id, lease_token=token, outcome=outcome, error_message=f"{outcome.value}!",
                         finished_at=finished_at)


# -- one attempt ends ------------------------------------------------------------------------------

S, F, P, T, L, C = (AttemptOutcome.SUCCEEDED, AttemptOutcome.FAILED, AttemptOutcome.PERMANENT_FAILURE,
                    AttemptOutcome.TIMED_OUT, AttemptOutcome.LEASE_EXPIRED, AttemptOutcome.CANCELLED)
LEAST, MOST = Delivery.AT_LEAST_ONCE, Delivery.AT_MOST_ONCE
ENDS = [  # outcome, delivery, cancel requested, attempts made (of 3 allowed), the run's next state
    (S, LEAST, False, 1, "succeeded"),
    (S, LEAST, True, 1, "succeeded"),  # a success beats the cancel
    (S, MOST, False, 3, "succeeded"),
    (F, LEAST, False, 1, "scheduled"),
    (F, LEAST, False, 3, "dead"),
    (F, MOST, False, 1, "dead"),
    (F, LEAST, True, 1, "cancelled"),
    (T, LEAST, False, 2, "scheduled"),
    (T, LEAST, False, 3, "dead"),
    (T, MOST, False, 1, "dead"),
    (L, LEAST, False, 1, "scheduled"),
    (L, LEAST, False, 3, "dead"),
    (L, MOST, False, 1, "lost"),
    (L, MOST, True, 1, "cancelled"),
    (P, LEAST, False, 1, "dead"),
    (P, LEAST, True, 1, "cancelled"),
    (C, LEAST, False, 1, "cancelled"),
    (C, MOST, False, 3, "cancelled"),
]


@pytest.mark.parametrize("worker_state", [RunState.DISPATCHED, RunState.RUNNING])
@pytest.mark.parametrize(("outcome", "delivery", "requested", "attempts", "expected"), ENDS)
def test_what_an_ended_attempt_makes_of_its_run(worker_state: RunState, outcome: AttemptOutcome, delivery: Delivery,
                                               requested: bool, attempts: int, expected: str) -> None:
    ended = run(state=worker_state, attempts=attempts, delivery=delivery, cancel_requested=requested)
    transition = after_attempt(ended, outcome, error="boom", now=NOW, rng=random.Random(1))
    assert transition.state is RunState(expected)
    if expected == "scheduled":
        assert (transition.available_at, transition.finished_at, transition.last_error) == (NOW, None, "boom")
    else:
        assert (transition.available_at, transition.finished_at) == (T0, NOW)
        assert transition.last_error == (None if expected == "succeeded" else "boom")


def test_a_retry_past_the_retry_time_budget_is_dead() -> None:
    budgeted = replace(run(), retry=replace(NO_BACKOFF, max_retry_time=timedelta(seconds=30)))
    assert after_attempt(budgeted, F, error=None, now=NOW, rng=random.Random(1)).state is RunState.DEAD


@pytest.mark.parametrize("state", [RunState.SCHEDULED, RunState.BUFFERED, RunState.SUCCEEDED, RunState.DEAD])
def test_a_run_no_worker_has_has_no_attempt_to_end(state: RunState) -> None:
    with pytest.raises(ValueError, match="no attempt of it is under way"):
        after_attempt(run(state=state), S, error=None, now=NOW, rng=random.Random(1))


# -- a batch of results ----------------------------------------------------------------------------


def test_a_current_result_changes_its_run_and_a_stale_one_is_superseded() -> None:
    runs = {
        "retried": run("retried", job_id="ja"),
        "dead": run("dead", attempts=3, job_id="jb"),
        "lost": run("lost", delivery=MOST, job_id="jc"),
        "stale": run("stale", token=8, job_id="jd"),  # a later attempt owns it now
        "waiting": run("waiting", state=RunState.SCHEDULED, token=None, job_id="je"),  # retried already
    }
    results = [result("retried"), result("dead"), result("lost", L), result("stale"), result("waiting"),
               result("unknown")]
    decided = decide_results(runs, results, NOW, random.Random(1))

    assert [(r.run_id, r.state.value, accepted) for r, accepted in decided.verdicts] == [
        ("retried", "scheduled", True), ("dead", "dead", True), ("lost", "lost", True),
        ("stale", "running", False), ("waiting", "scheduled", False),
    ]
    assert [(r.run_id, r.state.value) for r in decided.runs] == [("retried", "scheduled"), ("dead", "dead"),
                                                                 ("lost", "lost")]
    assert [(u.result.run_id, u.outcome.value, u.finished_at) for u in decided.attempts] == [
        ("retried", "failed", NOW), ("dead", "failed", NOW), ("lost", "lease_expired", NOW),
        ("stale", "superseded", NOW), ("waiting", "superseded", NOW),
    ]
    assert decided.finished_jobs == {"jb", "jc"}
    changed = decided.runs[0]
    assert (changed.lease_token, changed.lease_expires_at, changed.updated_at) == (None, None, NOW)
    assert runs["retried"] is changed  # the caller's runs are the runs as they are now


def test_a_resent_result_counts_once_and_a_second_attempt_of_the_batch_finds_the_run_moved() -> None:
    finished = T0 + timedelta(seconds=50)
    runs = {"r1": run()}
    results = [result(outcome=S, finished_at=finished), result(outcome=S), result(outcome=F, token=6)]
    decided = decide_results(runs, results, NOW, random.Random(1))
    assert [(u.result.lease_token, u.outcome.value, u.finished_at) for u in decided.attempts] == [
        (7, "succeeded", finished), (6, "superseded", NOW)]
    assert [(r.state.value, accepted) for r, accepted in decided.verdicts] == [("succeeded", True),
                                                                               ("succeeded", False)]


def test_results_of_one_attempt_are_taken_once_successes_apart() -> None:
    a, b, c = result("a", S), result("b", F), result("c", S, token=1)
    assert first_of_each_attempt([a, b, a, c, replace(b, outcome=S)]) == [a, b, c]
    assert successes_first([a, b, a, c]) == ([a, c], [b])


def test_an_expired_lease_ends_the_attempt_it_belongs_to() -> None:
    assert lease_expired_results([run("r1", token=4), run("r2", token=None)], NOW) == [
        AttemptResult(run_id="r1", lease_token=4, outcome=L, error_code="lease_expired",
                      error_message="worker w1 stopped heartbeating", finished_at=NOW),
        AttemptResult(run_id="r2", lease_token=0, outcome=L, error_code="lease_expired",
                      error_message="worker w1 stopped heartbeating", finished_at=NOW),
    ]


def test_finished_jobs_are_those_with_a_run_that_ended() -> None:
    runs = [run("a", state=RunState.SCHEDULED, job_id="j1"), run("b", state=RunState.DEAD, job_id="j2"),
            run("c", state=RunState.SUCCEEDED, job_id="j3")]
    assert finished_jobs(runs) == {"j2", "j3"}


# -- due occurrences -------------------------------------------------------------------------------

FIRES = (T0, T0 + timedelta(minutes=1), T0 + timedelta(minutes=2))
MATERIALISATIONS = [  # policy, active runs of the job, (state, last error) of each fire, cancelled now, asked to stop
    ("allow", [("a1", "running")], [("scheduled", None)] * 3, [], []),
    ("skip", [], [("scheduled", None), ("skipped", OVERLAP_SKIPPED), ("skipped", OVERLAP_SKIPPED)], [], []),
    ("skip", [("a1", "dispatched")], [("skipped", OVERLAP_SKIPPED)] * 3, [], []),
    ("buffer_one", [("a1", "running")], [("buffered", None), ("skipped", OVERLAP_SKIPPED),
                                         ("skipped", OVERLAP_SKIPPED)], [], []),
    ("buffer_one", [("a1", "running"), ("a2", "buffered")], [("skipped", OVERLAP_SKIPPED)] * 3, [], []),
    ("buffer_one", [], [("scheduled", None), ("buffered", None), ("skipped", OVERLAP_SKIPPED)], [], []),
    ("buffer_all", [("a1", "scheduled")], [("buffered", None)] * 3, [], []),
    ("buffer_all", [], [("scheduled", None), ("buffered", None), ("buffered", None)], [], []),
    ("cancel_previous", [("a1", "scheduled"), ("a2", "running"), ("a3", "buffered"), ("a4", "dispatched")],
     [("skipped", OVERLAP_SUPERSEDED), ("skipped", OVERLAP_SUPERSEDED), ("scheduled", None)], ["a1", "a3"],
     ["a2", "a4"]),
    ("cancel_previous", [], [("skipped", OVERLAP_SUPERSEDED), ("skipped", OVERLAP_SUPERSEDED), ("scheduled", None)],
     [], []),
]


@pytest.mark.parametrize(("policy", "active", "rows", "cancel_now", "cancel_requested"), MATERIALISATIONS)
def test_the_overlap_policy_decides_each_new_run(policy: str, active: list[tuple[str, str]],
                                                 rows: list[tuple[str, str | None]], cancel_now: list[str],
                                                 cancel_requested: list[str]) -> None:
    occurrence = Occurrence(job_id="j1", expected_next_fire_at=T0, fire_times=FIRES, next_fire_at=None,
                            skipped_times=(T0 - timedelta(minutes=1),))
    plan = plan_materialisation([occurrence], {"j1": OverlapPolicy(policy).value},
                                [("j1", run_id, state) for run_id, state in active])
    written = [(row.job_id, row.scheduled_for, row.state, row.last_error) for row in plan.rows]
    assert written == [("j1", t, state, error) for t, (state, error) in zip(FIRES, rows, strict=True)] + [
        ("j1", T0 - timedelta(minutes=1), "skipped", MISFIRE_SKIPPED)]
    assert len({row.run_id for row in plan.rows}) == len(plan.rows)
    assert (plan.cancel_now, plan.cancel_requested) == (cancel_now, cancel_requested)


def test_occurrences_of_jobs_not_advanced_are_not_written() -> None:
    occurrence = Occurrence(job_id="gone", expected_next_fire_at=T0, fire_times=(T0,), next_fire_at=None)
    plan = plan_materialisation([occurrence], {}, [("gone", "a1", "running")])
    assert (plan.rows, plan.cancel_now, plan.cancel_requested) == ([], [], [])


def test_inserted_runs_are_counted_by_the_policy_that_skipped_them_and_scheduled_ones_ordered() -> None:
    late, early = run("late", state=RunState.SCHEDULED, scheduled_for=T0 + timedelta(minutes=1)), \
        run("early", state=RunState.SCHEDULED)
    runs = [late, replace(run("m", state=RunState.SKIPPED), last_error=MISFIRE_SKIPPED),
            replace(run("o", state=RunState.SKIPPED), last_error=OVERLAP_SKIPPED),
            replace(run("o2", state=RunState.SKIPPED), last_error=OVERLAP_SUPERSEDED),
            early, run("b", state=RunState.BUFFERED)]
    assert skipped_by_policy(runs) == {"misfire": 1, "overlap": 2}
    assert scheduled_in_order(runs) == [early, late]


# -- concurrency caps ------------------------------------------------------------------------------


def dispatch(run_id: str, key: str | None = None, limit: int = 1) -> Dispatch:
    return Dispatch(run_id=run_id, lease_token=1, worker_id="w", node_id="n", lease_ttl=timedelta(seconds=30),
                    dispatched_at=T0, cap=None if key is None else KeyCap("default", key, limit))


def test_capped_dispatches_are_admitted_while_their_key_has_room() -> None:
    dispatches = [dispatch("a1", "ledger", 2), dispatch("free"), dispatch("a2", "ledger", 2),
                  dispatch("b1", "mail"), dispatch("gone", "mail"), dispatch("b2", "mail"), dispatch("a3", "ledger", 2)]
    scheduled = {"a1", "free", "a2", "b1", "b2", "a3"}
    admitted, held = admit_under_caps(dispatches, scheduled, {("default", "ledger"): 1})
    assert [d.run_id for d in admitted] == ["a1", "free", "b1"]
    assert held == ["a2", "b2", "a3"]


def test_capped_keys_are_distinct_and_sorted() -> None:
    dispatches = [dispatch("a", "mail"), dispatch("b"), dispatch("c", "ledger"), dispatch("d", "mail")]
    assert capped_keys(dispatches) == [("default", "ledger"), ("default", "mail")]
