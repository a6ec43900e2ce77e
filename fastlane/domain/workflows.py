"""Workflows: versioned DAGs of steps whose runs wait for other runs.

A workflow is a *definition*, a JSON document written by people (the CLI reads it from a file,
the SDK builds it, the API carries it as text), checked in one place, :mod:`fastlane.domain.workflow_definitions`:

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
decided by :func:`fastlane.domain.workflow_runs.plan_advance`, a pure function of the definition and the step runs as stored,
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

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import orjson

from fastlane.domain.models import (
    DEFAULT_TENANT,
    JobSpec,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    RunState,
    Schedule,
)

# The job type of the runs that start workflow runs: a node starts them itself, no worker does.
WORKFLOW_JOB_TYPE = "fastlane.workflow"
# The job that carries a workflow's schedule is named after it, in a namespace of its own.
WORKFLOW_JOB_PREFIX = "workflow:"

MAX_STEPS = 100
MAX_EDGES_PER_STEP = 100
MAX_FAN_OUT = 1_000  # items of one for_each
MAX_OUTPUT_BYTES = 16 << 10  # a handler's result, kept for its children
MAX_DEFINITION_BYTES = 256 << 10
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
    """A workflow definition as checked by :func:`~fastlane.domain.workflow_definitions.parse_definition`."""

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
    outputs: tuple[bytes | None, ...] = ()  # what each run in run_ids returned (JSON), as far as shown


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
