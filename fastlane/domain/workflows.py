"""Workflows: versioned DAGs of steps whose runs wait for other runs.

A workflow is a *definition*, a JSON document written by people (the CLI reads it from a file,
the SDK builds it, the API carries it as text), checked here and only here:

.. code-block:: json

    {"name": "billing", "failure_policy": "fail_fast",
     "schedule": {"cron": "0 2 * * *", "timezone": "Europe/Paris"},
     "input": {"day": "yesterday"},
     "steps": [
       {"name": "debit", "job_type": "ledger.debit", "retry": {"max_attempts": 5}},
       {"name": "credit", "job_type": "ledger.credit", "after": ["debit"]},
       {"name": "refund", "job_type": "ledger.refund", "after": [{"step": "credit", "on": "on_failure"}]},
       {"name": "notify", "job_type": "mail.send", "for_each": "input.customers", "after": ["credit"]}
     ]}

A *workflow run* is started by the workflow's schedule or by a trigger with input. Its steps are
ordinary runs (dispatch, retries, fairness and history as any run), created at most once per
workflow run: ``UNIQUE (workflow_run_id, step, item)`` on the runs table. What to do next is
decided by :func:`plan_advance`, a pure function of the definition and the step runs as stored,
so any node may decide it again at any time (after a failover, or a result delivered twice) and
reach the same answer; the stores apply it under a lock on the workflow run's row.

Step semantics:

- A step is *ready* when every parent has ended; it is then created if every edge into it holds
  (``on_success``: the parent succeeded; ``on_failure``: it failed; ``always``: it ended in any
  way), and otherwise *skipped* (which its own children see as an end that is not a success).
- A step with ``for_each`` runs once per item of a list (``input``, ``input.<key>``, a parent's
  output ``<step>`` or ``<step>.<key>``); it succeeds when every item succeeded, fails when one
  failed, and its children receive the list of the items' outputs (fan-in).
- A step's run receives as its payload a JSON object: ``workflow_run_id``, ``step``, ``input``
  (the workflow run's), ``params`` (the step's), ``parents`` (each parent's output) and, for a
  fan-out, ``item`` and ``index``.
- A failed step whose failure no ``on_failure`` edge handles fails the workflow run: at once
  under ``fail_fast`` (pending steps are cancelled), once every independent branch has ended
  under ``continue``. A failed workflow run can be resumed: its failed and cancelled steps run
  again, its succeeded ones do not.
"""

from __future__ import annotations

import graphlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

import orjson

from fastlane.domain import validation
from fastlane.domain.limits import DEFAULT_MAX_PAYLOAD_BYTES, MAX_LEASE_TTL, MAX_TIMEOUT, MIN_LEASE_TTL
from fastlane.domain.models import (
    DEFAULT_TENANT,
    JobSpec,
    MisfireKind,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    RunState,
    Schedule,
)
from fastlane.errors import InvalidArgument

# The job type of the runs that start workflow runs: a node starts them itself, no worker does.
WORKFLOW_JOB_TYPE = "fastlane.workflow"
# The job that carries a workflow's schedule is named after it, in a namespace of its own.
WORKFLOW_JOB_PREFIX = "workflow:"

MAX_STEPS = 100
MAX_EDGES_PER_STEP = 100
MAX_FAN_OUT = 1_000  # items of one for_each
MAX_OUTPUT_BYTES = 16 << 10  # a handler's result, kept for its children
MAX_DEFINITION_BYTES = 256 << 10
E = TypeVar("E", bound=StrEnum)

MAX_NAME_LENGTH = 100  # a workflow's or a step's name (the job is named "workflow:<name>")


class EdgeCondition(StrEnum):
    """When an edge lets its child start: after the parent succeeded, failed, or either."""

    ON_SUCCESS = "on_success"
    ON_FAILURE = "on_failure"
    ALWAYS = "always"


class FailurePolicy(StrEnum):
    """What an unhandled failure does: end the run at once, or let other branches finish."""

    FAIL_FAST = "fail_fast"
    CONTINUE = "continue"


class WorkflowRunState(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class StepState(StrEnum):
    """A step of one workflow run, as :func:`step_states` derives it from its runs."""

    WAITING = "waiting"  # parents not ended yet
    ACTIVE = "active"  # runs created, not all ended
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"  # an edge into it cannot hold
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self not in (StepState.WAITING, StepState.ACTIVE)


@dataclass(frozen=True, slots=True)
class Edge:
    parent: str
    condition: EdgeCondition = EdgeCondition.ON_SUCCESS


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSpec:
    """One step: what its runs are (job type, parameters, policies) and what they wait for."""

    name: str
    job_type: str
    params: Any = None  # JSON value, handed to every run of the step
    after: tuple[Edge, ...] = ()
    for_each: str | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout: timedelta | None = None
    lease_ttl: timedelta = timedelta(seconds=30)
    priority: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowSpec:
    """A workflow definition as checked by :func:`parse_definition`."""

    name: str
    tenant: str = DEFAULT_TENANT
    steps: tuple[StepSpec, ...]
    failure_policy: FailurePolicy = FailurePolicy.FAIL_FAST
    schedule: Schedule | None = None  # None: started by triggers only
    input: Any = None  # the input of runs its schedule starts
    overlap: OverlapPolicy = OverlapPolicy.ALLOW
    misfire: MisfirePolicy = field(default_factory=MisfirePolicy)

    @property
    def job_name(self) -> str:
        return WORKFLOW_JOB_PREFIX + self.name

    def step(self, name: str) -> StepSpec:
        return next(step for step in self.steps if step.name == name)

    def children(self, name: str) -> list[tuple[StepSpec, Edge]]:
        return [(step, edge) for step in self.steps for edge in step.after if edge.parent == name]

    def schedule_job(self) -> JobSpec | None:
        """The job that starts this workflow's runs on its schedule (None without one)."""
        if self.schedule is None:
            return None
        return JobSpec(name=self.job_name, tenant=self.tenant, job_type=WORKFLOW_JOB_TYPE, schedule=self.schedule,
                       payload=orjson.dumps(self.input), overlap=self.overlap, misfire=self.misfire)


@dataclass(frozen=True, slots=True, kw_only=True)
class Workflow:
    """A stored version of a workflow."""

    workflow_id: str
    job_id: str  # the same for every version: its schedule's job, and the job of its runs
    version: int
    spec: WorkflowSpec
    definition: str  # the canonical JSON document
    created_at: datetime

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def tenant(self) -> str:
        return self.spec.tenant


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRun:
    """A run of a step, as the workflow logic needs it."""

    step: str
    item: int
    run_id: str
    state: RunState
    output: bytes | None = None
    last_error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SettledStep:
    """A step that ended without runs of its own: skipped, cancelled before it was created, a
    fan-out over an empty list (succeeded), or one whose runs could not be made (failed)."""

    state: StepState
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowRun:
    workflow_run_id: str
    tenant: str
    workflow_id: str
    workflow_name: str
    version: int
    job_id: str
    shard_id: int
    state: WorkflowRunState
    input: bytes
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    error: str | None = None
    settled: Mapping[str, SettledStep] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepView:
    """One step of a workflow run for people: its state, runs and error."""

    name: str
    state: StepState
    run_ids: tuple[str, ...] = ()
    run_states: tuple[RunState, ...] = ()  # of each run in run_ids
    items: int = 0
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NewStepRun:
    """A step run to create: its payload is built here, the rest comes from the step."""

    step: StepSpec
    item: int
    payload: bytes
    state: RunState = RunState.SCHEDULED  # DEAD when its payload could not be made
    last_error: str | None = None


@dataclass(slots=True, kw_only=True)
class AdvancePlan:
    create: list[NewStepRun] = field(default_factory=list)
    settle: dict[str, SettledStep] = field(default_factory=dict)  # steps ending without runs
    cancel: list[str] = field(default_factory=list)  # run ids of steps to cancel (fail fast)
    end: WorkflowRunState | None = None
    error: str | None = None


# -- the definition ------------------------------------------------------------------------------


def parse_definition(document: bytes | str | Mapping[str, Any], *, tenant: str = DEFAULT_TENANT,
                     max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES) -> WorkflowSpec:
    """Check a definition and return it as a spec, or raise :class:`InvalidArgument` naming the
    field (``definition.steps[2].after[0]``) and what is wrong with it."""
    if isinstance(document, (bytes, str)):
        if len(document) > MAX_DEFINITION_BYTES:
            raise InvalidArgument("definition", f"{len(document)} bytes is over the limit of {MAX_DEFINITION_BYTES}")
        try:
            document = orjson.loads(document)
        except orjson.JSONDecodeError as error:
            raise InvalidArgument("definition", f"is not JSON: {error}") from None
    doc = _object("definition", document, {"name", "steps", "failure_policy", "schedule", "input", "overlap",
                                           "misfire"})
    name = _name("definition.name", doc.get("name"))
    raw_steps = doc.get("steps")
    if not isinstance(raw_steps, list) or not 1 <= len(raw_steps) <= MAX_STEPS:
        raise InvalidArgument("definition.steps", f"must be a list of 1 to {MAX_STEPS} steps")
    steps = tuple(_step(f"definition.steps[{i}]", raw, max_payload) for i, raw in enumerate(raw_steps))
    _check_graph(steps)
    schedule = None if doc.get("schedule") is None else _schedule("definition.schedule", doc["schedule"])
    input_value = doc.get("input")
    if len(orjson.dumps(input_value)) > max_payload:
        raise InvalidArgument("definition.input", f"is over the payload limit of {max_payload} bytes")
    spec = WorkflowSpec(
        name=name, tenant=validation.name("tenant", tenant), steps=steps,
        failure_policy=_choice("definition.failure_policy", doc.get("failure_policy", "fail_fast"), FailurePolicy),
        schedule=schedule, input=input_value,
        overlap=_choice("definition.overlap", doc.get("overlap", "allow"), OverlapPolicy),
        misfire=_misfire("definition.misfire", doc.get("misfire", {})),
    )
    if (job := spec.schedule_job()) is not None:
        validation.validate_spec(job, max_payload=max_payload)
    return spec


def definition_document(spec: WorkflowSpec) -> str:
    """The canonical JSON of a spec: what is stored, compared and shown."""
    doc: dict[str, Any] = {"name": spec.name, "failure_policy": spec.failure_policy.value,
                           "steps": [_step_document(step) for step in spec.steps]}
    if spec.schedule is not None:
        doc["schedule"] = _schedule_document(spec.schedule)
    if spec.input is not None:
        doc["input"] = spec.input
    if spec.overlap is not OverlapPolicy.ALLOW:
        doc["overlap"] = spec.overlap.value
    if spec.misfire != MisfirePolicy():
        doc["misfire"] = {"kind": spec.misfire.kind.value, "grace_seconds": spec.misfire.grace.total_seconds(),
                          "fire_all_cap": spec.misfire.fire_all_cap}
    return orjson.dumps(doc).decode()


def _step(where: str, raw: Any, max_payload: int) -> StepSpec:
    doc = _object(where, raw, {"name", "job_type", "params", "after", "for_each", "retry", "timeout_seconds",
                               "lease_ttl_seconds", "priority"})
    if len(orjson.dumps(doc.get("params"))) > max_payload:
        raise InvalidArgument(f"{where}.params", f"is over the payload limit of {max_payload} bytes")
    job_type = validation.name(f"{where}.job_type", _string(f"{where}.job_type", doc.get("job_type")))
    if job_type == WORKFLOW_JOB_TYPE:
        raise InvalidArgument(f"{where}.job_type", f"{WORKFLOW_JOB_TYPE!r} is reserved for the runs that start workflows")
    after = doc.get("after", [])
    if not isinstance(after, list) or len(after) > MAX_EDGES_PER_STEP:
        raise InvalidArgument(f"{where}.after", f"must be a list of at most {MAX_EDGES_PER_STEP} edges")
    for_each = doc.get("for_each")
    if for_each is not None:
        for_each = validation.name(f"{where}.for_each", _string(f"{where}.for_each", for_each))
    retry = _object(f"{where}.retry", doc.get("retry", {}), {"max_attempts", "backoff_base_seconds",
                                                              "backoff_cap_seconds"})
    policy = RetryPolicy(
        max_attempts=validation.count(f"{where}.retry.max_attempts", _int(f"{where}.retry.max_attempts",
                                                                          retry.get("max_attempts", 3)), 1, 1_000),
        backoff_base=_seconds(f"{where}.retry.backoff_base_seconds", retry.get("backoff_base_seconds", 1.0),
                              timedelta(milliseconds=1), timedelta(days=7)),
        backoff_cap=_seconds(f"{where}.retry.backoff_cap_seconds", retry.get("backoff_cap_seconds", 300.0),
                             timedelta(milliseconds=1), timedelta(days=7)),
    )
    if policy.backoff_cap < policy.backoff_base:
        raise InvalidArgument(f"{where}.retry.backoff_cap_seconds", "must be at least backoff_base_seconds")
    timeout = doc.get("timeout_seconds")
    return StepSpec(
        name=_name(f"{where}.name", doc.get("name")),
        job_type=job_type,
        params=doc.get("params"),
        after=tuple(_edge(f"{where}.after[{i}]", edge) for i, edge in enumerate(after)),
        for_each=for_each,
        retry=policy,
        timeout=None if timeout is None else _seconds(f"{where}.timeout_seconds", timeout, timedelta(milliseconds=1),
                                                      MAX_TIMEOUT),
        lease_ttl=_seconds(f"{where}.lease_ttl_seconds", doc.get("lease_ttl_seconds", 30.0), MIN_LEASE_TTL,
                           MAX_LEASE_TTL),
        priority=validation.count(f"{where}.priority", _int(f"{where}.priority", doc.get("priority", 0)), -1000, 1000),
    )


def _step_document(step: StepSpec) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": step.name, "job_type": step.job_type}
    if step.params is not None:
        doc["params"] = step.params
    if step.after:
        doc["after"] = [edge.parent if edge.condition is EdgeCondition.ON_SUCCESS
                        else {"step": edge.parent, "on": edge.condition.value} for edge in step.after]
    if step.for_each is not None:
        doc["for_each"] = step.for_each
    if step.retry != RetryPolicy():
        doc["retry"] = {"max_attempts": step.retry.max_attempts,
                        "backoff_base_seconds": step.retry.backoff_base.total_seconds(),
                        "backoff_cap_seconds": step.retry.backoff_cap.total_seconds()}
    if step.timeout is not None:
        doc["timeout_seconds"] = step.timeout.total_seconds()
    if step.lease_ttl != timedelta(seconds=30):
        doc["lease_ttl_seconds"] = step.lease_ttl.total_seconds()
    if step.priority:
        doc["priority"] = step.priority
    return doc


def _edge(where: str, raw: Any) -> Edge:
    if isinstance(raw, str):
        return Edge(_name(where, raw))
    doc = _object(where, raw, {"step", "on"})
    return Edge(_name(f"{where}.step", doc.get("step")), _choice(f"{where}.on", doc.get("on", "on_success"),
                                                                  EdgeCondition))


def _check_graph(steps: Sequence[StepSpec]) -> None:
    """Names unique, every edge to a step that exists, no cycle, ``for_each`` sources resolvable."""
    index = {}
    for i, step in enumerate(steps):
        if step.name in index:
            raise InvalidArgument(f"definition.steps[{i}].name", f"{step.name!r} is the name of another step")
        index[step.name] = i
    sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for i, step in enumerate(steps):
        parents = [edge.parent for edge in step.after]
        for j, parent in enumerate(parents):
            if parent not in index:
                raise InvalidArgument(f"definition.steps[{i}].after[{j}]", f"no step is named {parent!r}")
            if parents.index(parent) != j:
                raise InvalidArgument(f"definition.steps[{i}].after[{j}]", f"{parent!r} is named twice")
        sorter.add(step.name, *parents)
        if step.for_each is not None:
            source = step.for_each.split(".", 1)[0]
            if source != "input" and source not in parents:
                raise InvalidArgument(f"definition.steps[{i}].for_each",
                                      f"{step.for_each!r} must be input, input.<key>, or a parent's <step>[.<key>]")
    try:
        sorter.prepare()
    except graphlib.CycleError as error:
        cycle = " -> ".join(error.args[1])
        raise InvalidArgument("definition.steps", f"the edges make a cycle: {cycle}") from None


def topological(spec: WorkflowSpec) -> list[StepSpec]:
    """The steps, parents before children (and otherwise in the definition's order)."""
    order: list[StepSpec] = []
    placed: set[str] = set()
    remaining = list(spec.steps)
    while remaining:  # at most MAX_STEPS passes over at most MAX_STEPS steps
        for step in list(remaining):
            if all(edge.parent in placed for edge in step.after):
                order.append(step)
                placed.add(step.name)
                remaining.remove(step)
    return order


def _schedule(where: str, raw: Any) -> Schedule:
    doc = _object(where, raw, {"cron", "timezone", "every_seconds", "at", "now"})
    if "cron" in doc:
        return Schedule.cron_expr(_string(f"{where}.cron", doc["cron"]), _string(f"{where}.timezone",
                                                                                   doc.get("timezone", "UTC")))
    if "every_seconds" in doc:
        return Schedule.interval(_seconds(f"{where}.every_seconds", doc["every_seconds"], timedelta(milliseconds=100),
                                          timedelta(days=36_600)))
    if "at" in doc:
        try:
            at = datetime.fromisoformat(_string(f"{where}.at", doc["at"]).replace("Z", "+00:00"))
        except ValueError:
            raise InvalidArgument(f"{where}.at", "must be an RFC 3339 instant, e.g. 2027-01-01T09:00:00Z") from None
        return Schedule.at_instant(validation.instant(f"{where}.at", at))
    if doc.get("now") is True:
        return Schedule.now()
    raise InvalidArgument(where, 'must be {"cron": ..., "timezone": ...}, {"every_seconds": N}, {"at": ...} or {"now": true}')


def _schedule_document(schedule: Schedule) -> dict[str, Any]:
    if schedule.cron is not None:
        return {"cron": schedule.cron, "timezone": schedule.timezone}
    if schedule.every is not None:
        return {"every_seconds": schedule.every.total_seconds()}
    if schedule.at is not None:
        return {"at": schedule.at.isoformat().replace("+00:00", "Z")}
    return {"now": True}


def _misfire(where: str, raw: Any) -> MisfirePolicy:
    doc = _object(where, raw, {"kind", "grace_seconds", "fire_all_cap"})
    return MisfirePolicy(
        kind=_choice(f"{where}.kind", doc.get("kind", "fire_once"), MisfireKind),
        grace=_seconds(f"{where}.grace_seconds", doc.get("grace_seconds", 10.0), timedelta(0), timedelta(days=366)),
        fire_all_cap=validation.count(f"{where}.fire_all_cap", _int(f"{where}.fire_all_cap",
                                                                    doc.get("fire_all_cap", 100)), 1, 10_000),
    )


def _object(where: str, raw: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise InvalidArgument(where, "must be a JSON object")
    if unknown := sorted(set(raw) - allowed):
        raise InvalidArgument(f"{where}.{unknown[0]}", f"is not a field here (fields: {', '.join(sorted(allowed))})")
    return raw


def _string(where: str, raw: Any) -> str:
    if not isinstance(raw, str):
        raise InvalidArgument(where, "must be a string")
    return validation.text(where, raw, max_length=1_000)


def _name(where: str, raw: Any) -> str:
    value = validation.name(where, _string(where, raw))
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidArgument(where, f"must be at most {MAX_NAME_LENGTH} characters")
    return value


def _int(where: str, raw: Any) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool):
        raise InvalidArgument(where, "must be an integer")
    return raw


def _seconds(where: str, raw: Any, low: timedelta, high: timedelta) -> timedelta:
    if not isinstance(raw, (int, float)) or isinstance(raw, bool) or raw != raw:
        raise InvalidArgument(where, "must be a number of seconds")
    if not low.total_seconds() <= raw <= high.total_seconds():
        raise InvalidArgument(where, f"{raw:g} s is out of range [{low.total_seconds():g} s, {high.total_seconds():g} s]")
    return timedelta(seconds=raw)


def _choice(where: str, raw: Any, kind: type[E]) -> E:
    try:
        return kind(raw)
    except ValueError:
        raise InvalidArgument(where, f"{raw!r} is not one of {', '.join(kind)}") from None


def parse_input(raw: bytes, max_payload: int) -> Any:
    """A trigger's input: JSON (empty: null), within the payload limit."""
    validation.payload("input", raw, max_payload)
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise InvalidArgument("input", f"is not JSON: {error}") from None


def output_of(raw: bytes) -> bytes:
    """A handler's output as kept: JSON within MAX_OUTPUT_BYTES (anything else is dropped)."""
    if not raw or len(raw) > MAX_OUTPUT_BYTES:
        return b""
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        return b""
    return raw


# -- running a workflow ----------------------------------------------------------------------------

_FAILED_RUNS = frozenset({RunState.DEAD, RunState.LOST, RunState.FAILED})


def step_states(spec: WorkflowSpec, runs: Sequence[StepRun], settled: Mapping[str, SettledStep]) -> dict[str, StepState]:
    """Each step's state from its runs (or its settled record, or WAITING with neither)."""
    by_step: dict[str, list[StepRun]] = {}
    for run in runs:
        by_step.setdefault(run.step, []).append(run)
    states = {}
    for step in spec.steps:
        if step.name in settled:
            states[step.name] = settled[step.name].state
        elif (its := by_step.get(step.name)) is not None:
            states[step.name] = _state_of_runs(its)
        else:
            states[step.name] = StepState.WAITING
    return states


def _state_of_runs(runs: Sequence[StepRun]) -> StepState:
    if any(not run.state.is_final for run in runs):
        return StepState.ACTIVE
    if all(run.state is RunState.SUCCEEDED for run in runs):
        return StepState.SUCCEEDED
    if any(run.state in _FAILED_RUNS for run in runs):
        return StepState.FAILED
    return StepState.CANCELLED  # cancelled (or skipped) without a failure


def _edge_holds(edge: Edge, parent: StepState) -> bool:
    if edge.condition is EdgeCondition.ALWAYS:
        return True
    if edge.condition is EdgeCondition.ON_FAILURE:
        return parent is StepState.FAILED
    return parent is StepState.SUCCEEDED


def unhandled_failures(spec: WorkflowSpec, states: Mapping[str, StepState]) -> list[str]:
    """Failed or cancelled steps no ``on_failure`` edge takes care of: they fail the workflow run."""
    return [step.name for step in spec.steps
            if states[step.name] in (StepState.FAILED, StepState.CANCELLED)
            and not any(edge.condition is EdgeCondition.ON_FAILURE for _, edge in spec.children(step.name))]


def plan_advance(spec: WorkflowSpec, workflow_run: WorkflowRun, runs: Sequence[StepRun], *,
                 max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES) -> AdvancePlan:
    """What a running workflow run does next, given its step runs as stored now."""
    plan = AdvancePlan()
    if workflow_run.state is not WorkflowRunState.RUNNING:
        return plan
    settled = dict(workflow_run.settled)
    states = step_states(spec, runs, settled)
    outputs = _outputs(runs)
    failures = unhandled_failures(spec, states)
    if failures and spec.failure_policy is FailurePolicy.FAIL_FAST:
        return _fail_fast(spec, states, runs, failures)
    input_value = _json(workflow_run.input)
    for step in topological(spec):
        if states[step.name] is not StepState.WAITING:
            continue
        parents = [states[edge.parent] for edge in step.after]
        if not all(parent.ended for parent in parents):
            continue
        if not all(_edge_holds(edge, state) for edge, state in zip(step.after, parents, strict=True)):
            plan.settle[step.name] = SettledStep(state=StepState.SKIPPED)
            states[step.name] = StepState.SKIPPED  # its children, later in this loop, see it ended
            continue
        created = _new_runs(spec, step, workflow_run, input_value, outputs, max_payload)
        if isinstance(created, SettledStep):
            plan.settle[step.name] = created
            states[step.name] = created.state
        else:
            plan.create += created
            states[step.name] = StepState.ACTIVE
    if all(state.ended for state in states.values()):
        failures = unhandled_failures(spec, states)
        plan.end = WorkflowRunState.FAILED if failures else WorkflowRunState.SUCCEEDED
        plan.error = _failure_text(failures, runs, {**settled, **plan.settle}) if failures else None
    return plan


def _fail_fast(spec: WorkflowSpec, states: Mapping[str, StepState], runs: Sequence[StepRun],
               failures: list[str]) -> AdvancePlan:
    plan = AdvancePlan(end=WorkflowRunState.FAILED, error=_failure_text(failures, runs, {}))
    plan.cancel += [run.run_id for run in runs if not run.state.is_final]
    for step in spec.steps:
        if states[step.name] is StepState.WAITING:
            plan.settle[step.name] = SettledStep(state=StepState.CANCELLED, error="cancelled: the workflow run failed")
    return plan


def plan_cancel(spec: WorkflowSpec, runs: Sequence[StepRun], settled: Mapping[str, SettledStep]) -> AdvancePlan:
    """Cancel a running workflow run: its unfinished runs and its steps not yet created."""
    states = step_states(spec, runs, settled)
    plan = AdvancePlan(end=WorkflowRunState.CANCELLED, error="cancelled by request")
    plan.cancel += [run.run_id for run in runs if not run.state.is_final]
    for step in spec.steps:
        if states[step.name] is StepState.WAITING:
            plan.settle[step.name] = SettledStep(state=StepState.CANCELLED, error="cancelled by request")
    return plan


def resume_targets(spec: WorkflowSpec, runs: Sequence[StepRun],
                   settled: Mapping[str, SettledStep]) -> tuple[list[str], dict[str, SettledStep]]:
    """What resuming an ended workflow run does: the runs to schedule again (every run of a
    failed or cancelled step that did not succeed) and the settled steps kept (the others are
    decided afresh: a step skipped or cancelled because of the failure may run now)."""
    states = step_states(spec, runs, settled)
    again = [run.run_id for run in runs
             if states[run.step] in (StepState.FAILED, StepState.CANCELLED) and run.state is not RunState.SUCCEEDED
             and run.step not in settled]
    kept = {name: value for name, value in settled.items() if value.state is StepState.SUCCEEDED}
    return again, kept


def _failure_text(failures: Sequence[str], runs: Sequence[StepRun], settled: Mapping[str, SettledStep]) -> str:
    parts = []
    for name in failures:
        error = next((run.last_error for run in runs if run.step == name and run.last_error), None)
        error = error or (settled[name].error if name in settled else None)
        parts.append(f"step {name} failed" + (f": {error}" if error else ""))
    return "; ".join(parts)[:4_000]


def _outputs(runs: Sequence[StepRun]) -> dict[str, list[tuple[int, Any]]]:
    outputs: dict[str, list[tuple[int, Any]]] = {}
    for run in runs:
        if run.state is RunState.SUCCEEDED:
            outputs.setdefault(run.step, []).append((run.item, _json(run.output)))
    return outputs


def _new_runs(spec: WorkflowSpec, step: StepSpec, workflow_run: WorkflowRun, input_value: Any,
              outputs: Mapping[str, list[tuple[int, Any]]], max_payload: int) -> list[NewStepRun] | SettledStep:
    parents: dict[str, Any] = {}
    for edge in step.after:
        produced = [value for _, value in sorted(outputs.get(edge.parent, []), key=lambda pair: pair[0])]
        # A fan-out parent hands over the list of its items' outputs (fan-in); another, its one output.
        parents[edge.parent] = produced if spec.step(edge.parent).for_each is not None else next(iter(produced), None)
    base = {"workflow_run_id": workflow_run.workflow_run_id, "step": step.name, "input": input_value,
            "params": step.params, "parents": parents}
    if step.for_each is None:
        return [_new_run(step, 0, base, max_payload)]
    items = _items(step.for_each, input_value, parents)
    if isinstance(items, SettledStep):
        return items
    if not items:
        return SettledStep(state=StepState.SUCCEEDED)
    return [_new_run(step, index, {**base, "item": item, "index": index}, max_payload)
            for index, item in enumerate(items)]


def _items(source: str, input_value: Any, parents: Mapping[str, Any]) -> list[Any] | SettledStep:
    head, _, key = source.partition(".")
    value = input_value if head == "input" else parents.get(head)
    if key:
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, list):
        return SettledStep(state=StepState.FAILED, error=f"for_each {source!r} is not a list")
    if len(value) > MAX_FAN_OUT:
        return SettledStep(state=StepState.FAILED,
                           error=f"for_each {source!r} has {len(value)} items, over the limit of {MAX_FAN_OUT}")
    return value


def _new_run(step: StepSpec, item: int, payload: dict[str, Any], max_payload: int) -> NewStepRun:
    encoded = orjson.dumps(payload)
    if len(encoded) > max_payload:
        # Set aside with its reason: a run that could not be made ends dead, and the rest goes on.
        return NewStepRun(step=step, item=item, payload=b"", state=RunState.DEAD,
                          last_error=f"its input (parents' outputs included) is {len(encoded)} bytes, "
                                     f"over the payload limit of {max_payload}")
    return NewStepRun(step=step, item=item, payload=encoded)


def _json(raw: bytes | None) -> Any:
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def step_views(spec: WorkflowSpec, runs: Sequence[StepRun], settled: Mapping[str, SettledStep]) -> list[StepView]:
    """Each step of a workflow run for people, in the definition's order."""
    states = step_states(spec, runs, settled)
    views = []
    for step in spec.steps:
        its = sorted((run for run in runs if run.step == step.name), key=lambda run: run.item)
        error = settled[step.name].error if step.name in settled else next(
            (run.last_error for run in its if run.last_error and run.state is not RunState.SUCCEEDED), None)
        views.append(StepView(name=step.name, state=states[step.name], run_ids=tuple(run.run_id for run in its),
                              run_states=tuple(run.state for run in its), items=len(its), error=error))
    return views


def settled_document(settled: Mapping[str, SettledStep]) -> str:
    return orjson.dumps({name: {"state": value.state.value, "error": value.error}
                         for name, value in settled.items()}).decode()


def settled_from_document(raw: str | None) -> dict[str, SettledStep]:
    if not raw:
        return {}
    return {name: SettledStep(state=StepState(value["state"]), error=value.get("error"))
            for name, value in orjson.loads(raw).items()}
