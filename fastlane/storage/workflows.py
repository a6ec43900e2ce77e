"""Workflows in the store: one implementation for both backends.

What a workflow run does next is decided by :mod:`fastlane.domain.workflows` from the rows as they
are; this module reads those rows and writes the decision, each time in one transaction holding
the workflow run's row (PostgreSQL: ``FOR UPDATE``; SQLite: the one writer), so two nodes that
advance the same workflow run at once take turns, and the second finds nothing left to do. Step
runs are inserted with ``ON CONFLICT DO NOTHING`` against ``UNIQUE (workflow_run_id, step,
item)`` as well: a step is made at most once even if that reasoning were wrong.

The SQL is written once, in PostgreSQL's dialect with three placeholders each backend fills in
(:class:`WorkflowTx`): ``{NOW}`` (the database clock), ``{LOCK}`` (``FOR UPDATE`` or nothing) and
``{IN}`` (membership in a list parameter). Workflows are not on the fire path: step runs are
written a statement per run, which keeps the SQL portable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from fastlane.domain import lifecycle
from fastlane.domain import workflow_definitions as definitions
from fastlane.domain import workflow_runs as decide
from fastlane.domain import workflows as wf
from fastlane.domain.errors import InvalidState, JobNotFound, NotFound
from fastlane.domain.limits import DEFAULT_MAX_PAYLOAD_BYTES
from fastlane.domain.models import Job, JobSpec, RetryPolicy, Run, RunState, new_id, shard_of
from fastlane.domain.records import Page
from fastlane.domain.workflows import StepRun, Workflow, WorkflowRun, WorkflowRunState, WorkflowSpec
from fastlane.runtime.clock import from_micros, to_micros
from fastlane.storage import codec, common
from fastlane.storage import workflow_sql as sql

ADVANCE_BATCH = 50  # workflow runs started or advanced in one transaction
MAX_CACHED_VERSIONS = 1_000  # parsed workflow versions kept in memory (they never change)
_VERSIONS: dict[str, Workflow] = {}
TRIGGER_END = {WorkflowRunState.SUCCEEDED: "succeeded", WorkflowRunState.FAILED: "dead",
               WorkflowRunState.CANCELLED: "cancelled"}


class WorkflowNotFound(NotFound):
    def __init__(self, key: str) -> None:
        super().__init__("workflow", key)


class WorkflowRunNotFound(NotFound):
    def __init__(self, key: str) -> None:
        super().__init__("workflow run", key)


@dataclass(slots=True)
class WorkflowChanges:
    """What a workflow write did to runs, for the engine to act on: ``scheduled`` runs to release
    at their time (new or resumed steps, runs of the job leaving its overlap buffer), runs
    ``cancelled`` before delivery, and runs whose worker must be told to stop."""

    scheduled: list[Run] = field(default_factory=list)
    cancelled: list[Run] = field(default_factory=list)
    cancel_requested: list[Run] = field(default_factory=list)

    def add(self, other: WorkflowChanges) -> None:
        self.scheduled += other.scheduled
        self.cancelled += other.cancelled
        self.cancel_requested += other.cancel_requested


@dataclass(frozen=True, slots=True)
class WorkflowRunDetail:
    run: WorkflowRun
    workflow: Workflow
    steps: list[StepRun]


class WorkflowTx(Protocol):
    """One transaction of a backend, as this module needs it."""

    async def fetch(self, sql: str, *params: Any) -> list[Any]: ...

    async def fetchrow(self, sql: str, *params: Any) -> Any | None: ...

    async def execute(self, sql: str, *params: Any) -> None: ...

    async def release_buffered(self, job_ids: Collection[str]) -> list[Run]:
        """Runs of these jobs leaving the overlap buffer (the backend's own statement)."""
        ...

    async def notify(self, runs: Sequence[Run]) -> None:
        """Tell the owners of these runs' shards (PostgreSQL: NOTIFY at commit; SQLite: one node),
        except of runs the caller releases itself (``released_here``)."""
        ...


# -- the store's methods ---------------------------------------------------------------------------


class WorkflowJobs(Protocol):
    """The job calls that keep a workflow's schedule job in step (the store's job part)."""

    async def get_job(self, tenant: str, job_id: str) -> Job: ...

    async def create_job(self, spec: JobSpec, *, job_id: str | None = None) -> tuple[Job, bool]: ...

    async def update_job(self, tenant: str, job_id: str, spec: JobSpec) -> Job: ...

    async def delete_job(self, tenant: str, job_id: str) -> None: ...


class WorkflowTransactions(Protocol):
    """Opens the backend's transactions as this module speaks to them."""

    def __call__(self, *, write: bool = True,
                 released_here: Collection[int] = ()) -> contextlib.AbstractAsyncContextManager[WorkflowTx]:
        """A transaction; ``released_here``: shards whose newly scheduled runs the caller releases
        itself once it commits, so no other node is told of them (and no echo comes back)."""
        ...


class SQLWorkflows:
    """The workflow part of a store, over the backend's transactions; a workflow's schedule is a
    job, kept in step through the store's job part."""

    def __init__(self, transactions: WorkflowTransactions, jobs: WorkflowJobs, shard_count: Callable[[], Awaitable[int]],
                 *, max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES) -> None:
        self._workflow_tx = transactions
        self._jobs = jobs
        self._count_shards = shard_count
        self.max_payload = max_payload

    # -- definitions ---------------------------------------------------------------------------------

    async def create_workflow(self, spec: WorkflowSpec) -> tuple[Workflow, bool]:
        """Store ``spec`` as the workflow's next version, or return the latest one unchanged if it
        is the same definition (``(workflow, False)``); then bring its schedule's job in line."""
        definition = definitions.definition_document(spec)
        async with self._workflow_tx() as tx:
            latest = await tx.fetchrow(sql.LATEST_WORKFLOW, spec.tenant, spec.name)
            if latest is not None and latest["definition"] == definition:
                workflow, created = _workflow(latest), False
            else:
                row = await tx.fetchrow(
                    sql.INSERT_WORKFLOW, new_id(), spec.tenant, spec.name, 1 if latest is None else latest["version"] + 1,
                    new_id() if latest is None else latest["job_id"], definition,
                )
                workflow, created = _workflow(row), True
        # Its own transactions, after the definition's: a crash between them leaves the schedule as
        # it was, and creating the same definition again finishes the work (it is idempotent).
        await self._follow_schedule(workflow)
        return workflow, created

    async def _follow_schedule(self, workflow: Workflow) -> None:
        job_spec = workflow.spec.schedule_job()
        try:
            job = await self._jobs.get_job(workflow.tenant, workflow.job_id)
        except JobNotFound:
            job = None
        if job_spec is None:
            if job is not None:
                await self._jobs.delete_job(workflow.tenant, workflow.job_id)
        elif job is None:
            await self._jobs.create_job(job_spec, job_id=workflow.job_id)
        elif lifecycle.first_difference(job.spec, job_spec) is not None:
            await self._jobs.update_job(workflow.tenant, workflow.job_id, job_spec)

    async def get_workflow(self, tenant: str, name: str, version: int | None = None) -> Workflow:
        async with self._workflow_tx(write=False) as tx:
            row = await (tx.fetchrow(sql.LATEST_WORKFLOW, tenant, name) if version is None
                         else tx.fetchrow(sql.WORKFLOW_VERSION, tenant, name, version))
        if row is None:
            raise WorkflowNotFound(name if version is None else f"{name} version {version}")
        return _workflow(row)

    async def list_workflows(self, tenant: str, *, limit: int = 100, page_token: str = "") -> Page[Workflow]:
        """The latest version of each of the tenant's workflows, by name."""
        after = codec.decode_page_token(page_token, str)[0] if page_token else ""
        async with self._workflow_tx(write=False) as tx:
            rows = await tx.fetch(sql.LIST_WORKFLOWS, tenant, after, common.page_limit(limit) + 1)
        return common.page_of([_workflow(row) for row in rows], limit, lambda workflow: (workflow.name,))

    # -- starting ------------------------------------------------------------------------------------

    async def trigger_workflow(self, tenant: str, name: str, input_json: bytes) -> tuple[WorkflowRun, WorkflowChanges]:
        """Start a run of the latest version now with this input (JSON)."""
        definitions.parse_input(input_json, self.max_payload)
        async with self._workflow_tx() as tx:
            row = await tx.fetchrow(sql.LATEST_WORKFLOW, tenant, name)
            if row is None:
                raise WorkflowNotFound(name)
            workflow = _workflow(row)
            shard_id = await self._shard_of(workflow.job_id)
            row = await tx.fetchrow(
                sql.INSERT_TRIGGER, new_id(), workflow.job_id, tenant, wf.WORKFLOW_JOB_TYPE, shard_id, input_json or b"null",
                _retry_json(RetryPolicy(max_attempts=1)),
            )
            assert row is not None, "an INSERT without a conflict clause returns its row"
            trigger = codec.build_run(row)
            changes = WorkflowChanges()
            started = await _start(tx, trigger, workflow, changes, self.max_payload)
        return started, changes

    async def start_workflow_runs(self, triggers: Sequence[Run], *, released_here: Collection[int] = ()) -> WorkflowChanges:
        """Start the workflow runs these runs of workflow jobs stand for (released by the lane on
        their time). A run no longer ``scheduled`` was started already, or cancelled: skipped.
        ``released_here``: see :meth:`_workflow_tx`."""
        changes = WorkflowChanges()
        ordered = sorted(triggers, key=lambda run: run.run_id)
        for start in range(0, len(ordered), ADVANCE_BATCH):
            async with self._workflow_tx(released_here=released_here) as tx:
                for trigger in ordered[start:start + ADVANCE_BATCH]:
                    row = await tx.fetchrow(sql.START_TRIGGER, trigger.run_id)
                    if row is None:
                        continue
                    started = codec.build_run(row)
                    latest = await tx.fetchrow(sql.LATEST_OF_JOB, started.job_id)
                    if latest is None:  # its workflow is gone: the run ends with the reason
                        await tx.fetchrow(sql.END_TRIGGER, started.run_id, "dead", "no workflow has this job")
                        continue
                    await _start(tx, started, _workflow(latest), changes, self.max_payload)
        return changes

    async def _shard_of(self, job_id: str) -> int:
        return shard_of(job_id, await self._count_shards())

    # -- advancing -----------------------------------------------------------------------------------

    async def advance_workflow_runs(self, workflow_run_ids: Collection[str], *,
                                    released_here: Collection[int] = ()) -> WorkflowChanges:
        """Make the steps that became ready, and end the workflow runs that are done: up to
        :data:`ADVANCE_BATCH` workflow runs a transaction (each locked in id order, so two
        nodes advancing overlapping batches cannot deadlock). ``released_here``: see
        :meth:`_workflow_tx`."""
        changes = WorkflowChanges()
        ordered = sorted(set(workflow_run_ids))
        for start in range(0, len(ordered), ADVANCE_BATCH):
            async with self._workflow_tx(released_here=released_here) as tx:
                for workflow_run_id in ordered[start:start + ADVANCE_BATCH]:
                    row = await tx.fetchrow(sql.LOCK_WORKFLOW_RUN, workflow_run_id)
                    if row is None:
                        continue
                    run = _workflow_run(row)
                    if run.state is WorkflowRunState.RUNNING:
                        workflow = await _workflow_by_id(tx, run.workflow_id)
                        await _advance(tx, run, workflow, changes, self.max_payload)
        return changes

    async def workflow_runs_to_advance(self, shard_ids: Collection[int], limit: int = 1_000) -> list[str]:
        """Running workflow runs of these shards with step runs that ended since they were last
        advanced (a node that recorded a result and died before advancing leaves these)."""
        if not shard_ids:
            return []
        async with self._workflow_tx(write=False) as tx:
            rows = await tx.fetch(sql.TO_ADVANCE, list(shard_ids), limit)
        return [row["workflow_run_id"] for row in rows]

    # -- operations ----------------------------------------------------------------------------------

    async def cancel_workflow_run(self, tenant: str, workflow_run_id: str) -> tuple[WorkflowRun, WorkflowChanges]:
        """Cancel a running workflow run: its queued steps end cancelled, running ones are told
        to stop, the rest are never made. Cancelling an ended one changes nothing."""
        changes = WorkflowChanges()
        async with self._workflow_tx() as tx:
            run, workflow = await _locked(tx, tenant, workflow_run_id)
            if run.state is WorkflowRunState.RUNNING:
                steps = await _step_runs(tx, run.workflow_run_id)
                await _apply(tx, run, decide.plan_cancel(workflow.spec, steps, run.settled), steps, changes)
            return await _reread(tx, run.workflow_run_id), changes

    async def resume_workflow_run(self, tenant: str, workflow_run_id: str) -> tuple[WorkflowRun, WorkflowChanges]:
        """Run a failed or cancelled workflow run on from where it stopped: its failed and
        cancelled steps run again (their runs, as new attempts), succeeded ones do not."""
        changes = WorkflowChanges()
        async with self._workflow_tx() as tx:
            run, workflow = await _locked(tx, tenant, workflow_run_id)
            if run.state not in (WorkflowRunState.FAILED, WorkflowRunState.CANCELLED):
                raise InvalidState("workflow run", workflow_run_id, run.state.value,
                                   "resume (only failed or cancelled workflow runs can be resumed)")
            steps = await _step_runs(tx, run.workflow_run_id)
            again, kept = decide.resume_targets(workflow.spec, steps, run.settled)
            for run_id in again:
                if (row := await tx.fetchrow(sql.RESCHEDULE, run_id)) is not None:
                    changes.scheduled.append(codec.build_run(row))
            await tx.notify(changes.scheduled)
            await tx.fetchrow(sql.REOPEN_TRIGGER, run.workflow_run_id)
            await tx.execute(sql.UPDATE_WORKFLOW_RUN, run.workflow_run_id, "running", decide.settled_document(kept), 0, None)
            await _advance(tx, await _reread(tx, run.workflow_run_id), workflow, changes, self.max_payload)
            return await _reread(tx, run.workflow_run_id), changes

    async def get_workflow_run(self, tenant: str, workflow_run_id: str) -> WorkflowRunDetail:
        async with self._workflow_tx(write=False) as tx:
            row = await tx.fetchrow(sql.GET_WORKFLOW_RUN, workflow_run_id, tenant)
            if row is None:
                raise WorkflowRunNotFound(workflow_run_id)
            run = _workflow_run(row)
            workflow = await _workflow_by_id(tx, run.workflow_id)
            return WorkflowRunDetail(run=run, workflow=workflow, steps=await _step_runs(tx, workflow_run_id))

    async def workflow_runs_by_id_prefix(self, tenant: str, prefix: str, limit: int) -> list[WorkflowRun]:
        """Up to ``limit`` of the tenant's workflow runs whose id starts with ``prefix``, in id order."""
        low, high = common.id_prefix_range(prefix)
        async with self._workflow_tx(write=False) as tx:
            rows = await tx.fetch(sql.WORKFLOW_RUNS_BY_ID_RANGE, low, high, tenant, common.page_limit(limit))
        return common.with_id_prefix([_workflow_run(row) for row in rows], prefix, lambda run: run.workflow_run_id).items

    async def list_workflow_runs(self, tenant: str, name: str, *, limit: int = 100,
                                 page_token: str = "") -> Page[WorkflowRun]:
        """The runs of a workflow (every version), newest first."""
        before_id, before_time = None, None
        if page_token:
            micros, before_id = codec.decode_page_token(page_token, int, str)
            before_time = from_micros(micros)
        async with self._workflow_tx(write=False) as tx:
            latest = await tx.fetchrow(sql.LATEST_WORKFLOW, tenant, name)
            if latest is None:
                raise WorkflowNotFound(name)
            rows = await tx.fetch(sql.LIST_WORKFLOW_RUNS, tenant, latest["job_id"], before_id, before_time,
                                  common.page_limit(limit) + 1)
        return common.page_of([_workflow_run(row) for row in rows], limit,
                              lambda run: (to_micros(run.created_at), run.workflow_run_id))


# -- inside one transaction -------------------------------------------------------------------------


async def _start(tx: WorkflowTx, trigger: Run, workflow: Workflow, changes: WorkflowChanges,
                 max_payload: int) -> WorkflowRun:
    row = await tx.fetchrow(sql.INSERT_WORKFLOW_RUN, trigger.run_id, trigger.tenant, workflow.workflow_id,
                            trigger.job_id, trigger.shard_id, trigger.payload or b"null")
    if row is None:  # started before (a resent trigger): nothing more to do
        return await _reread(tx, trigger.run_id)
    run = await _reread(tx, trigger.run_id)
    await _advance(tx, run, workflow, changes, max_payload)
    return await _reread(tx, trigger.run_id)


async def _advance(tx: WorkflowTx, run: WorkflowRun, workflow: Workflow, changes: WorkflowChanges,
                   max_payload: int) -> None:
    while True:
        steps = await _step_runs(tx, run.workflow_run_id)
        plan = decide.plan_advance(workflow.spec, run, steps, max_payload=max_payload)
        await _apply(tx, run, plan, steps, changes)
        if all(new.state is RunState.SCHEDULED for new in plan.create):
            return
        # A step made dead at once (its input too large) is decided on in the same transaction.
        run = await _reread(tx, run.workflow_run_id)


async def _apply(tx: WorkflowTx, run: WorkflowRun, plan: wf.AdvancePlan, steps: list[StepRun],
                 changes: WorkflowChanges) -> None:
    """Write a plan: new step runs, cancellations, settled steps, and the end of the run."""
    mine = WorkflowChanges()
    for new in plan.create:
        row = await tx.fetchrow(
            sql.INSERT_STEP_RUN, new_id(), run.job_id, run.tenant, new.step.job_type, run.shard_id, new.state.value,
            new.payload, new.step.priority, int(new.step.lease_ttl.total_seconds() * 1000),
            None if new.step.timeout is None else int(new.step.timeout.total_seconds() * 1000),
            _retry_json(new.step.retry), new.last_error, run.workflow_run_id, new.step.name, new.item,
        )
        if row is not None and row["state"] == "scheduled":
            mine.scheduled.append(codec.build_run(row))
    for run_id in plan.cancel:
        reason = f"cancelled: {plan.error or 'the workflow run ended'}"[:4_000]
        if (row := await tx.fetchrow(sql.CANCEL_QUEUED, run_id, reason)) is not None:
            mine.cancelled.append(codec.build_run(row))
        elif (row := await tx.fetchrow(sql.REQUEST_CANCEL, run_id)) is not None:
            mine.cancel_requested.append(codec.build_run(row))
    state = plan.end or run.state
    await tx.execute(sql.UPDATE_WORKFLOW_RUN, run.workflow_run_id, state.value,
                     decide.settled_document({**run.settled, **plan.settle}),
                     sum(1 for step in steps if step.state.is_final), plan.error if plan.end else run.error)
    if plan.end is not None:
        await tx.fetchrow(sql.END_TRIGGER, run.workflow_run_id, TRIGGER_END[plan.end], plan.error)
        mine.scheduled += await tx.release_buffered([run.job_id])
    await tx.notify(mine.scheduled + mine.cancelled + mine.cancel_requested)
    changes.add(mine)


def _retry_json(retry: RetryPolicy) -> str:
    return orjson.dumps(codec.retry_to_dict(retry)).decode()


async def _step_runs(tx: WorkflowTx, workflow_run_id: str) -> list[StepRun]:
    return [StepRun(step=row["step"], item=row["item"], run_id=row["run_id"], state=RunState(row["state"]),
                    output=None if row["output"] is None else bytes(row["output"]), last_error=row["last_error"])
            for row in await tx.fetch(sql.STEP_RUNS, workflow_run_id)]


async def _locked(tx: WorkflowTx, tenant: str, workflow_run_id: str) -> tuple[WorkflowRun, Workflow]:
    row = await tx.fetchrow(sql.LOCK_WORKFLOW_RUN, workflow_run_id)
    if row is None or row["tenant"] != tenant:
        raise WorkflowRunNotFound(workflow_run_id)
    run = _workflow_run(row)
    return run, await _workflow_by_id(tx, run.workflow_id)


async def _reread(tx: WorkflowTx, workflow_run_id: str) -> WorkflowRun:
    row = await tx.fetchrow(sql.LOCK_WORKFLOW_RUN, workflow_run_id)
    assert row is not None, "read in the transaction that holds it"
    return _workflow_run(row)


async def _workflow_by_id(tx: WorkflowTx, workflow_id: str) -> Workflow:
    """A stored version of a workflow, read and parsed once per process: versions never change."""
    if (known := _VERSIONS.get(workflow_id)) is not None:
        return known
    return _workflow(await tx.fetchrow(sql.WORKFLOW_BY_ID, workflow_id))


def _workflow(row: Any) -> Workflow:
    if (known := _VERSIONS.get(row["workflow_id"])) is not None:
        return known
    if len(_VERSIONS) >= MAX_CACHED_VERSIONS:
        _VERSIONS.pop(next(iter(_VERSIONS)))  # the oldest parsed: a rare reader pays a parse
    spec = definitions.parse_definition(row["definition"], tenant=row["tenant"], max_payload=1 << 62)
    _VERSIONS[row["workflow_id"]] = workflow = Workflow(
        workflow_id=row["workflow_id"], job_id=row["job_id"], version=row["version"], spec=spec,
        definition=row["definition"], created_at=row["created_at"])
    return workflow


def _workflow_run(row: Any) -> WorkflowRun:
    return WorkflowRun(
        workflow_run_id=row["workflow_run_id"], tenant=row["tenant"], workflow_id=row["workflow_id"],
        workflow_name=row["workflow_name"], version=row["version"], job_id=row["job_id"], shard_id=row["shard_id"],
        state=WorkflowRunState(row["state"]), input=bytes(row["input"]), created_at=row["created_at"],
        updated_at=row["updated_at"], finished_at=row["finished_at"], error=row["error"],
        settled=decide.settled_from_document(row["settled"]),
    )

