"""The user-facing steps: each change to jobs and runs, and what the node does about it at once.

One place for each step: the gRPC servicers call these (protobuf in, operations out), and
change routing (:mod:`.changes`) calls the same reactions for changes committed through other
nodes, so a rule is never written twice. A step writes through the store first, then tells the
fast lane and the dispatcher; every reaction is idempotent, since a change made through this
node arrives again as a notification.

Each step also records who took it in the audit trail (:mod:`fastlane.domain.audit`), once its
write has succeeded: the caller is :data:`~fastlane.auth.caller.current_caller`, set for the call
by the access interceptor. What the node does by itself (materialising, dispatching, recording
results) goes through none of these steps and is not audited.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import replace
from datetime import datetime
from functools import partial

from fastlane.auth.caller import current_caller
from fastlane.domain.audit import AuditAction, AuditEvent, AuditTarget
from fastlane.domain.errors import JobNotFound
from fastlane.domain.models import Job, JobSpec, Run, RunState
from fastlane.domain.records import BulkOutcome, JobAction, JobFilter, RunAction, RunFilter
from fastlane.domain.workflows import WORKFLOW_JOB_TYPE, Workflow, WorkflowRun, WorkflowSpec
from fastlane.engine import bulk
from fastlane.engine.audit_trail import AuditTrail
from fastlane.engine.backfill import BackfillOutcome, BackfillRequest, backfill_part
from fastlane.engine.bulk import Admit
from fastlane.engine.dispatch.dispatcher import Dispatcher
from fastlane.engine.lane import FastLane
from fastlane.storage import Store
from fastlane.storage.workflows import WorkflowChanges

log = logging.getLogger("fastlane.audit")


class Operations:
    """The steps a user can take, over the store, this node's fast lane and its dispatcher."""

    def __init__(self, store: Store, *, lane: FastLane, dispatcher: Dispatcher) -> None:
        self._store = store
        self._lane = lane
        self._dispatcher = dispatcher
        self._trail = AuditTrail(store)
        self._verbs: dict[RunAction, bulk.Verb] = {RunAction.CANCEL: self._cancels, RunAction.RETRY: self._retries}
        self._job_verbs: dict[JobAction, bulk.JobVerb] = {JobAction.RESUME: self._resumes, JobAction.DELETE: self._deletes}

    # -- jobs -----------------------------------------------------------------------------------

    async def create_job(self, spec: JobSpec) -> tuple[Job, bool]:
        """Create a job (idempotent on its name): ``(job, created)``."""
        job, created = await self._store.jobs.create_job(spec)
        if created:
            self.job_changed(job)
            await self._audit(AuditAction.CREATED, job, detail=job.name)
        return job, created

    async def update_job(self, tenant: str, job_id: str, spec: JobSpec) -> Job:
        job = await self._store.jobs.update_job(tenant, job_id, spec)
        self.job_changed(job)
        await self._audit(AuditAction.UPDATED, job, detail=f"version {job.version}")
        return job

    async def pause_job(self, tenant: str, job_id: str, reason: str | None = None) -> Job:
        job = await self._store.jobs.pause_job(tenant, job_id, reason)
        self.job_changed(job)
        await self._audit(AuditAction.PAUSED, job, detail=reason or "")
        return job

    async def resume_job(self, tenant: str, job_id: str) -> Job:
        job = await self._store.jobs.resume_job(tenant, job_id)
        self.job_changed(job)
        await self._audit(AuditAction.RESUMED, job)
        return job

    async def delete_job(self, tenant: str, job_id: str) -> bool:
        """Delete the job; False when it was deleted before (its history says so), as a repeated
        pause is answered. Raises :class:`JobNotFound` for an id the tenant never had."""
        try:
            await self._store.jobs.delete_job(tenant, job_id)
        except JobNotFound:
            history = await self._store.audit.list_audit(tenant, target_kind=AuditTarget.JOB, target_id=job_id,
                                                         limit=10)
            if any(event.action is AuditAction.DELETED and event.target_id == job_id for event in history):
                return False
            raise
        self.job_deleted(job_id)
        await self._record(AuditEvent(tenant=tenant, action=AuditAction.DELETED, target_kind=AuditTarget.JOB,
                                      target_id=job_id, job_id=job_id))
        return True

    async def act_on_jobs(self, tenant: str, action: JobAction, selection: JobFilter, *, dry_run: bool, limit: int,
                          page_token: str = "", reason: str | None = None) -> BulkOutcome:
        """Pause (with ``reason``), resume or delete every job ``selection`` takes, ``limit`` at
        most in this call (see :mod:`.bulk`); each job is audited as its one-job step audits it."""
        verb = partial(self._pauses, reason=reason) if action is JobAction.PAUSE else self._job_verbs[action]
        return await bulk.act_on_jobs(self._store, tenant, action, selection, verb=verb, dry_run=dry_run, limit=limit,
                                      page_token=page_token)

    # The store answers a pause of a paused job (or a resume of an active one) with the job as it
    # is, and a job the page read as paused is skipped unaudited. One paused by someone else between
    # the page and the verb counts as this call's: the store's answer cannot tell the two apart.
    async def _pauses(self, tenant: str, listed: Job, *, reason: str | None = None) -> bool:
        job = await self._store.jobs.pause_job(tenant, listed.job_id, reason)
        return await self._changed_state(AuditAction.PAUSED, listed, job, detail=reason or "")

    async def _resumes(self, tenant: str, listed: Job) -> bool:
        job = await self._store.jobs.resume_job(tenant, listed.job_id)
        return await self._changed_state(AuditAction.RESUMED, listed, job)

    async def _changed_state(self, action: AuditAction, listed: Job, job: Job, *, detail: str = "") -> bool:
        if job.state is listed.state:
            return False
        self.job_changed(job)
        await self._audit(action, job, detail=detail)
        return True

    async def _deletes(self, tenant: str, listed: Job) -> bool:
        return await self.delete_job(tenant, listed.job_id)  # one deleted meanwhile is skipped

    async def trigger_job(self, tenant: str, job_id: str) -> Run:
        """A run of the job due now, outside its schedule."""
        run = await self._store.runs.create_manual_run(tenant, job_id)
        self.run_scheduled(run)
        # About the run the trigger made, so that the run's history says who made it; the job's
        # history shows it too (it lists its runs' events).
        await self._audit(AuditAction.TRIGGERED, run)
        return run

    async def backfill_job(self, tenant: str, job_id: str, request: BackfillRequest, now: datetime) -> BackfillOutcome:
        """The next part of a backfill of the job (see :mod:`.backfill`); the runs it frees to
        start now go to the lane, and the part is audited on the job."""
        outcome = await backfill_part(self._store, tenant, job_id, request, now)
        for run in outcome.written.scheduled:  # also announced to every node: released as read back
            self.run_scheduled(run, recovered=True)
        if outcome.written.written and not request.dry_run:
            detail = (f"backfill {outcome.backfill_id}: {outcome.written.written} runs, fire times before "
                      f"{outcome.covered_until.isoformat().replace('+00:00', 'Z')}")
            await self._record(AuditEvent(tenant=tenant, action=AuditAction.BACKFILLED, target_kind=AuditTarget.JOB,
                                          target_id=job_id, job_id=job_id, detail=detail))
        return outcome

    # -- runs -----------------------------------------------------------------------------------

    async def cancel_run(self, tenant: str, run_id: str) -> Run:
        """Cancel a run; runs it blocked (its job's concurrency) are released. The run that
        started a workflow run stands for it: cancelling it cancels the workflow run."""
        run, _ = await self._cancel(tenant, run_id)
        return run

    async def _cancel(self, tenant: str, run_id: str) -> tuple[Run, bool]:
        """:meth:`cancel_run`, and whether it changed anything."""
        if (await self._store.runs.get_run(tenant, run_id)).job_type == WORKFLOW_JOB_TYPE:
            await self.cancel_workflow_run(tenant, run_id)
            return await self._store.runs.get_run(tenant, run_id), True
        cancellation = await self._store.runs.cancel_run(tenant, run_id)
        if cancellation.already:
            return cancellation.run, False  # cancelled before: nothing to stop, nothing new for the history
        self.run_cancelled(cancellation.run)
        for run in cancellation.released:
            self.run_scheduled(run)
        stopping = cancellation.run.state is not RunState.CANCELLED
        await self._audit(AuditAction.CANCELLED, cancellation.run, detail="its worker was told to stop" if stopping else "")
        return cancellation.run, True

    async def retry_run(self, tenant: str, run_id: str) -> Run:
        """Replay a dead or lost run as a new attempt now (the run that started a failed
        workflow run: resume the workflow run)."""
        if (await self._store.runs.get_run(tenant, run_id)).job_type == WORKFLOW_JOB_TYPE:
            await self.resume_workflow_run(tenant, run_id)
            return await self._store.runs.get_run(tenant, run_id)
        run = await self._store.runs.retry_run(tenant, run_id)
        self.run_scheduled(run)
        await self._audit(AuditAction.RETRIED, run, detail=f"attempt {run.attempts + 1}")
        return run

    async def act_on_runs(self, tenant: str, action: RunAction, selection: RunFilter, *, dry_run: bool, limit: int,
                          page_token: str = "", admit: Admit | None = None) -> BulkOutcome:
        """Cancel or retry every run ``selection`` takes, ``limit`` at most in this call (see
        :mod:`.bulk`); each run is audited as its one-run step audits it."""
        return await bulk.act_on_runs(self._store, tenant, action, selection, verb=self._verbs[action],
                                      dry_run=dry_run, limit=limit, page_token=page_token, admit=admit)

    async def _cancels(self, tenant: str, run_id: str) -> bool:
        return (await self._cancel(tenant, run_id))[1]

    async def _retries(self, tenant: str, run_id: str) -> bool:
        await self.retry_run(tenant, run_id)  # a run that may not be replayed raises InvalidState
        return True

    # -- workflows ------------------------------------------------------------------------------

    async def create_workflow(self, spec: WorkflowSpec) -> tuple[Workflow, bool]:
        """Store a workflow's next version (idempotent on its definition) and follow its schedule."""
        workflow, created = await self._store.workflows.create_workflow(spec)
        try:
            self.job_changed(await self._store.jobs.get_job(workflow.tenant, workflow.job_id))
        except JobNotFound:
            self.job_deleted(workflow.job_id)  # no schedule (any more)
        if created:
            await self._record(AuditEvent(tenant=workflow.tenant, action=AuditAction.CREATED,
                                          target_kind=AuditTarget.JOB, target_id=workflow.job_id,
                                          job_id=workflow.job_id,
                                          detail=f"workflow {workflow.name} version {workflow.version}"))
        return workflow, created

    async def trigger_workflow(self, tenant: str, name: str, input_json: bytes) -> WorkflowRun:
        run, changes = await self._store.workflows.trigger_workflow(tenant, name, input_json)
        self.workflow_changes(changes)
        await self._audit_workflow_run(AuditAction.TRIGGERED, run)
        return run

    async def cancel_workflow_run(self, tenant: str, workflow_run_id: str) -> WorkflowRun:
        run, changes = await self._store.workflows.cancel_workflow_run(tenant, workflow_run_id)
        self.workflow_changes(changes)
        await self._audit_workflow_run(AuditAction.CANCELLED, run)
        return run

    async def resume_workflow_run(self, tenant: str, workflow_run_id: str) -> WorkflowRun:
        run, changes = await self._store.workflows.resume_workflow_run(tenant, workflow_run_id)
        self.workflow_changes(changes)
        await self._audit_workflow_run(AuditAction.RETRIED, run)
        return run

    def workflow_changes(self, changes: WorkflowChanges, *, released_here: Collection[int] = ()) -> None:
        """Release the runs a workflow write scheduled; stop those it cancelled.

        Runs of ``released_here`` shards go the fast way, as this node's own writes: the write
        told no node of them, so no other release of them is on its way. The others were
        announced to every node (NOTIFY), and this node's change follower may release the same
        run at the same moment: those are released as read back (their dispatch confirmed
        before they are sent), so the database, not memory, decides which release sends it."""
        for run in changes.scheduled:
            self.run_scheduled(run, recovered=run.shard_id not in released_here)
        for run in changes.cancelled:
            self.run_cancelled(run)
        for run in changes.cancel_requested:
            self.run_cancel_requested(run)

    async def _audit_workflow_run(self, action: AuditAction, run: WorkflowRun) -> None:
        # A workflow run's id is that of the run that started it: its history is that run's.
        await self._record(AuditEvent(tenant=run.tenant, action=action, target_kind=AuditTarget.RUN,
                                      target_id=run.workflow_run_id, job_id=run.job_id,
                                      detail=f"workflow run of {run.workflow_name} version {run.version}"))

    # -- the audit trail ------------------------------------------------------------------------

    async def _audit(self, action: AuditAction, target: Job | Run, *, detail: str = "") -> None:
        """Record that the current caller did ``action`` to ``target``."""
        if isinstance(target, Job):
            kind, target_id, job_id = AuditTarget.JOB, target.job_id, target.job_id
        else:
            kind, target_id, job_id = AuditTarget.RUN, target.run_id, target.job_id
        await self._record(AuditEvent(tenant=target.tenant, action=action, target_kind=kind, target_id=target_id,
                                      job_id=job_id, detail=detail))

    async def _record(self, event: AuditEvent) -> None:
        """Record ``event`` as the current caller's; a call cancelled now has made its change,
        and the trail still says so (see :class:`~fastlane.engine.audit_trail.AuditTrail`)."""
        caller = current_caller.get()
        await self._trail.record(replace(event, token_id=caller.token_id, actor=caller.name))

    # -- reactions to a committed change (through this node or another) ------------------------

    def job_changed(self, job: Job) -> None:
        """A job was created or changed: the window takes it as it is now."""
        self._lane.job_changed(job)

    def job_deleted(self, job_id: str) -> None:
        """A job was deleted: drop it, and its runs waiting for their time or for a worker."""
        self._lane.forget_job(job_id)
        self._dispatcher.forget_job(job_id)

    def job_gone(self, job_id: str) -> None:
        """A job changed elsewhere is no longer found: drop it and its runs from the window."""
        self._lane.forget_job(job_id)

    def run_scheduled(self, run: Run, *, recovered: bool = False) -> None:
        """Release ``run`` at its time. ``recovered``: it was read back from the database rather
        than written by this node, so its dispatch is confirmed before it is sent."""
        self._lane.schedule_run(run, recovered=recovered)

    def run_cancelled(self, run: Run) -> None:
        """A run was cancelled: drop it from the window and stop it wherever it is queued or sent."""
        self._lane.forget_run(run.run_id)
        self._dispatcher.cancel([run])

    def run_cancel_requested(self, run: Run) -> None:
        """A run with a worker is to stop: tell the worker."""
        self._dispatcher.cancel([run])
