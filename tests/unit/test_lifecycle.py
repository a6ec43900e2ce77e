"""The lifecycle's tables and decisions, against tables typed out here: no database.

Each expectation is written as a literal, not derived from the module under test, so a changed
edge or decision fails here until this file says the same.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from fastlane.domain import lifecycle
from fastlane.domain.errors import InvalidState, JobAlreadyExists
from fastlane.domain.lifecycle import CancelDecision, JobEvent, RunEvent
from fastlane.domain.models import Delivery, Job, JobSpec, JobState, Run, RunState, Schedule
from fastlane.errors import InvalidArgument

T0 = datetime(2027, 1, 1, 12, 0, tzinfo=UTC)

# (state, event) -> next state: every edge of a run.
RUN_EDGES = {
    ("scheduled", "dispatch"): "dispatched",
    ("scheduled", "start"): "running",
    ("scheduled", "cancel"): "cancelled",
    ("buffered", "release"): "scheduled",
    ("buffered", "cancel"): "cancelled",
    ("dispatched", "start"): "running",
    ("dispatched", "cancel"): "dispatched",
    ("dispatched", "succeed"): "succeeded",
    ("dispatched", "retry"): "scheduled",
    ("dispatched", "fail"): "dead",
    ("dispatched", "lose"): "lost",
    ("dispatched", "stop"): "cancelled",
    ("running", "cancel"): "running",
    ("running", "succeed"): "succeeded",
    ("running", "retry"): "scheduled",
    ("running", "fail"): "dead",
    ("running", "lose"): "lost",
    ("running", "stop"): "cancelled",
    ("dead", "replay"): "scheduled",
    ("lost", "replay"): "scheduled",
    ("failed", "rerun"): "scheduled",
    ("dead", "rerun"): "scheduled",
    ("lost", "rerun"): "scheduled",
    ("skipped", "rerun"): "scheduled",
    ("cancelled", "rerun"): "scheduled",
    ("dead", "reopen"): "running",
    ("cancelled", "reopen"): "running",
}
RUN_WRITTEN = {("fire", "scheduled"), ("trigger", "scheduled"), ("buffer", "buffered"), ("skip", "skipped"),
               ("start", "running"), ("fail", "dead")}

JOB_EDGES = {
    ("active", "pause"): "paused",
    ("paused", "resume"): "active",
    ("errored", "resume"): "active",
    ("active", "set_aside"): "errored",
    ("active", "complete"): "completed",
    ("active", "reschedule"): "active",
    ("paused", "reschedule"): "paused",
    ("errored", "reschedule"): "errored",
    ("completed", "reschedule"): "active",
}
JOB_WRITTEN = {("create", "active")}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(RunState, RunEvent)))
def test_a_run_event_goes_where_the_table_says_or_is_refused(state: RunState, event: RunEvent) -> None:
    expected = RUN_EDGES.get((state.value, event.value))
    assert lifecycle.run_target(state, event) == (None if expected is None else RunState(expected))


@pytest.mark.parametrize(("state", "event"), list(itertools.product(JobState, JobEvent)))
def test_a_job_event_goes_where_the_table_says_or_is_refused(state: JobState, event: JobEvent) -> None:
    expected = JOB_EDGES.get((state.value, event.value))
    assert lifecycle.job_target(state, event) == (None if expected is None else JobState(expected))


def test_the_tables_hold_these_edges_and_no_other() -> None:
    assert {(s.value, e.value, t.value) for s, e, t in lifecycle.RUN_TRANSITIONS} == {
        (s, e, t) for (s, e), t in RUN_EDGES.items()}
    assert {(e.value, t.value) for e, t in lifecycle.RUN_CREATIONS} == RUN_WRITTEN
    assert {(s.value, e.value, t.value) for s, e, t in lifecycle.JOB_TRANSITIONS} == {
        (s, e, t) for (s, e), t in JOB_EDGES.items()}
    assert {(e.value, t.value) for e, t in lifecycle.JOB_CREATIONS} == JOB_WRITTEN


def test_every_run_state_but_failed_is_reached() -> None:
    reached = {t.value for _, t in lifecycle.RUN_CREATIONS} | {t.value for _, _, t in lifecycle.RUN_TRANSITIONS}
    assert {s.value for s in RunState} - reached == {"failed"}  # nothing writes failed any more


def test_only_a_replay_or_a_workflow_resume_moves_a_run_that_ended() -> None:
    for state, event, _ in lifecycle.RUN_TRANSITIONS:
        if state.is_final:
            assert event in (RunEvent.REPLAY, RunEvent.RERUN, RunEvent.REOPEN), (state, event)


@pytest.mark.parametrize(
    ("name", "states"),
    [
        ("WITH_A_WORKER", {"dispatched", "running"}),
        ("OVERLAP_ACTIVE", {"buffered", "scheduled", "dispatched", "running"}),
        ("WAITING", {"scheduled", "buffered"}),
        ("REPLAYABLE", {"dead", "lost"}),
        ("RERUNNABLE", {"failed", "dead", "skipped", "cancelled", "lost"}),
        ("FINAL", {"succeeded", "failed", "dead", "skipped", "cancelled", "lost"}),
        ("PAUSE_FROM", {"active"}),
        ("RESUME_FROM", {"paused", "errored"}),
    ],
)
def test_the_named_sets(name: str, states: set[str]) -> None:
    named = getattr(lifecycle, name)
    assert isinstance(named, frozenset)
    assert {state.value for state in named} == states


def test_a_run_is_active_exactly_while_overlap_counts_it() -> None:
    assert {s.value for s in RunState if s.is_active} == {"buffered", "scheduled", "dispatched", "running"}


@pytest.mark.parametrize(
    ("states", "sql"),
    [
        ({RunState.RUNNING, RunState.DISPATCHED}, "'dispatched', 'running'"),
        (lifecycle.FINAL, "'cancelled', 'dead', 'failed', 'lost', 'skipped', 'succeeded'"),
        ({JobState.PAUSED, JobState.ERRORED}, "'errored', 'paused'"),
        (frozenset[RunState](), ""),
    ],
)
def test_sql_list_writes_an_in_list_by_value(states: frozenset[RunState], sql: str) -> None:
    assert lifecycle.sql_list(states) == sql


# -- cancel, replay, pause and resume --------------------------------------------------------------


def run_in(state: RunState, *, cancel_requested: bool = False) -> Run:
    return Run(run_id="r1", job_id="j1", tenant="default", job_type="t", shard_id=0, scheduled_for=T0,
               available_at=T0, state=state, attempts=1, payload=b"", priority=0, manual=False,
               delivery=Delivery.AT_LEAST_ONCE, lease_ttl=timedelta(seconds=30), created_at=T0, updated_at=T0,
               cancel_requested=cancel_requested)


REFUSED = "refused"
CANCELS = {  # state: (decision without a cancel requested, decision with one)
    "scheduled": (CancelDecision.CANCEL, CancelDecision.CANCEL),
    "buffered": (CancelDecision.CANCEL, CancelDecision.CANCEL),
    "dispatched": (CancelDecision.REQUEST, CancelDecision.ALREADY),
    "running": (CancelDecision.REQUEST, CancelDecision.ALREADY),
    "cancelled": (CancelDecision.ALREADY, CancelDecision.ALREADY),
    "succeeded": (REFUSED, REFUSED),
    "failed": (REFUSED, REFUSED),
    "dead": (REFUSED, REFUSED),
    "skipped": (REFUSED, REFUSED),
    "lost": (REFUSED, REFUSED),
}


@pytest.mark.parametrize(("state", "requested"), list(itertools.product(RunState, [False, True])))
def test_cancel_decision(state: RunState, requested: bool) -> None:
    expected = CANCELS[state.value][requested]
    run = run_in(state, cancel_requested=requested)
    if expected == REFUSED:
        with pytest.raises(InvalidState, match=rf"^run 'r1' is {state.value}; cannot cancel$"):
            lifecycle.cancel_decision(run)
    else:
        assert lifecycle.cancel_decision(run) is expected
    assert lifecycle.cancel_in_effect(run) is (expected is CancelDecision.ALREADY)


@pytest.mark.parametrize("state", [*(s.value for s in RunState), "no such state"])
def test_only_dead_and_lost_runs_are_replayable(state: str) -> None:
    if state in ("dead", "lost"):
        lifecycle.check_replayable("r1", state)
    else:
        with pytest.raises(InvalidState, match=rf"^run 'r1' is {state}; cannot retry \(only dead or lost runs"):
            lifecycle.check_replayable("r1", state)


JOB_CHANGES = {  # (current, verb): True (write it), False (there already) or refused
    ("active", "pause"): True,
    ("paused", "pause"): False,
    ("errored", "pause"): REFUSED,
    ("completed", "pause"): REFUSED,
    ("active", "resume"): False,
    ("paused", "resume"): True,
    ("errored", "resume"): True,
    ("completed", "resume"): REFUSED,
}
TARGET_OF_VERB = {"pause": JobState.PAUSED, "resume": JobState.ACTIVE}


@pytest.mark.parametrize(("current", "verb"), list(itertools.product(JobState, ["pause", "resume"])))
def test_job_state_change(current: JobState, verb: str) -> None:
    expected = JOB_CHANGES[current.value, verb]
    if expected == REFUSED:
        with pytest.raises(InvalidState, match=rf"^job 'j1' is {current.value}; cannot {verb}$"):
            lifecycle.job_state_change("j1", current.value, TARGET_OF_VERB[verb], verb)
    else:
        assert lifecycle.job_state_change("j1", current.value, TARGET_OF_VERB[verb], verb) is expected


@pytest.mark.parametrize("target", [JobState.ERRORED, JobState.COMPLETED])
def test_no_operator_verb_moves_a_job_to_errored_or_completed(target: JobState) -> None:
    with pytest.raises(ValueError, match="not a state an operator moves a job to"):
        lifecycle.job_state_change("j1", "active", target, "set")


# -- creating and updating jobs --------------------------------------------------------------------


def spec(schedule: Schedule | None = None, **changes: object) -> JobSpec:
    base = JobSpec(name="nightly", job_type="t", schedule=schedule or Schedule.cron_expr("0 3 * * *"))
    return replace(base, **changes)


def job(state: JobState = JobState.ACTIVE, job_spec: JobSpec | None = None) -> Job:
    return Job(job_id="j1", shard_id=0, spec=job_spec or spec(), state=state, next_fire_at=T0 + timedelta(hours=1),
               created_at=T0, updated_at=T0)


def test_an_interval_without_an_anchor_counts_from_when_it_is_stored() -> None:
    every = timedelta(minutes=5)
    assert lifecycle.anchor_interval(spec(Schedule.interval(every)), T0).schedule == Schedule.interval(every, T0)
    anchored = spec(Schedule.interval(every, T0 - timedelta(days=1)))
    assert lifecycle.anchor_interval(anchored, T0) == anchored
    cron = spec()
    assert lifecycle.anchor_interval(cron, T0) == cron


def test_creating_a_job_again_returns_it_unless_its_spec_differs() -> None:
    existing = job(job_spec=spec(Schedule.interval(timedelta(minutes=5), T0)))
    assert lifecycle.idempotent_create(existing, spec(Schedule.interval(timedelta(minutes=5)))) is existing
    with pytest.raises(JobAlreadyExists, match="priority"):
        lifecycle.idempotent_create(existing, spec(Schedule.interval(timedelta(minutes=5)), priority=3))
    with pytest.raises(JobAlreadyExists, match="schedule"):
        lifecycle.idempotent_create(existing, spec(Schedule.interval(timedelta(minutes=6))))


def test_first_difference_names_the_first_field_in_its_order() -> None:
    assert lifecycle.first_difference(spec(), spec()) is None
    assert lifecycle.first_difference(spec(), spec(priority=1, payload=b"x")) == "payload"
    assert lifecycle.first_difference(spec(), spec(job_type="u", priority=1)) == "job_type"


def test_an_update_keeps_its_tenant_and_name() -> None:
    lifecycle.check_update(job(), spec(priority=5))
    with pytest.raises(InvalidArgument, match="tenant"):
        lifecycle.check_update(job(), spec(tenant="other"))
    with pytest.raises(InvalidArgument, match="name"):
        lifecycle.check_update(job(), spec(name="daily"))


@pytest.mark.parametrize(
    ("state", "after"),
    [("active", "active"), ("paused", "paused"), ("errored", "errored"), ("completed", "active")],
)
def test_a_new_schedule_starts_afresh_and_brings_a_completed_job_back(state: str, after: str) -> None:
    current = job(JobState(state))
    hourly = spec(Schedule.cron_expr("30 * * * *"))
    assert lifecycle.rescheduled(current, hourly, T0) == (T0 + timedelta(minutes=30), JobState(after))
    # The same schedule: the job keeps its next fire time and its state.
    assert lifecycle.rescheduled(current, spec(priority=9), T0) == (current.next_fire_at, JobState(state))
