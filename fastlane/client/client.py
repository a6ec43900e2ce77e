"""The async client SDK: define jobs and read their history from a fastlane daemon.

Example::

    async with Client("127.0.0.1:7070", tenant="acme") as client:
        job = await client.create("nightly-report", "report.build", Schedule.cron_expr("0 3 * * *", "Europe/Paris"))
        async for job in client.iter_jobs(state="active"):
            print(job.name, job.next_fire_at)

Every method returns domain models (:mod:`fastlane.domain.models`); a failed call raises the
:class:`~fastlane.errors.RemoteError` subclass matching its gRPC status code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, Unpack

import orjson

from fastlane._proto import admin_pb2, jobs_pb2, runs_pb2, workflows_pb2
from fastlane.auth.tls import ClientTls
from fastlane.client.bulk_calls import BackfillProgress, backfill_progress, backfill_request, call_after_call
from fastlane.client.connection import Connection
from fastlane.client.convert import (
    audit_event_from_pb,
    bulk_outcome_from_pb,
    cluster_from_pb,
    job_selection_pb,
    run_selection_pb,
    step_views_from_pb,
    workflow_from_pb,
    workflow_run_from_pb,
)
from fastlane.client.options import POLICY_FIELDS, JobOptions
from fastlane.client.payloads import encode_payload
from fastlane.domain.access import ApiToken, Role
from fastlane.domain.audit import DEFAULT_AUDIT_LIMIT, AuditEvent, AuditTarget
from fastlane.domain.backfill import BackfillMode
from fastlane.domain.cluster import ClusterStatus
from fastlane.domain.models import (
    Attempt,
    Job,
    JobSpec,
    JobState,
    OverlapPolicy,
    Run,
    RunState,
    Schedule,
)
from fastlane.domain.quotas import TenantQuota
from fastlane.domain.records import BulkOutcome, JobAction, JobFilter, Page, RunAction, RunFilter
from fastlane.domain.workflows import StepView, Workflow, WorkflowRun
from fastlane.rpc import wire
from fastlane.rpc.channel import DEFAULT_SERVER
from fastlane.rpc.enums import AUDIT_TARGET, JOB_ACTION, JOB_STATE, ROLE, RUN_ACTION, RUN_STATE


class Client:
    """A connection to one fastlane daemon, scoped to one tenant.

    Use it as an async context manager, or call :meth:`close` when done. The channel is opened
    on first use and shared by every call.

    Args:
        server: ``HOST:PORT`` of a daemon.
        tenant: Every request is made for this tenant; it replaces the tenant of specs passed in.
            Empty (the default): the tenant of the token, or ``default`` on a node without
            authentication. Naming another tenant than the token's needs an admin token.
        timeout: Deadline of each call, in seconds.
        token: The API token sent with every call (``fastlane tokens create``); None: the
            ``FASTLANE_TOKEN`` environment variable, if set.
        tls: Connect over TLS (with a client certificate for mutual TLS); None: plain TCP.
    """

    def __init__(
        self,
        server: str = DEFAULT_SERVER,
        *,
        tenant: str = "",
        timeout: float = 10.0,
        token: str | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        self.server = server
        self.tenant = tenant
        self.timeout = timeout
        self._connection = Connection(server, timeout=timeout, token=token, tls=tls)

    async def __aenter__(self) -> Client:
        self._connection.stubs  # noqa: B018 - opens the channel
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel. Safe to call twice, or without having made a call."""
        await self._connection.close()

    # -- jobs -----------------------------------------------------------------------------------

    async def create_job(self, spec: JobSpec) -> tuple[Job, bool]:
        """Create a job, idempotent on ``(tenant, name)``.

        Returns:
            The job, and True if it was created or False if an identical one already existed.

        Raises:
            RemoteAlreadyExists: A job of that name exists with a different spec.
            RemoteInvalidArgument: The spec is not valid; the message names the field.
        """
        request = jobs_pb2.CreateJobRequest(spec=wire.spec_to_pb(self._own(spec)))
        response = await self._connection.call(self._connection.stubs.jobs.CreateJob, request)
        return wire.job_from_pb(response.job), response.created

    async def create(
        self, name: str, job_type: str, schedule: Schedule, *, payload: Any = None, **policies: Unpack[JobOptions]
    ) -> Job:
        """Create a job from its parts; see :meth:`create_job`.

        Args:
            name: Unique within the tenant.
            job_type: Routes runs to workers that declared this type.
            schedule: When the job fires.
            payload: Bytes are sent as they are; any other value is encoded as JSON; None sends
                no payload.
            **policies: Other :class:`~fastlane.domain.models.JobSpec` fields: ``priority``,
                ``concurrency_key``, ``concurrency_limit``, ``retry``, ``misfire``, ``overlap``, ``delivery``,
                ``timeout``, ``lease_ttl``.
        """
        unknown = set(policies) - POLICY_FIELDS
        if unknown:
            raise TypeError(f"unknown job option(s) {sorted(unknown)}; expected some of {sorted(POLICY_FIELDS)}")
        spec = JobSpec(
            tenant=self.tenant,
            name=name,
            job_type=job_type,
            schedule=schedule,
            payload=encode_payload(payload),
            **policies,
        )
        job, _ = await self.create_job(spec)
        return job

    async def get_job(self, job_id: str) -> Job:
        """The job with this id. Raises RemoteNotFound if there is none in the tenant."""
        request = jobs_pb2.GetJobRequest(tenant=self.tenant, job_id=job_id)
        return wire.job_from_pb((await self._connection.call(self._connection.stubs.jobs.GetJob, request)).job)

    async def list_jobs(
        self,
        *,
        state: JobState | str | None = None,
        job_type: str | None = None,
        page_size: int = 100,
        page_token: str = "",
        include_payload: bool = False,
        name: str | None = None,
        id_prefix: str | None = None,
        name_prefix: str | None = None,
    ) -> Page[Job]:
        """One page of the tenant's jobs; pass ``next_page_token`` back for the next one.

        Jobs come without their payload unless ``include_payload`` (``get_job`` always has it).
        ``name`` finds the job of that name (a page of one, or empty); ``id_prefix`` the jobs
        whose id starts with it, in id order, and ``name_prefix`` those whose name does, in name
        order (one page only, either).
        """
        request = jobs_pb2.ListJobsRequest(
            tenant=self.tenant,
            state=JOB_STATE.filter(state, "state"),
            job_type=job_type or "",
            page_size=page_size,
            page_token=page_token,
            include_payload=include_payload,
            name=name or "",
            id_prefix=id_prefix or "",
            name_prefix=name_prefix or "",
        )
        response = await self._connection.call(self._connection.stubs.jobs.ListJobs, request)
        return Page(items=[wire.job_from_pb(job) for job in response.jobs], next_page_token=response.next_page_token)

    async def iter_jobs(
        self, *, state: JobState | str | None = None, job_type: str | None = None, page_size: int = 100,
        include_payload: bool = False,
    ) -> AsyncIterator[Job]:
        """Every job of the tenant matching the filters, fetching pages as needed."""
        page_token = ""
        while True:
            page = await self.list_jobs(state=state, job_type=job_type, page_size=page_size, page_token=page_token,
                                        include_payload=include_payload)
            for job in page.items:
                yield job
            if not page.next_page_token:
                return
            page_token = page.next_page_token

    async def update_job(self, job_id: str, spec: JobSpec) -> Job:
        """Replace a job's whole spec; its tenant and name cannot change."""
        request = jobs_pb2.UpdateJobRequest(job_id=job_id, spec=wire.spec_to_pb(self._own(spec)))
        return wire.job_from_pb((await self._connection.call(self._connection.stubs.jobs.UpdateJob, request)).job)

    async def pause_job(self, job_id: str, reason: str = "") -> Job:
        """Stop a job firing until it is resumed; ``reason`` (at most 200 characters) stays with
        it until then, and in its history."""
        request = jobs_pb2.PauseJobRequest(tenant=self.tenant, job_id=job_id, reason=reason)
        return wire.job_from_pb((await self._connection.call(self._connection.stubs.jobs.PauseJob, request)).job)

    async def resume_job(self, job_id: str) -> Job:
        """Resume a paused job; occurrences missed meanwhile follow its misfire policy."""
        request = jobs_pb2.ResumeJobRequest(tenant=self.tenant, job_id=job_id)
        return wire.job_from_pb((await self._connection.call(self._connection.stubs.jobs.ResumeJob, request)).job)

    async def delete_job(self, job_id: str) -> bool:
        """Delete a job. Its runs stay in history; queued ones are cancelled. False when it was
        deleted before (nothing changed); an id the tenant never had raises RemoteNotFound."""
        answer = await self._connection.call(self._connection.stubs.jobs.DeleteJob,
                                             jobs_pb2.DeleteJobRequest(tenant=self.tenant, job_id=job_id))
        return not answer.already_deleted

    async def act_on_jobs(self, action: JobAction | str, selection: JobFilter = JobFilter(), *, dry_run: bool = False,
                          limit: int = 0, page_token: str = "", reason: str = "") -> BulkOutcome:
        """Pause (with ``reason``), resume or delete (``action``) the jobs ``selection`` takes, ``limit``
        at most (0: the node's default, 1,000); with ``dry_run``, how many it would take. One call:
        go on with the outcome's ``next_page_token``, or use :meth:`act_on_all_jobs`."""
        request = jobs_pb2.ActOnJobsRequest(
            tenant=self.tenant, action=JOB_ACTION.named(action, "action"), dry_run=dry_run, limit=limit,
            page_token=page_token, selection=job_selection_pb(selection), reason=reason)
        return bulk_outcome_from_pb(await self._connection.call(self._connection.stubs.jobs.ActOnJobs, request))

    def act_on_all_jobs(self, action: JobAction | str, selection: JobFilter = JobFilter(), *, limit: int = 0,
                        reason: str = "") -> AsyncIterator[BulkOutcome]:
        """:meth:`act_on_jobs` call after call until the selection is done: each call's outcome
        as it comes, for progress."""
        return call_after_call(
            lambda token: self.act_on_jobs(action, selection, limit=limit, page_token=token, reason=reason))

    async def trigger_job(self, job_id: str) -> Run:
        """Run the job once, now, outside its schedule; returns the new run."""
        request = jobs_pb2.TriggerJobRequest(tenant=self.tenant, job_id=job_id)
        return wire.run_from_pb((await self._connection.call(self._connection.stubs.jobs.TriggerJob, request)).run)

    async def backfill_job(
        self, job_id: str, start: datetime | None = None, end: datetime | None = None, *,
        mode: BackfillMode | str | None = None, overlap: OverlapPolicy | str | None = None, dry_run: bool = False,
        limit: int = 0, page_token: str = "",
    ) -> BackfillProgress:
        """Run the job's fire times in ``[start, end)`` (``end`` at most now) now: ``mode``
        ``missed`` (the default) those with no run that ran, ``all`` every one; ``overlap``
        ``buffer_all`` (the default: one at a time, oldest first) or ``allow``. One call takes
        ``limit`` fire times at most (0: 1,000); go on with ``page_token`` (the range and the
        policies are the token's), or use :meth:`backfill_all`."""
        request = backfill_request(self.tenant, job_id, start, end, mode=mode, overlap=overlap, dry_run=dry_run,
                                   limit=limit, page_token=page_token)
        return backfill_progress(await self._connection.call(self._connection.stubs.jobs.BackfillJob, request))

    async def backfill_all(
        self, job_id: str, start: datetime, end: datetime, *, mode: BackfillMode | str | None = None,
        overlap: OverlapPolicy | str | None = None, dry_run: bool = False, limit: int = 0,
    ) -> AsyncIterator[BackfillProgress]:
        """:meth:`backfill_job` call after call until the range is done: each call's progress as it comes."""
        progress = await self.backfill_job(job_id, start, end, mode=mode, overlap=overlap, dry_run=dry_run, limit=limit)
        yield progress
        while progress.next_page_token:
            progress = await self.backfill_job(job_id, dry_run=dry_run, limit=limit, page_token=progress.next_page_token)
            yield progress

    async def preview(
        self, schedule: Schedule, *, after: datetime | None = None, count: int = 5
    ) -> list[tuple[datetime, datetime]]:
        """The next fire times of a schedule, as computed by the daemon.

        Returns:
            ``(utc, local)`` pairs: the instant in UTC, and the same instant in the schedule's
            time zone.
        """
        request = jobs_pb2.PreviewScheduleRequest(
            schedule=wire.schedule_to_pb(schedule), after=wire.timestamp(after), count=count
        )
        response = await self._connection.call(self._connection.stubs.jobs.PreviewSchedule, request)
        return [(fire.utc.ToDatetime(tzinfo=UTC), datetime.fromisoformat(fire.local)) for fire in response.fire_times]

    # -- runs -----------------------------------------------------------------------------------

    async def list_runs(
        self,
        *,
        job_id: str | None = None,
        states: Iterable[RunState | str] = (),
        page_size: int = 100,
        page_token: str = "",
        id_prefix: str | None = None,
        scheduled_from: datetime | None = None,
        scheduled_before: datetime | None = None,
        job_type: str | None = None,
        backfill_id: str | None = None,
    ) -> Page[Run]:
        """One page of runs, newest scheduled time first; with ``id_prefix``, the runs whose id
        starts with it, in id order (one page only); with ``scheduled_from`` and
        ``scheduled_before``, only the runs scheduled in ``[scheduled_from, scheduled_before)``;
        with ``backfill_id``, only the runs that backfill wrote (:meth:`backfill_job`)."""
        request = runs_pb2.ListRunsRequest(
            tenant=self.tenant,
            job_id=job_id or "",
            job_type=job_type or "",
            states=[RUN_STATE.named(state, "states") for state in states],
            page_size=page_size,
            page_token=page_token,
            id_prefix=id_prefix or "",
            scheduled_from=wire.timestamp(scheduled_from),
            scheduled_before=wire.timestamp(scheduled_before),
            backfill_id=backfill_id or "",
        )
        response = await self._connection.call(self._connection.stubs.runs.ListRuns, request)
        return Page(items=[wire.run_from_pb(run) for run in response.runs], next_page_token=response.next_page_token)

    async def get_run(self, run_id: str) -> tuple[Run, list[Attempt]]:
        """A run and its attempts, first attempt first; the run with its ``payload`` and ``output``
        (JSON), both empty if the token may not read payloads (a viewer's) or the node hides them."""
        request = runs_pb2.GetRunRequest(tenant=self.tenant, run_id=run_id)
        detail = await self._connection.call(self._connection.stubs.runs.GetRun, request)
        attempts = [wire.attempt_from_pb(detail.run.run_id, attempt) for attempt in detail.attempts]
        # As listings say: when its first attempt's handler was entered, read from the attempts.
        started = next((attempt.started_at for attempt in attempts if attempt.started_at is not None), None)
        run = replace(wire.run_from_pb(detail.run), checkpoint=detail.checkpoint or None,
                      first_started_at=started, payload=detail.payload, output=detail.output or None)
        return run, attempts

    async def cancel_run(self, run_id: str) -> Run:
        """Cancel a run: a queued one never starts, a running one is told to stop."""
        request = runs_pb2.CancelRunRequest(tenant=self.tenant, run_id=run_id)
        return wire.run_from_pb((await self._connection.call(self._connection.stubs.runs.CancelRun, request)).run)

    async def retry_run(self, run_id: str) -> Run:
        """Replay a dead or lost run now, as a new attempt with the same idempotency key."""
        request = runs_pb2.RetryRunRequest(tenant=self.tenant, run_id=run_id)
        return wire.run_from_pb((await self._connection.call(self._connection.stubs.runs.RetryRun, request)).run)

    async def act_on_runs(self, action: RunAction | str, selection: RunFilter = RunFilter(), *, dry_run: bool = False,
                          limit: int = 0, page_token: str = "") -> BulkOutcome:
        """Cancel or retry (``action``) the runs ``selection`` takes, ``limit`` at most (0: the node's
        default, 1,000); with ``dry_run``, how many it would take. One call: continue with the
        outcome's ``next_page_token``, or use :meth:`act_on_all_runs`."""
        request = runs_pb2.ActOnRunsRequest(
            tenant=self.tenant, action=RUN_ACTION.named(action, "action"), dry_run=dry_run, limit=limit,
            page_token=page_token, selection=run_selection_pb(selection))
        return bulk_outcome_from_pb(await self._connection.call(self._connection.stubs.runs.ActOnRuns, request))

    def act_on_all_runs(self, action: RunAction | str, selection: RunFilter = RunFilter(), *,
                        limit: int = 0) -> AsyncIterator[BulkOutcome]:
        """:meth:`act_on_runs` call after call until the selection is done (or a call stops short,
        its ``stopped_because`` set): each call's outcome as it comes, for progress."""
        return call_after_call(lambda token: self.act_on_runs(action, selection, limit=limit, page_token=token))

    # -- workflows ------------------------------------------------------------------------------

    async def create_workflow(self, definition: Mapping[str, Any] | str) -> tuple[Workflow, bool]:
        """Store a workflow definition (a JSON document, or the dict it would be) as the
        workflow's next version; the same definition again returns the latest version unchanged.

        Returns:
            The workflow version, and True if it is new.
        """
        text = definition if isinstance(definition, str) else orjson.dumps(definition).decode()
        request = workflows_pb2.CreateWorkflowRequest(tenant=self.tenant, definition=text)
        response = await self._connection.call(self._connection.stubs.workflows.CreateWorkflow, request)
        return workflow_from_pb(response.workflow), response.created

    async def get_workflow(self, name: str, version: int = 0) -> Workflow:
        """A version of a workflow (0: the latest)."""
        request = workflows_pb2.GetWorkflowRequest(tenant=self.tenant, name=name, version=version)
        response = await self._connection.call(self._connection.stubs.workflows.GetWorkflow, request)
        return workflow_from_pb(response.workflow)

    async def list_workflows(self, *, page_size: int = 100, page_token: str = "") -> Page[Workflow]:
        """The latest version of each workflow, by name."""
        request = workflows_pb2.ListWorkflowsRequest(tenant=self.tenant, page_size=page_size, page_token=page_token)
        response = await self._connection.call(self._connection.stubs.workflows.ListWorkflows, request)
        return Page(items=[workflow_from_pb(w) for w in response.workflows], next_page_token=response.next_page_token)

    async def trigger_workflow(self, name: str, input: Any = None) -> WorkflowRun:  # noqa: A002 - the API's word
        """Start a run of the workflow's latest version now; ``input`` is sent as JSON."""
        request = workflows_pb2.TriggerWorkflowRequest(tenant=self.tenant, name=name, input=encode_payload(input))
        response = await self._connection.call(self._connection.stubs.workflows.TriggerWorkflow, request)
        return workflow_run_from_pb(response.run)

    async def list_workflow_runs(self, name: str = "", *, page_size: int = 100, page_token: str = "",
                                 id_prefix: str | None = None) -> Page[WorkflowRun]:
        """The runs of a workflow (every version), newest first; with ``id_prefix``, the runs whose
        id starts with it (of any workflow when ``name`` is empty), in id order (one page only)."""
        request = workflows_pb2.ListWorkflowRunsRequest(tenant=self.tenant, name=name, page_size=page_size,
                                                        page_token=page_token, id_prefix=id_prefix or "")
        response = await self._connection.call(self._connection.stubs.workflows.ListWorkflowRuns, request)
        return Page(items=[workflow_run_from_pb(r) for r in response.runs], next_page_token=response.next_page_token)

    async def get_workflow_run(self, workflow_run_id: str) -> tuple[WorkflowRun, Workflow, list[StepView]]:
        """A workflow run, the version of the workflow it runs, and each step's state and runs."""
        request = workflows_pb2.GetWorkflowRunRequest(tenant=self.tenant, workflow_run_id=workflow_run_id)
        detail = await self._connection.call(self._connection.stubs.workflows.GetWorkflowRun, request)
        return workflow_run_from_pb(detail.run), workflow_from_pb(detail.workflow), step_views_from_pb(detail)

    async def cancel_workflow_run(self, workflow_run_id: str) -> WorkflowRun:
        """Cancel a workflow run: queued steps never start, running ones are told to stop."""
        request = workflows_pb2.CancelWorkflowRunRequest(tenant=self.tenant, workflow_run_id=workflow_run_id)
        response = await self._connection.call(self._connection.stubs.workflows.CancelWorkflowRun, request)
        return workflow_run_from_pb(response.run)

    async def resume_workflow_run(self, workflow_run_id: str) -> WorkflowRun:
        """Run a failed or cancelled workflow run on: failed steps again, succeeded ones not."""
        request = workflows_pb2.ResumeWorkflowRunRequest(tenant=self.tenant, workflow_run_id=workflow_run_id)
        response = await self._connection.call(self._connection.stubs.workflows.ResumeWorkflowRun, request)
        return workflow_run_from_pb(response.run)


    # -- the audit trail ------------------------------------------------------------------------

    async def list_audit(
        self, kind: AuditTarget | str, target_id: str, limit: int = DEFAULT_AUDIT_LIMIT
    ) -> list[AuditEvent]:
        """Who changed a job or a run, and when: its ``limit`` (at most 1000) newest events,
        newest first. ``kind`` is ``job`` (the job's events and its runs') or ``run``. A deleted
        job keeps its history; an id of another tenant has none."""
        request = jobs_pb2.ListAuditRequest(tenant=self.tenant, target_kind=AUDIT_TARGET.named(kind, "kind"), target_id=target_id,
                                            limit=limit)
        response = await self._connection.call(self._connection.stubs.jobs.ListAudit, request)
        return [audit_event_from_pb(event) for event in response.events]

    # -- cluster --------------------------------------------------------------------------------

    async def cluster(self) -> ClusterStatus:
        """Nodes and shards of the cluster as the daemon sees them, and the workers connected to
        the node that answered."""
        return cluster_from_pb(await self._connection.call(self._connection.stubs.admin.GetCluster, admin_pb2.GetClusterRequest()))

    async def wait_ready(self, timeout: float) -> None:
        """Wait until the daemon reports SERVING on the standard gRPC health service.

        Raises:
            TimeoutError: The daemon was not serving within ``timeout`` seconds.
            RemoteError: The daemon answered with an error other than "not reachable yet".
        """
        await self._connection.wait_ready(timeout)

    # -- API tokens (admin tokens only) -----------------------------------------------------------

    async def create_token(
        self, tenant: str, role: Role | str, *, name: str = "", expires_in: timedelta | None = None
    ) -> tuple[ApiToken, str]:
        """Create an API token; returns it and its secret (``fl_<id>_<secret>``), shown only now."""
        request = admin_pb2.CreateTokenRequest(tenant=tenant, role=ROLE.named(role, "role"), name=name,
                                               expires_in=wire.duration(expires_in))
        response = await self._connection.call(self._connection.stubs.admin.CreateToken, request)
        return wire.token_from_pb(response.token), response.secret

    async def list_tokens(self, tenant: str = "") -> list[ApiToken]:
        """Tokens of ``tenant``, or of every tenant; never their secrets."""
        response = await self._connection.call(self._connection.stubs.admin.ListTokens, admin_pb2.ListTokensRequest(tenant=tenant))
        return [wire.token_from_pb(token) for token in response.tokens]

    async def revoke_token(self, token_id: str) -> ApiToken:
        """Revoke a token: every node refuses it within seconds. Revoking twice is not an error."""
        request = admin_pb2.RevokeTokenRequest(token_id=token_id)
        return wire.token_from_pb((await self._connection.call(self._connection.stubs.admin.RevokeToken, request)).token)

    # -- quotas ---------------------------------------------------------------------------------

    async def get_quota(self, tenant: str = "") -> tuple[TenantQuota, TenantQuota]:
        """A tenant's quotas in force, and its override (unset fields: the nodes' defaults).
        Empty ``tenant``: the client's own; another needs an admin token."""
        status = (await self._connection.call(self._connection.stubs.admin.GetQuota,
                                              admin_pb2.GetQuotaRequest(tenant=tenant or self.tenant))).quota
        return wire.quota_from_pb(status.in_force), wire.quota_from_pb(status.override)

    async def set_quota(self, tenant: str, override: TenantQuota | None) -> tuple[TenantQuota, TenantQuota]:
        """Replace a tenant's quota override (admin tokens only); None removes it."""
        request = admin_pb2.SetQuotaRequest(tenant=tenant, reset=override is None,
                                            override=wire.quota_to_pb(override) if override else None)
        status = (await self._connection.call(self._connection.stubs.admin.SetQuota, request)).quota
        return wire.quota_from_pb(status.in_force), wire.quota_from_pb(status.override)

    def _own(self, spec: JobSpec) -> JobSpec:
        # The client speaks for one tenant: every spec it sends carries it, so a JobSpec built with
        # the model default ("default") lands in the tenant the client was opened for (empty: the
        # token's own, decided by the node).
        return spec if spec.tenant == self.tenant else replace(spec, tenant=self.tenant)

