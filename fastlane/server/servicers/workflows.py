"""WorkflowService: definitions and runs of workflows (:mod:`fastlane.domain.workflows`)."""

from __future__ import annotations

import grpc

from fastlane._proto import workflows_pb2 as pb
from fastlane._proto import workflows_pb2_grpc
from fastlane.domain import validation
from fastlane.domain import workflows as wf
from fastlane.domain.limits import DEFAULT_MAX_PAYLOAD_BYTES
from fastlane.domain.models import ScheduleKind
from fastlane.domain.workflow_definitions import parse_definition, parse_input
from fastlane.domain.workflow_runs import step_views
from fastlane.engine.operations import Operations
from fastlane.rpc import wire
from fastlane.rpc.enums import RUN_STATE, STEP_STATE, WORKFLOW_RUN_STATE
from fastlane.server.guard import rpc, tenant_of
from fastlane.server.payloads import payloads_shown
from fastlane.server.quotas import QuotaGuard
from fastlane.storage import Store
from fastlane.storage.workflows import WorkflowRunDetail


class WorkflowServicer(workflows_pb2_grpc.WorkflowServiceServicer):
    def __init__(self, store: Store, operations: Operations, *, max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 quotas: QuotaGuard | None = None, hide_payloads: bool = False) -> None:
        self._store = store
        self._operations = operations
        self._max_payload = max_payload
        self._quotas = quotas
        self._hide_payloads = hide_payloads

    @rpc
    async def CreateWorkflow(
        self, request: pb.CreateWorkflowRequest,
        context: grpc.aio.ServicerContext[pb.CreateWorkflowRequest, pb.CreateWorkflowResponse],
    ) -> pb.CreateWorkflowResponse:
        spec = parse_definition(request.definition, tenant=tenant_of(request.tenant), max_payload=self._max_payload)
        if self._quotas is not None and spec.schedule is not None:
            await self._quotas.admit_job(spec.tenant, adds_a_run=spec.schedule.kind is ScheduleKind.NOW)
        workflow, created = await self._operations.create_workflow(spec)
        return pb.CreateWorkflowResponse(workflow=workflow_to_pb(workflow), created=created)

    @rpc
    async def GetWorkflow(
        self, request: pb.GetWorkflowRequest,
        context: grpc.aio.ServicerContext[pb.GetWorkflowRequest, pb.GetWorkflowResponse],
    ) -> pb.GetWorkflowResponse:
        version = validation.count("version", request.version, 0, 1 << 30) or None
        workflow = await self._store.workflows.get_workflow(tenant_of(request.tenant), _name(request.name), version)
        return pb.GetWorkflowResponse(workflow=workflow_to_pb(workflow))

    @rpc
    async def ListWorkflows(
        self, request: pb.ListWorkflowsRequest,
        context: grpc.aio.ServicerContext[pb.ListWorkflowsRequest, pb.ListWorkflowsResponse],
    ) -> pb.ListWorkflowsResponse:
        page = await self._store.workflows.list_workflows(tenant_of(request.tenant), limit=validation.page_size(request.page_size),
                                                page_token=request.page_token)
        return pb.ListWorkflowsResponse(workflows=[workflow_to_pb(w) for w in page.items],
                                        next_page_token=page.next_page_token)

    @rpc
    async def TriggerWorkflow(
        self, request: pb.TriggerWorkflowRequest,
        context: grpc.aio.ServicerContext[pb.TriggerWorkflowRequest, pb.TriggerWorkflowResponse],
    ) -> pb.TriggerWorkflowResponse:
        tenant = tenant_of(request.tenant)
        parse_input(request.input, self._max_payload)
        if self._quotas is not None:
            await self._quotas.admit_run(tenant)
        run = await self._operations.trigger_workflow(tenant, _name(request.name), request.input)
        return pb.TriggerWorkflowResponse(run=workflow_run_to_pb(run))

    @rpc
    async def ListWorkflowRuns(
        self, request: pb.ListWorkflowRunsRequest,
        context: grpc.aio.ServicerContext[pb.ListWorkflowRunsRequest, pb.ListWorkflowRunsResponse],
    ) -> pb.ListWorkflowRunsResponse:
        tenant, limit = tenant_of(request.tenant), validation.page_size(request.page_size)
        if request.id_prefix:  # one page, in id order: for finding a run by the start of its id
            prefix = validation.identifier("id_prefix", request.id_prefix)
            name = _name(request.name) if request.name else None
            found = [run for run in await self._store.workflows.workflow_runs_by_id_prefix(tenant, prefix, limit)
                     if name is None or run.workflow_name == name]
            return pb.ListWorkflowRunsResponse(runs=[workflow_run_to_pb(r) for r in found])
        page = await self._store.workflows.list_workflow_runs(tenant, _name(request.name), limit=limit,
                                                              page_token=request.page_token)
        return pb.ListWorkflowRunsResponse(runs=[workflow_run_to_pb(r) for r in page.items],
                                           next_page_token=page.next_page_token)

    @rpc
    async def GetWorkflowRun(
        self, request: pb.GetWorkflowRunRequest,
        context: grpc.aio.ServicerContext[pb.GetWorkflowRunRequest, pb.GetWorkflowRunResponse],
    ) -> pb.GetWorkflowRunResponse:
        detail = await self._store.workflows.get_workflow_run(tenant_of(request.tenant), _run_id(request))
        return detail_to_pb(detail, outputs=payloads_shown(self._hide_payloads))

    @rpc
    async def CancelWorkflowRun(
        self, request: pb.CancelWorkflowRunRequest,
        context: grpc.aio.ServicerContext[pb.CancelWorkflowRunRequest, pb.CancelWorkflowRunResponse],
    ) -> pb.CancelWorkflowRunResponse:
        run = await self._operations.cancel_workflow_run(tenant_of(request.tenant), _run_id(request))
        return pb.CancelWorkflowRunResponse(run=workflow_run_to_pb(run))

    @rpc
    async def ResumeWorkflowRun(
        self, request: pb.ResumeWorkflowRunRequest,
        context: grpc.aio.ServicerContext[pb.ResumeWorkflowRunRequest, pb.ResumeWorkflowRunResponse],
    ) -> pb.ResumeWorkflowRunResponse:
        tenant = tenant_of(request.tenant)
        if self._quotas is not None:
            await self._quotas.admit_run(tenant)
        run = await self._operations.resume_workflow_run(tenant, _run_id(request))
        return pb.ResumeWorkflowRunResponse(run=workflow_run_to_pb(run))


def _name(name: str) -> str:
    return validation.name("name", name)


def _run_id(request: pb.GetWorkflowRunRequest | pb.CancelWorkflowRunRequest | pb.ResumeWorkflowRunRequest) -> str:
    return validation.identifier("workflow_run_id", request.workflow_run_id)


def workflow_to_pb(workflow: wf.Workflow) -> pb.Workflow:
    return pb.Workflow(workflow_id=workflow.workflow_id, name=workflow.name, version=workflow.version,
                       job_id=workflow.job_id, definition=workflow.definition,
                       created_at=wire.timestamp(workflow.created_at), tenant=workflow.tenant)


def workflow_run_to_pb(run: wf.WorkflowRun) -> pb.WorkflowRun:
    return pb.WorkflowRun(workflow_run_id=run.workflow_run_id, tenant=run.tenant, workflow_name=run.workflow_name,
                          version=run.version, state=WORKFLOW_RUN_STATE.number(run.state), input=run.input, error=run.error or "",
                          created_at=wire.timestamp(run.created_at), finished_at=wire.timestamp(run.finished_at),
                          job_id=run.job_id)


def detail_to_pb(detail: WorkflowRunDetail, *, outputs: bool) -> pb.GetWorkflowRunResponse:
    """The answer of GetWorkflowRun; with ``outputs``, what each step's runs returned."""
    views = step_views(detail.workflow.spec, detail.steps, detail.run.settled)
    return pb.GetWorkflowRunResponse(
        run=workflow_run_to_pb(detail.run), workflow=workflow_to_pb(detail.workflow),
        steps=[pb.StepStatus(name=view.name, state=STEP_STATE.number(view.state), run_ids=view.run_ids,
                             error=view.error or "", run_states=[RUN_STATE.number(state) for state in view.run_states],
                             outputs=[output or b"" for output in view.outputs] if outputs else [])
               for view in views],
    )
