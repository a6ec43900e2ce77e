"""The console's pages: each one API call or a few, as the caller, rendered on the server.

Lists are pages of the API's own (keyset page tokens, 50 rows): no page reads more than it shows,
however many jobs and runs the tenant has.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import grpc
from aiohttp import web

from fastlane._proto import admin_pb2, jobs_pb2, runs_pb2, workflows_pb2
from fastlane.auth.caller import Caller
from fastlane.cli.views import attempt_note, describe_schedule, run_duration, run_lag
from fastlane.client.convert import audit_event_from_pb, step_views_from_pb, workflow_from_pb, workflow_run_from_pb
from fastlane.console import dag, timeline
from fastlane.console.bulk import bulk_note
from fastlane.console.chart import lag_chart
from fastlane.console.gateway import CallRefused
from fastlane.console.rendering import CONSOLE, call_api, caller_of, job_id_named, render
from fastlane.domain import lifecycle, schedules
from fastlane.domain.access import Role
from fastlane.domain.models import Job, JobState, RunState, ScheduleKind
from fastlane.domain.records import JobAction, RunAction
from fastlane.domain.workflows import WORKFLOW_JOB_TYPE
from fastlane.errors import InvalidArgument
from fastlane.rpc import wire
from fastlane.rpc.enums import AUDIT_TARGET, JOB_STATE, RUN_STATE, WireEnum

PAGE_SIZE = 50
# Which bulk buttons the runs page offers for its state filter (any state: both).
_BULK_TAKES = {action.value: sorted(state.value for state in lifecycle.TAKEN_BY[action]) for action in RunAction}
_JOB_BULK_TAKES = {action.value: sorted(state.value for state in lifecycle.JOBS_TAKEN_BY[action]) for action in JobAction}
ID_CHARS = frozenset("0123456789abcdefABCDEF-")
PREVIEW_COUNT = 8
HISTORY_EVENTS = 30
TIMELINE_RUNS = 100  # step runs read for a workflow run's timeline (a wide fan-out shows its first ones)
NOTES = {  # what an action just did, shown once after its redirect (a fixed set: no text from the URL)
    "created": "Job created.", "updated": "Job updated.", "paused": "Job paused.", "resumed": "Job resumed.",
    "triggered": "A run of the job was made, due now.", "deleted": "Job deleted.", "cancelled": "Cancellation asked.",
    "retried": "The run will be tried again now.", "resumed-workflow": "The workflow run goes on.",
    "triggered-workflow": "A run of the workflow was started.",
}


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", overview)
    app.router.add_get("/jobs", jobs)
    app.router.add_get("/jobs/{job_id}", job)
    app.router.add_get("/runs", runs)
    app.router.add_get("/runs/{run_id}", run)
    app.router.add_get("/cluster", cluster)
    app.router.add_get("/workflows", workflows)
    app.router.add_get("/workflow", workflow)  # ?name=: a name may hold a slash
    app.router.add_get("/workflow-runs/{workflow_run_id}", workflow_run)


def _note(request: web.Request) -> str | None:
    return NOTES.get(request.query.get("done", "")) or bulk_note(request.query)


def _filter_value(values: WireEnum[Any, Any], text: str, field: str) -> Any:
    """A list filter from the query string as the API takes it: empty is any (0); a word that is
    not one of the enumeration's is refused here, as the API would refuse it."""
    try:
        return values.filter(text, field)
    except InvalidArgument as refused:
        raise CallRefused(grpc.StatusCode.INVALID_ARGUMENT, str(refused)) from None


def _visible(caller: Caller, tenant: str) -> bool:
    """Whether a tenant's figures are the caller's to see: as the API shows workers (an admin sees all)."""
    return caller.tenant is None or caller.role is Role.ADMIN or caller.tenant == tenant


async def overview(request: web.Request) -> web.Response:
    console = request.app[CONSOLE]
    caller = caller_of(request)
    points = console.activity.points()
    recent = points[-6:]  # about the last minute
    seconds = sum(p.seconds for p in recent)
    released_per_second = sum(p.released for p in recent) / seconds if seconds else 0.0
    status = await call_api(request, "AdminService/GetCluster", admin_pb2.GetClusterRequest(), admin_pb2.GetClusterResponse)
    dead = await call_api(request, "RunService/ListRuns",
                          runs_pb2.ListRunsRequest(states=[RUN_STATE.number(RunState.DEAD)], page_size=PAGE_SIZE),
                          runs_pb2.ListRunsResponse)
    errored = await call_api(request, "JobService/ListJobs",
                             jobs_pb2.ListJobsRequest(state=JOB_STATE.number(JobState.ERRORED), page_size=PAGE_SIZE),
                             jobs_pb2.ListJobsResponse)
    unserved = sorted((job_type, tenant, int(count)) for (job_type, tenant), count in console.unserved().items()
                      if count and _visible(caller, tenant))
    return render(
        request, "overview.html", chart=lag_chart(points, datetime.now(UTC)), points=points,
        last=points[-1] if points else None, released_per_second=released_per_second,
        failed_last_hour=sum(p.failed for p in points),
        # A workflow run's own run ends dead with it: the workflow's page shows that, not this list.
        dead=[wire.run_from_pb(m) for m in dead.runs if m.job_type != WORKFLOW_JOB_TYPE],
        dead_more=bool(dead.next_page_token),
        errored=[wire.job_from_pb(m) for m in errored.jobs], errored_more=bool(errored.next_page_token),
        unserved=unserved, nodes=list(status.nodes), workers=len(status.workers),
    )


async def jobs(request: web.Request) -> web.Response:
    query = request.query
    q, state_text, job_type, token = (query.get(k, "").strip() for k in ("q", "state", "type", "page"))
    state = _filter_value(JOB_STATE, state_text, "state")
    found: list[Job] = []
    next_token = ""
    if q:  # the start of a name, or of an id: one page either way
        try:
            by_name = await call_api(request, "JobService/ListJobs", jobs_pb2.ListJobsRequest(
                name_prefix=q, state=state, job_type=job_type, page_size=PAGE_SIZE), jobs_pb2.ListJobsResponse)
            found = [wire.job_from_pb(m) for m in by_name.jobs]
        except CallRefused as refusal:  # not the start of any valid name: no job's
            if refusal.code is not grpc.StatusCode.INVALID_ARGUMENT:
                raise
        if all(c in ID_CHARS for c in q):  # ids are UUIDs
            by_id = await call_api(request, "JobService/ListJobs", jobs_pb2.ListJobsRequest(
                id_prefix=q, state=state, job_type=job_type, page_size=PAGE_SIZE), jobs_pb2.ListJobsResponse)
            found += [wire.job_from_pb(m) for m in by_id.jobs if m.job_id not in {j.job_id for j in found}]
    else:
        page = await call_api(request, "JobService/ListJobs", jobs_pb2.ListJobsRequest(
            state=state, job_type=job_type, page_size=PAGE_SIZE, page_token=token), jobs_pb2.ListJobsResponse)
        found, next_token = [wire.job_from_pb(m) for m in page.jobs], page.next_page_token
    return render(request, "jobs.html", jobs=found, q=q, state=state_text, job_type=job_type, next_token=next_token,
                  states=[s.value for s in JobState], describe=describe_schedule, note=_note(request),
                  first_page=not token, bulk_takes=_JOB_BULK_TAKES)


async def job(request: web.Request) -> web.Response:
    job_id = request.match_info["job_id"]
    found = wire.job_from_pb((await call_api(request, "JobService/GetJob", jobs_pb2.GetJobRequest(job_id=job_id),
                                             jobs_pb2.GetJobResponse)).job)
    schedule = found.spec.schedule
    return render(request, "job.html", job=found, describe=describe_schedule, note=_note(request),
                  fires=await _fire_times(request, found),
                  fire_zone=schedule.timezone if schedule.kind is ScheduleKind.CRON else "UTC",
                  **await _runs_and_history(request, job_id, "job"))


async def _fire_times(request: web.Request, found: Job) -> list[tuple[datetime, str, str | None]]:
    """The next fire times of an active job, each with its local time (with the zone's
    abbreviation, EST or EDT, so a DST change shows) and what DST did to it."""
    if found.state is not JobState.ACTIVE or found.spec.schedule.is_one_shot:
        return []
    schedule = found.spec.schedule
    now = datetime.now(UTC)
    answer = await call_api(request, "JobService/PreviewSchedule", jobs_pb2.PreviewScheduleRequest(
        schedule=wire.schedule_to_pb(schedule), count=PREVIEW_COUNT), jobs_pb2.PreviewScheduleResponse)
    instants = [fire.utc.ToDatetime(tzinfo=UTC) for fire in answer.fire_times]
    notes = schedules.fire_notes(schedule, instants, now)
    zone = schedule.timezone if schedule.kind is ScheduleKind.CRON else "UTC"
    return [(at, f"{schedules.local_time(at, zone):%Y-%m-%d %H:%M:%S %Z}", note) for at, note in zip(instants, notes, strict=True)]


async def _runs_and_history(request: web.Request, target_id: str, kind: str) -> dict[str, Any]:
    context: dict[str, Any] = {}
    if kind == "job":
        page = await call_api(request, "RunService/ListRuns", runs_pb2.ListRunsRequest(job_id=target_id, page_size=20),
                              runs_pb2.ListRunsResponse)
        context.update(runs=[wire.run_from_pb(m) for m in page.runs], lag=run_lag, took=run_duration)
    history = await call_api(request, "JobService/ListAudit", jobs_pb2.ListAuditRequest(
        target_kind=AUDIT_TARGET.named(kind, "kind"), target_id=target_id, limit=HISTORY_EVENTS), jobs_pb2.ListAuditResponse)
    events = [audit_event_from_pb(e) for e in history.events]
    context["history"] = [{"at": e.at, "action": e.action, "target": f"{e.target_kind} {e.target_id}",
                           "actor": (f"{e.actor} ({e.token_id})" if e.actor else e.token_id) or "unauthenticated",
                           "detail": e.detail} for e in events]
    return context


async def runs(request: web.Request) -> web.Response:
    query = request.query
    state, job_id, job_type, token = (query.get(k, "").strip() for k in ("state", "job", "type", "page"))
    state_value = _filter_value(RUN_STATE, state, "state")
    page = await call_api(request, "RunService/ListRuns", runs_pb2.ListRunsRequest(
        states=[state_value] if state_value else [], job_id=await job_id_named(request, job_id), job_type=job_type,
        page_size=PAGE_SIZE, page_token=token), runs_pb2.ListRunsResponse)
    return render(request, "runs.html", runs=[wire.run_from_pb(m) for m in page.runs], state=state, job_id=job_id,
                  job_type=job_type, bulk_takes=_BULK_TAKES,
                  next_token=page.next_page_token, states=[s.value for s in RunState], lag=run_lag, took=run_duration,
                  note=_note(request), first_page=not token)


async def run(request: web.Request) -> web.Response:
    run_id = request.match_info["run_id"]
    detail = await call_api(request, "RunService/GetRun", runs_pb2.GetRunRequest(run_id=run_id), runs_pb2.GetRunResponse)
    attempts = [wire.attempt_from_pb(run_id, m) for m in detail.attempts]
    # As listings say (and the CLI): its lag is from when its first attempt's handler was entered.
    started = next((attempt.started_at for attempt in attempts if attempt.started_at is not None), None)
    found = replace(wire.run_from_pb(detail.run), first_started_at=started)
    return render(request, "run.html", run=found, attempts=attempts, attempt_note=attempt_note, lag=run_lag(found),
                  run_input=detail.payload, run_output=detail.output, payloads_hidden=detail.payloads_hidden,
                  took=run_duration(found), note=_note(request), **await _runs_and_history(request, run_id, "run"))


async def cluster(request: web.Request) -> web.Response:
    status = await call_api(request, "AdminService/GetCluster", admin_pb2.GetClusterRequest(), admin_pb2.GetClusterResponse)
    return render(request, "cluster.html", cluster=status, database_time=status.database_time.ToDatetime(tzinfo=UTC),
                  as_time=lambda ts: ts.ToDatetime(tzinfo=UTC))


async def workflows(request: web.Request) -> web.Response:
    token = request.query.get("page", "")
    page = await call_api(request, "WorkflowService/ListWorkflows", workflows_pb2.ListWorkflowsRequest(
        page_size=PAGE_SIZE, page_token=token), workflows_pb2.ListWorkflowsResponse)
    return render(request, "workflows.html", workflows=list(page.workflows), next_token=page.next_page_token,
                  first_page=not token, as_time=lambda ts: ts.ToDatetime(tzinfo=UTC))


async def workflow(request: web.Request) -> web.Response:
    name, token = request.query.get("name", ""), request.query.get("page", "")
    definition = (await call_api(request, "WorkflowService/GetWorkflow", workflows_pb2.GetWorkflowRequest(name=name),
                                 workflows_pb2.GetWorkflowResponse)).workflow
    page = await call_api(request, "WorkflowService/ListWorkflowRuns", workflows_pb2.ListWorkflowRunsRequest(
        name=name, page_size=PAGE_SIZE, page_token=token), workflows_pb2.ListWorkflowRunsResponse)
    return render(request, "workflow.html", workflow=definition, runs=[workflow_run_from_pb(r) for r in page.runs],
                  next_token=page.next_page_token, first_page=not token, note=_note(request))


async def workflow_run(request: web.Request) -> web.Response:
    detail = await call_api(request, "WorkflowService/GetWorkflowRun", workflows_pb2.GetWorkflowRunRequest(
        workflow_run_id=request.match_info["workflow_run_id"]), workflows_pb2.GetWorkflowRunResponse)
    steps = step_views_from_pb(detail)
    runs = {}
    for run_id in [run_id for step in steps for run_id in step.run_ids][:TIMELINE_RUNS]:
        shown = await call_api(request, "RunService/GetRun", runs_pb2.GetRunRequest(run_id=run_id),
                               runs_pb2.GetRunResponse)
        runs[run_id] = (wire.run_from_pb(shown.run), [wire.attempt_from_pb(run_id, m) for m in shown.attempts])
    graph = dag.layout(workflow_from_pb(detail.workflow).spec, {step.name: step.state.value for step in steps})
    return render(request, "workflow_run.html", run=workflow_run_from_pb(detail.run), steps=steps, graph=graph,
                  timeline=timeline.bars(steps, runs, datetime.now(UTC)), note=_note(request))

