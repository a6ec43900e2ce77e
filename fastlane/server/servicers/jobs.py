"""JobService: protobuf in, store reads and :mod:`~fastlane.engine.operations` steps, protobuf out.

Also the audit trail of jobs and runs (ListAudit), read from the store.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import grpc

from fastlane._proto import common_pb2, jobs_pb2, jobs_pb2_grpc
from fastlane.domain import schedules, validation
from fastlane.domain.audit import AuditEvent
from fastlane.domain.backfill import DEFAULT_BACKFILL_BATCH, MAX_BACKFILL_BATCH
from fastlane.domain.jitter import run_instant
from fastlane.domain.limits import (
    DEFAULT_BULK_LIMIT,
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_BULK_LIMIT,
    MAX_PAUSE_REASON,
    MAX_PREVIEW,
)
from fastlane.domain.models import Job, JobSpec, ScheduleKind
from fastlane.domain.records import JobAction, Page
from fastlane.domain.workflows import WORKFLOW_JOB_TYPE
from fastlane.engine.backfill import BackfillRequest
from fastlane.engine.operations import Operations
from fastlane.errors import InvalidArgument
from fastlane.rpc import wire
from fastlane.rpc.enums import AUDIT_ACTION, AUDIT_TARGET, BACKFILL_MODE, JOB_ACTION, JOB_STATE, OVERLAP_POLICY
from fastlane.rpc.filters import job_filter_in
from fastlane.server.guard import rpc, tenant_of
from fastlane.server.payloads import payloads_shown
from fastlane.server.quotas import QuotaGuard
from fastlane.storage import Store


class JobServicer(jobs_pb2_grpc.JobServiceServicer):
    def __init__(self, store: Store, operations: Operations, *, max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 quotas: QuotaGuard | None = None, hide_payloads: bool = False) -> None:
        self._store = store
        self._operations = operations
        self._max_payload = max_payload
        self._quotas = quotas
        self._hide_payloads = hide_payloads

    def _answer(self, job: Job, *, with_payload: bool = True) -> common_pb2.Job:
        """The job as a caller is told it: its payload only if asked for and the caller may see it."""
        message = wire.job_to_pb(job)
        if not (with_payload and payloads_shown(self._hide_payloads)):
            message.spec.ClearField("payload")
        return message

    def _spec(self, message: common_pb2.JobSpec) -> JobSpec:
        spec = wire.spec_from_pb(message, tenant=tenant_of(message.tenant))
        if spec.job_type == WORKFLOW_JOB_TYPE:
            raise InvalidArgument("spec.job_type", f"{WORKFLOW_JOB_TYPE!r} is for the jobs of workflows: create a workflow")
        return validation.validate_spec(spec, max_payload=self._max_payload)

    @rpc
    async def CreateJob(
        self,
        request: jobs_pb2.CreateJobRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.CreateJobRequest, jobs_pb2.CreateJobResponse],
    ) -> jobs_pb2.CreateJobResponse:
        spec = self._spec(request.spec)
        if self._quotas is not None:
            # Checked for a repeat of an existing job too: telling the two apart costs a read
            # on every creation, and a tenant at its limit has other things to look at.
            await self._quotas.admit_job(spec.tenant, adds_a_run=spec.schedule.kind is ScheduleKind.NOW)
        job, created = await self._operations.create_job(spec)
        return jobs_pb2.CreateJobResponse(job=self._answer(job), created=created)

    @rpc
    async def GetJob(
        self, request: jobs_pb2.GetJobRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.GetJobRequest, jobs_pb2.GetJobResponse],
    ) -> jobs_pb2.GetJobResponse:
        job = await self._store.jobs.get_job(tenant_of(request.tenant), _job_id(request))
        return jobs_pb2.GetJobResponse(job=self._answer(job))

    @rpc
    async def ListJobs(
        self,
        request: jobs_pb2.ListJobsRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.ListJobsRequest, jobs_pb2.ListJobsResponse],
    ) -> jobs_pb2.ListJobsResponse:
        state = JOB_STATE.optional(request.state, "state")
        job_type = validation.name("job_type", request.job_type) if request.job_type else None
        name = validation.name("name", request.name) if request.name else None
        tenant, limit = tenant_of(request.tenant), validation.page_size(request.page_size)
        if request.id_prefix and request.name_prefix:
            raise InvalidArgument("name_prefix", "give id_prefix or name_prefix, not both")
        if request.id_prefix or request.name_prefix:  # one page, in id or name order: finding a job
            if request.id_prefix:
                prefix = validation.identifier("id_prefix", request.id_prefix)
                candidates = await self._store.jobs.jobs_by_id_prefix(tenant, prefix, limit)
            else:  # a prefix of a valid name is one
                prefix = validation.name("name_prefix", request.name_prefix)
                candidates = await self._store.jobs.jobs_by_name_prefix(tenant, prefix, limit)
            found = [job for job in candidates
                     if (state is None or job.state is state) and (job_type is None or job.job_type == job_type)
                     and (name is None or job.name == name)]
            page = Page(items=found)
        else:
            page = await self._store.jobs.list_jobs(tenant, states=[state] if state else [], job_type=job_type, limit=limit,
                                               page_token=request.page_token, name=name)
        # A page of a thousand 1 MiB payloads would be a gigabyte: a caller asks for them.
        jobs = [self._answer(job, with_payload=request.include_payload) for job in page.items]
        return jobs_pb2.ListJobsResponse(jobs=jobs, next_page_token=page.next_page_token)

    @rpc
    async def UpdateJob(
        self,
        request: jobs_pb2.UpdateJobRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.UpdateJobRequest, jobs_pb2.UpdateJobResponse],
    ) -> jobs_pb2.UpdateJobResponse:
        spec = self._spec(request.spec)
        job = await self._operations.update_job(spec.tenant, validation.identifier("job_id", request.job_id), spec)
        return jobs_pb2.UpdateJobResponse(job=self._answer(job))

    @rpc
    async def PauseJob(
        self, request: jobs_pb2.PauseJobRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.PauseJobRequest, jobs_pb2.PauseJobResponse],
    ) -> jobs_pb2.PauseJobResponse:
        job = await self._operations.pause_job(tenant_of(request.tenant), _job_id(request), _reason(request.reason))
        return jobs_pb2.PauseJobResponse(job=self._answer(job))

    @rpc
    async def ResumeJob(
        self, request: jobs_pb2.ResumeJobRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.ResumeJobRequest, jobs_pb2.ResumeJobResponse],
    ) -> jobs_pb2.ResumeJobResponse:
        job = await self._operations.resume_job(tenant_of(request.tenant), _job_id(request))
        return jobs_pb2.ResumeJobResponse(job=self._answer(job))

    @rpc
    async def DeleteJob(
        self, request: jobs_pb2.DeleteJobRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.DeleteJobRequest, jobs_pb2.DeleteJobResponse],
    ) -> jobs_pb2.DeleteJobResponse:
        deleted = await self._operations.delete_job(tenant_of(request.tenant), _job_id(request))
        return jobs_pb2.DeleteJobResponse(already_deleted=not deleted)

    @rpc
    async def ActOnJobs(
        self, request: jobs_pb2.ActOnJobsRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.ActOnJobsRequest, jobs_pb2.ActOnJobsResponse],
    ) -> jobs_pb2.ActOnJobsResponse:
        action = JOB_ACTION.member(request.action, "action")
        selection = job_filter_in("selection.", job_type=request.selection.job_type, states=request.selection.states)
        limit = validation.count("limit", request.limit, 0, MAX_BULK_LIMIT) or DEFAULT_BULK_LIMIT
        if request.reason and action is not JobAction.PAUSE:
            raise InvalidArgument("reason", "only a pause takes a reason")
        outcome = await self._operations.act_on_jobs(tenant_of(request.tenant), action, selection,
                                                     dry_run=request.dry_run, limit=limit, page_token=request.page_token,
                                                     reason=_reason(request.reason))
        return jobs_pb2.ActOnJobsResponse(matched=outcome.matched, acted=outcome.acted, skipped=outcome.skipped,
                                          next_page_token=outcome.next_page_token)

    @rpc
    async def TriggerJob(
        self, request: jobs_pb2.TriggerJobRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.TriggerJobRequest, jobs_pb2.TriggerJobResponse],
    ) -> jobs_pb2.TriggerJobResponse:
        tenant = tenant_of(request.tenant)
        if self._quotas is not None:
            await self._quotas.admit_run(tenant)
        run = await self._operations.trigger_job(tenant, _job_id(request))
        return jobs_pb2.TriggerJobResponse(run=wire.run_to_pb(run))

    @rpc
    async def BackfillJob(
        self, request: jobs_pb2.BackfillJobRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.BackfillJobRequest, jobs_pb2.BackfillJobResponse],
    ) -> jobs_pb2.BackfillJobResponse:
        tenant = tenant_of(request.tenant)
        asked = BackfillRequest(
            start=wire.instant_in("start", request.start) if request.HasField("start") else None,
            end=wire.instant_in("end", request.end) if request.HasField("end") else None,
            mode=BACKFILL_MODE.optional(request.mode, "mode"),
            overlap=OVERLAP_POLICY.optional(request.overlap, "overlap"),
            dry_run=request.dry_run,
            limit=validation.count("limit", request.limit, 0, MAX_BACKFILL_BATCH) or DEFAULT_BACKFILL_BATCH,
            page_token=request.page_token)
        if self._quotas is not None and not request.dry_run:
            await self._quotas.admit_run(tenant)
        outcome = await self._operations.backfill_job(tenant, _job_id(request), asked, datetime.now(UTC))
        return jobs_pb2.BackfillJobResponse(
            backfill_id=outcome.backfill_id, matched=outcome.matched, written=outcome.written.written,
            already_run=outcome.written.already_run, covered_until=wire.timestamp(outcome.covered_until),
            next_page_token=outcome.next_page_token)

    @rpc
    async def PreviewSchedule(
        self,
        request: jobs_pb2.PreviewScheduleRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.PreviewScheduleRequest, jobs_pb2.PreviewScheduleResponse],
    ) -> jobs_pb2.PreviewScheduleResponse:
        count = validation.count("count", request.count or 5, 1, MAX_PREVIEW)
        schedule = validation.validate_schedule(wire.schedule_from_pb(request.schedule, "schedule"), "schedule")
        after = wire.instant_in("after", request.after) if request.HasField("after") else datetime.now(UTC)
        job_id = validation.identifier("job_id", request.job_id, required=False)
        zone_name = schedule.timezone if schedule.kind is ScheduleKind.CRON else "UTC"
        if schedule.kind is ScheduleKind.INTERVAL and schedule.anchor is None:
            schedule = replace(schedule, anchor=after)  # as preview() counts it
        fire_times = [
            jobs_pb2.FireTime(utc=wire.timestamp(instant), local=schedules.local_time(instant, zone_name).isoformat(),
                              run_at=wire.timestamp(run_instant(job_id, schedule, instant)) if job_id else None)
            for instant in schedules.preview(schedule, after, count)
        ]
        return jobs_pb2.PreviewScheduleResponse(fire_times=fire_times)

    @rpc
    async def ListAudit(
        self,
        request: jobs_pb2.ListAuditRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.ListAuditRequest, jobs_pb2.ListAuditResponse],
    ) -> jobs_pb2.ListAuditResponse:
        kind = AUDIT_TARGET.member(request.target_kind, "target_kind")
        target_id = validation.identifier("target_id", request.target_id)
        limit = validation.audit_limit(request.limit)
        events = await self._store.audit.list_audit(tenant_of(request.tenant), target_kind=kind, target_id=target_id,
                                              limit=limit)
        return jobs_pb2.ListAuditResponse(events=[_audit_event_to_pb(event) for event in events])


def _audit_event_to_pb(event: AuditEvent) -> jobs_pb2.AuditEvent:
    return jobs_pb2.AuditEvent(
        event_id=event.event_id or 0, tenant=event.tenant, at=wire.timestamp(event.at),
        action=AUDIT_ACTION.number(event.action), target_kind=AUDIT_TARGET.number(event.target_kind), target_id=event.target_id, job_id=event.job_id,
        token_id=event.token_id or "", actor=event.actor, detail=event.detail,
    )


JobNamed = (jobs_pb2.GetJobRequest | jobs_pb2.PauseJobRequest | jobs_pb2.ResumeJobRequest | jobs_pb2.DeleteJobRequest
            | jobs_pb2.TriggerJobRequest | jobs_pb2.BackfillJobRequest)


def _job_id(request: JobNamed) -> str:
    return validation.identifier("job_id", request.job_id)


def _reason(text: str) -> str | None:
    """A pause's reason: bounded, no control characters; empty: none."""
    return validation.text("reason", text.strip(), max_length=MAX_PAUSE_REASON) or None
