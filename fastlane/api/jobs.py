"""JobService: protobuf in, store and fast-lane calls, protobuf out."""

from __future__ import annotations

from datetime import UTC, datetime

import grpc

from fastlane import schedules, wire
from fastlane._proto import common_pb2, jobs_pb2, jobs_pb2_grpc
from fastlane.api.guard import rpc, tenant_of
from fastlane.engine.dispatch import Dispatcher
from fastlane.engine.lane import FastLane
from fastlane.errors import InvalidArgument
from fastlane.models import JobState, ScheduleKind
from fastlane.storage import Store

MAX_PREVIEW = 1000


class JobServicer(jobs_pb2_grpc.JobServiceServicer):
    def __init__(self, store: Store, lane: FastLane, dispatcher: Dispatcher) -> None:
        self._store = store
        self._lane = lane
        self._dispatcher = dispatcher

    @rpc
    async def CreateJob(self, request: jobs_pb2.CreateJobRequest, context: grpc.aio.ServicerContext) -> jobs_pb2.CreateJobResponse:
        spec = wire.spec_from_pb(request.spec, tenant=tenant_of(request.spec.tenant))
        job, created = await self._store.create_job(spec)
        if created:
            self._lane.job_changed(job)
        return jobs_pb2.CreateJobResponse(job=wire.job_to_pb(job), created=created)

    @rpc
    async def GetJob(self, request: jobs_pb2.JobRef, context: grpc.aio.ServicerContext) -> common_pb2.Job:
        return wire.job_to_pb(await self._store.get_job(tenant_of(request.tenant), request.job_id))

    @rpc
    async def ListJobs(self, request: jobs_pb2.ListJobsRequest, context: grpc.aio.ServicerContext) -> jobs_pb2.ListJobsResponse:
        state = wire.enum_value(JobState, request.state, "state", None) if request.state else None  # type: ignore[arg-type]
        page = await self._store.list_jobs(
            tenant_of(request.tenant), state=state, job_type=request.job_type or None,
            limit=request.page_size or 100, page_token=request.page_token,
        )
        return jobs_pb2.ListJobsResponse(jobs=[wire.job_to_pb(job) for job in page.items],
                                         next_page_token=page.next_page_token)

    @rpc
    async def UpdateJob(self, request: jobs_pb2.UpdateJobRequest, context: grpc.aio.ServicerContext) -> common_pb2.Job:
        tenant = tenant_of(request.spec.tenant)
        job = await self._store.update_job(tenant, request.job_id, wire.spec_from_pb(request.spec, tenant=tenant))
        self._lane.job_changed(job)
        return wire.job_to_pb(job)

    @rpc
    async def PauseJob(self, request: jobs_pb2.JobRef, context: grpc.aio.ServicerContext) -> common_pb2.Job:
        job = await self._store.pause_job(tenant_of(request.tenant), request.job_id)
        self._lane.job_changed(job)
        return wire.job_to_pb(job)

    @rpc
    async def ResumeJob(self, request: jobs_pb2.JobRef, context: grpc.aio.ServicerContext) -> common_pb2.Job:
        job = await self._store.resume_job(tenant_of(request.tenant), request.job_id)
        self._lane.job_changed(job)
        return wire.job_to_pb(job)

    @rpc
    async def DeleteJob(self, request: jobs_pb2.JobRef, context: grpc.aio.ServicerContext) -> jobs_pb2.DeleteJobResponse:
        await self._store.delete_job(tenant_of(request.tenant), request.job_id)
        self._lane.forget_job(request.job_id)
        self._dispatcher.forget_job(request.job_id)
        return jobs_pb2.DeleteJobResponse()

    @rpc
    async def TriggerJob(self, request: jobs_pb2.JobRef, context: grpc.aio.ServicerContext) -> common_pb2.Run:
        run = await self._store.create_manual_run(tenant_of(request.tenant), request.job_id)
        self._lane.schedule_run(run)
        return wire.run_to_pb(run)

    @rpc
    async def PreviewSchedule(
        self, request: jobs_pb2.PreviewScheduleRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.PreviewScheduleResponse:
        count = request.count or 5
        if not 1 <= count <= MAX_PREVIEW:
            raise InvalidArgument("count", f"{count} is out of range (1..{MAX_PREVIEW})")
        schedule = wire.schedule_from_pb(request.schedule)
        schedules.validate_schedule(schedule)
        after = request.after.ToDatetime(tzinfo=UTC) if request.HasField("after") else datetime.now(UTC)
        zone_name = schedule.timezone if schedule.kind is ScheduleKind.CRON else "UTC"
        fire_times = [
            jobs_pb2.FireTime(utc=wire.timestamp(instant), local=schedules.local_time(instant, zone_name).isoformat())
            for instant in schedules.preview(schedule, after, count)
        ]
        return jobs_pb2.PreviewScheduleResponse(fire_times=fire_times)
