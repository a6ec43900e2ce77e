"""The life of a run and of a job: its states, the events that move it, and the decisions a store
asks for before it writes.

One state machine, drawn in ``docs/state-machine.md`` (a test holds the drawing to the tables
here). A store reads a row in its transaction, asks a decision here what to write (or has it
raise the domain error), and writes it; a statement that lists states writes a named set below
with :func:`sql_list`, so neither the rules nor the lists are typed twice.

The tables hold the events that take a run or a job to a state, its own included where the
event still changes what comes next (a cancel request, a new schedule). A pair the tables do not
hold is refused, except a request for where the run or job already is (a cancel of a cancelled
run, a pause of a paused job): that is answered with nothing to write, so repeating a verb is
safe. A heartbeat, a stale result or an update that keeps a job's schedule is no event of the
machine: it leaves the state alone.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from enum import Enum, StrEnum
from typing import Any, TypeVar, overload

from fastlane.domain.errors import InvalidState, JobAlreadyExists
from fastlane.domain.models import FINAL_RUN_STATES, Job, JobSpec, JobState, Run, RunState, ScheduleKind
from fastlane.domain.records import Dispatch, JobAction, RunAction
from fastlane.domain.schedules import first_fire
from fastlane.errors import InvalidArgument

# -- named sets of states --------------------------------------------------------------------------

WITH_A_WORKER: frozenset[RunState] = frozenset({RunState.DISPATCHED, RunState.RUNNING})
"""Runs a worker has: their attempt holds a lease, and a cancel is a request the worker carries out."""

FINAL: frozenset[RunState] = FINAL_RUN_STATES
"""Runs that ended: nothing changes them but a replay or a workflow's resume."""

OVERLAP_ACTIVE: frozenset[RunState] = frozenset(RunState) - FINAL
"""Runs not ended (buffered, scheduled, dispatched, running): what a job's overlap policy counts."""

WAITING: frozenset[RunState] = frozenset({RunState.SCHEDULED, RunState.BUFFERED})
"""Runs not yet delivered: a cancel ends them at once."""

REPLAYABLE: frozenset[RunState] = frozenset({RunState.DEAD, RunState.LOST})
"""Runs an operator may replay: they ended without succeeding, and nothing else will run them."""

RERUNNABLE: frozenset[RunState] = FINAL - {RunState.SUCCEEDED}
"""Step runs a resumed workflow run schedules again: every end but success."""

TAKEN_BY: Mapping[RunAction, frozenset[RunState]] = {
    RunAction.CANCEL: OVERLAP_ACTIVE,
    RunAction.RETRY: REPLAYABLE,
}
"""The runs a bulk action takes: those its one-run verb (a cancel, a replay) may still change."""


PAUSE_FROM: frozenset[JobState] = frozenset({JobState.ACTIVE})
"""Jobs that may be paused."""

RESUME_FROM: frozenset[JobState] = frozenset({JobState.PAUSED, JobState.ERRORED})
"""Jobs that may be resumed: paused by an operator, or set aside because processing them raised."""

JOBS_TAKEN_BY: Mapping[JobAction, frozenset[JobState]] = {
    JobAction.PAUSE: PAUSE_FROM,
    JobAction.RESUME: RESUME_FROM,
    JobAction.DELETE: frozenset(JobState),
}
"""The jobs a bulk action takes: those its one-job verb (a pause, a resume, a delete) may change."""


@overload
def taken_by(action: RunAction, states: Collection[RunState]) -> frozenset[RunState]: ...
@overload
def taken_by(action: JobAction, states: Collection[JobState]) -> frozenset[JobState]: ...
def taken_by(action: RunAction | JobAction, states: Collection[RunState] | Collection[JobState]) -> frozenset[Any]:
    """The states a bulk ``action`` over a selection of ``states`` (none: any) takes."""
    takes: frozenset[Any] = TAKEN_BY[action] if isinstance(action, RunAction) else JOBS_TAKEN_BY[action]
    return takes & frozenset(states) if states else takes


def sql_list(states: Iterable[RunState] | Iterable[JobState]) -> str:
    """``'a', 'b'`` for an SQL ``IN (...)`` list, by value, so a statement reads the same each time."""
    return ", ".join(f"'{value}'" for value in sorted(state.value for state in states))


# -- the transition tables -------------------------------------------------------------------------


class RunEvent(StrEnum):
    """What happens to a run (see the state diagram for the states each one leaves)."""

    FIRE = "fire"  # an occurrence written as a run, free to go
    BUFFER = "buffer"  # an occurrence written to wait for its job's previous run (overlap policy)
    SKIP = "skip"  # an occurrence written as skipped (misfire or overlap policy)
    TRIGGER = "trigger"  # a manual run, or a step run of a workflow
    DISPATCH = "dispatch"  # handed to a worker: a new attempt holding a lease
    START = "start"  # its handler was entered; a workflow run's own run starts without a worker
    SUCCEED = "succeed"
    RETRY = "retry"  # its attempt failed or its lease ran out, with retry budget left
    FAIL = "fail"  # failed for good: no budget left, a permanent failure, or a step that could not be made
    LOSE = "lose"  # the lease of an at-most-once run ran out: it may have run, and is not run again
    STOP = "stop"  # its attempt ended after a cancel was requested (or was itself cancelled)
    CANCEL = "cancel"  # by request, by deleting its job, by an overlap policy or by its workflow run
    RELEASE = "release"  # its job's previous run ended: it leaves the overlap buffer
    REPLAY = "replay"  # an operator runs a dead or lost run again
    RERUN = "rerun"  # a resumed workflow run schedules its failed or cancelled step again
    REOPEN = "reopen"  # a resumed workflow run's own run runs again


class JobEvent(StrEnum):
    """What happens to a job."""

    CREATE = "create"
    PAUSE = "pause"
    RESUME = "resume"
    SET_ASIDE = "set_aside"  # processing it raised: it leaves the due set until resumed
    COMPLETE = "complete"  # a one-shot job's only occurrence was written
    RESCHEDULE = "reschedule"  # an update that changed its schedule: the next fire time starts afresh


_R, _E = RunState, RunEvent

RUN_CREATIONS: frozenset[tuple[RunEvent, RunState]] = frozenset({
    (_E.FIRE, _R.SCHEDULED),
    (_E.BUFFER, _R.BUFFERED),
    (_E.SKIP, _R.SKIPPED),
    (_E.TRIGGER, _R.SCHEDULED),
    (_E.START, _R.RUNNING),  # a workflow run triggered by hand: its own run is written running
    (_E.FAIL, _R.DEAD),  # a step run whose input is over the payload limit
})
"""The state a run is written in, by the event that writes it."""

RUN_TRANSITIONS: frozenset[tuple[RunState, RunEvent, RunState]] = frozenset({
    (_R.SCHEDULED, _E.DISPATCH, _R.DISPATCHED),
    (_R.SCHEDULED, _E.START, _R.RUNNING),
    (_R.DISPATCHED, _E.START, _R.RUNNING),
    *((worker, _E.SUCCEED, _R.SUCCEEDED) for worker in WITH_A_WORKER),
    *((worker, _E.RETRY, _R.SCHEDULED) for worker in WITH_A_WORKER),
    *((worker, _E.FAIL, _R.DEAD) for worker in WITH_A_WORKER),
    *((worker, _E.LOSE, _R.LOST) for worker in WITH_A_WORKER),
    *((worker, _E.STOP, _R.CANCELLED) for worker in WITH_A_WORKER),
    *((worker, _E.CANCEL, worker) for worker in WITH_A_WORKER),  # cancel requested: the worker stops it
    *((waiting, _E.CANCEL, _R.CANCELLED) for waiting in WAITING),
    (_R.BUFFERED, _E.RELEASE, _R.SCHEDULED),
    *((ended, _E.REPLAY, _R.SCHEDULED) for ended in REPLAYABLE),
    *((ended, _E.RERUN, _R.SCHEDULED) for ended in RERUNNABLE),
    # A workflow run's own run ends dead when the workflow run fails, cancelled when it is cancelled.
    (_R.DEAD, _E.REOPEN, _R.RUNNING),
    (_R.CANCELLED, _E.REOPEN, _R.RUNNING),
})
"""``(state, event, next state)`` for every event a run accepts."""

JOB_CREATIONS: frozenset[tuple[JobEvent, JobState]] = frozenset({(JobEvent.CREATE, JobState.ACTIVE)})
"""The state a job is written in."""

JOB_TRANSITIONS: frozenset[tuple[JobState, JobEvent, JobState]] = frozenset({
    *((source, JobEvent.PAUSE, JobState.PAUSED) for source in PAUSE_FROM),
    *((source, JobEvent.RESUME, JobState.ACTIVE) for source in RESUME_FROM),
    (JobState.ACTIVE, JobEvent.SET_ASIDE, JobState.ERRORED),
    (JobState.ACTIVE, JobEvent.COMPLETE, JobState.COMPLETED),
    (JobState.ACTIVE, JobEvent.RESCHEDULE, JobState.ACTIVE),
    (JobState.PAUSED, JobEvent.RESCHEDULE, JobState.PAUSED),
    (JobState.ERRORED, JobEvent.RESCHEDULE, JobState.ERRORED),
    (JobState.COMPLETED, JobEvent.RESCHEDULE, JobState.ACTIVE),  # a new schedule gives it occurrences again
})
"""``(state, event, next state)`` for every event a job accepts."""


_S = TypeVar("_S", RunState, JobState)
_V = TypeVar("_V", RunEvent, JobEvent)


def _as_mapping(edges: frozenset[tuple[_S, _V, _S]]) -> Mapping[tuple[_S, _V], _S]:
    targets: dict[tuple[_S, _V], _S] = {}
    for source, event, target in edges:
        if targets.setdefault((source, event), target) != target:
            raise ValueError(f"{event} takes {source} to two states")
    return targets


_RUN_TARGETS = _as_mapping(RUN_TRANSITIONS)
_JOB_TARGETS = _as_mapping(JOB_TRANSITIONS)


def run_target(state: RunState, event: RunEvent) -> RunState | None:
    """Where ``event`` takes a run in ``state``; None where the table refuses it."""
    return _RUN_TARGETS.get((state, event))


def job_target(state: JobState, event: JobEvent) -> JobState | None:
    """Where ``event`` takes a job in ``state``; None where the table refuses it."""
    return _JOB_TARGETS.get((state, event))


# -- decisions on runs -----------------------------------------------------------------------------


class CancelDecision(Enum):
    """What cancelling a run writes."""

    ALREADY = "already"  # cancelled, or its cancel requested while a worker has it: nothing
    REQUEST = "request"  # a worker has it: ask the worker to stop it
    CANCEL = "cancel"  # not yet delivered: cancelled at once


def cancel_in_effect(run: Run) -> bool:
    """True when a cancel of ``run`` has nothing left to do: it is cancelled, or being cancelled."""
    return run.state is RunState.CANCELLED or (run.cancel_requested and run.state in WITH_A_WORKER)


def cancel_decision(run: Run) -> CancelDecision:
    """What a cancel of ``run`` (as read, locked) writes. Raises :class:`InvalidState` for a run
    that ended otherwise, which a cancel can no longer change."""
    if cancel_in_effect(run):
        return CancelDecision.ALREADY
    target = run_target(run.state, RunEvent.CANCEL)
    if target is None:
        raise InvalidState("run", run.run_id, run.state.value, "cancel")
    return CancelDecision.CANCEL if target is RunState.CANCELLED else CancelDecision.REQUEST


def check_replayable(run_id: str, state: str) -> None:
    """Raise :class:`InvalidState` unless a run in ``state`` (as read) may be replayed."""
    if state not in REPLAYABLE:
        raise InvalidState("run", run_id, state, "retry (only dead or lost runs can be replayed)")


# -- decisions on jobs -----------------------------------------------------------------------------

_SOURCES = {JobState.PAUSED: PAUSE_FROM, JobState.ACTIVE: RESUME_FROM}  # of a pause and of a resume


def job_state_change(job_id: str, current: str, target: JobState, verb: str) -> bool:
    """Whether an operator's pause (``target`` paused) or resume (``target`` active) of a job in
    ``current`` (as read, locked) writes anything: False when it is there already. Raises
    :class:`InvalidState` (``cannot {verb}``) when the job cannot go there from ``current``."""
    sources = _SOURCES.get(target)
    if sources is None:
        raise ValueError(f"{target.value} is not a state an operator moves a job to")
    if current == target.value:
        return False
    if current not in sources:
        raise InvalidState("job", job_id, current, verb)
    return True


def anchor_interval(spec: JobSpec, now: datetime) -> JobSpec:
    """Interval schedules without an anchor count from the moment they are stored."""
    schedule = spec.schedule
    if schedule.kind is ScheduleKind.INTERVAL and schedule.anchor is None:
        return replace(spec, schedule=replace(schedule, anchor=now))
    return spec


def first_difference(a: JobSpec, b: JobSpec) -> str | None:
    """The name of the first field where two specs differ (for a precise conflict message)."""
    for name in ("job_type", "schedule", "payload", "priority", "concurrency_key", "concurrency_limit", "retry",
                 "misfire", "overlap", "delivery", "timeout", "lease_ttl"):
        if getattr(a, name) != getattr(b, name):
            return name
    return None


def idempotent_create(existing: Job, requested: JobSpec) -> Job:
    """A create of a name that exists: the job unchanged if ``requested`` is its spec (an interval
    without an anchor takes the stored one), else :class:`JobAlreadyExists` naming what differs."""
    if requested.schedule.kind is ScheduleKind.INTERVAL and requested.schedule.anchor is None:
        requested = replace(requested, schedule=replace(requested.schedule, anchor=existing.spec.schedule.anchor))
    differing = first_difference(existing.spec, requested)
    if differing is not None:
        raise JobAlreadyExists(requested.tenant, requested.name, differing)
    return existing


def check_update(current: Job, spec: JobSpec) -> None:
    """Raise :class:`InvalidArgument` if ``spec`` would move the job to another tenant or name."""
    if spec.tenant != current.tenant:
        raise InvalidArgument("tenant", "cannot be changed")
    if spec.name != current.name:
        raise InvalidArgument("name", f"cannot be changed (is {current.name!r}); create a new job instead")


def rescheduled(current: Job, spec: JobSpec, now: datetime) -> tuple[datetime | None, JobState]:
    """A changed schedule starts afresh from now; an unchanged one keeps its next fire time."""
    if spec.schedule == current.spec.schedule:
        return current.next_fire_at, current.state
    state = job_target(current.state, JobEvent.RESCHEDULE)
    assert state is not None, "every job state accepts a new schedule"
    return first_fire(spec.schedule, now), state


# -- dispatch under concurrency keys ---------------------------------------------------------------


def admit_under_caps(
    dispatches: Sequence[Dispatch], scheduled: Collection[str], active: Mapping[tuple[str, str], int]
) -> tuple[list[Dispatch], list[str]]:
    """Split capped dispatches of runs still ``scheduled`` into those their key has room for
    (``active``: runs of each (tenant, key) dispatched or running now) and the run ids blocked,
    in the order given; dispatches of runs no longer scheduled are in neither."""
    taken = dict(active)
    admitted: list[Dispatch] = []
    blocked: list[str] = []
    for dispatch in dispatches:
        if dispatch.run_id not in scheduled:
            continue
        if dispatch.cap is None:
            admitted.append(dispatch)
            continue
        key = (dispatch.cap.tenant, dispatch.cap.key)
        if taken.get(key, 0) < dispatch.cap.limit:
            taken[key] = taken.get(key, 0) + 1
            admitted.append(dispatch)
        else:
            blocked.append(dispatch.run_id)
    return admitted, blocked


def capped_keys(dispatches: Sequence[Dispatch]) -> list[tuple[str, str]]:
    """The distinct (tenant, key) of these dispatches, sorted: locks taken in one order cannot deadlock."""
    return sorted({(d.cap.tenant, d.cap.key) for d in dispatches if d.cap is not None})
