"""The workflow calls of the async client (:class:`fastlane.client.Client` inherits them).

Definitions are JSON documents (see :mod:`fastlane.domain.workflows`); every call returns domain
models, as the rest of the client does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import orjson

from fastlane._proto import workflows_pb2
from fastlane.domain.models import DEFAULT_TENANT, RunState
from fastlane.domain.records import Page
from fastlane.domain.workflow_definitions import parse_definition
from fastlane.domain.workflows import StepState, StepView, Workflow, WorkflowRun, WorkflowRunState
from fastlane.payloads import encode_payload
from fastlane.rpc import wire

R = TypeVar("R")


class WorkflowCalls:
    tenant: str

    def _connect(self) -> Any:
        raise NotImplementedError

    async def _call(self, rpc: Callable[..., Awaitable[R]], request: Any) -> R:
        raise NotImplementedError

    async def create_workflow(self, definition: Mapping[str, Any] | str) -> tuple[Workflow, bool]:
        """Store a workflow definition (a JSON document, or the dict it would be) as the
        workflow's next version; the same definition again returns the latest version unchanged.

        Returns:
            The workflow version, and True if it is new.
        """
        text = definition if isinstance(definition, str) else orjson.dumps(definition).decode()
        request = workflows_pb2.CreateWorkflowRequest(tenant=self.tenant, definition=text)
        response = await self._call(self._connect().workflows.CreateWorkflow, request)
        return _workflow_from_pb(response.workflow), response.created

    async def get_workflow(self, name: str, version: int = 0) -> Workflow:
        """A version of a workflow (0: the latest)."""
        request = workflows_pb2.WorkflowRef(tenant=self.tenant, name=name, version=version)
        return _workflow_from_pb(await self._call(self._connect().workflows.GetWorkflow, request))

    async def list_workflows(self, *, page_size: int = 100, page_token: str = "") -> Page[Workflow]:
        """The latest version of each workflow, by name."""
        request = workflows_pb2.ListWorkflowsRequest(tenant=self.tenant, page_size=page_size, page_token=page_token)
        response = await self._call(self._connect().workflows.ListWorkflows, request)
        return Page(items=[_workflow_from_pb(w) for w in response.workflows], next_page_token=response.next_page_token)

    async def trigger_workflow(self, name: str, input: Any = None) -> WorkflowRun:  # noqa: A002 - the API's word
        """Start a run of the workflow's latest version now; ``input`` is sent as JSON."""
        request = workflows_pb2.TriggerWorkflowRequest(tenant=self.tenant, name=name, input=encode_payload(input))
        return _workflow_run_from_pb(await self._call(self._connect().workflows.TriggerWorkflow, request))

    async def list_workflow_runs(self, name: str, *, page_size: int = 100, page_token: str = "") -> Page[WorkflowRun]:
        """The runs of a workflow (every version), newest first."""
        request = workflows_pb2.ListWorkflowRunsRequest(tenant=self.tenant, name=name, page_size=page_size,
                                                        page_token=page_token)
        response = await self._call(self._connect().workflows.ListWorkflowRuns, request)
        return Page(items=[_workflow_run_from_pb(r) for r in response.runs], next_page_token=response.next_page_token)

    async def get_workflow_run(self, workflow_run_id: str) -> tuple[WorkflowRun, Workflow, list[StepView]]:
        """A workflow run, the version of the workflow it runs, and each step's state and runs."""
        request = workflows_pb2.WorkflowRunRef(tenant=self.tenant, workflow_run_id=workflow_run_id)
        detail = await self._call(self._connect().workflows.GetWorkflowRun, request)
        steps = [StepView(name=step.name, state=StepState(step.state), run_ids=tuple(step.run_ids),
                          run_states=tuple(RunState(state) for state in step.run_states), items=len(step.run_ids),
                          error=step.error or None) for step in detail.steps]
        return _workflow_run_from_pb(detail.run), _workflow_from_pb(detail.workflow), steps

    async def cancel_workflow_run(self, workflow_run_id: str) -> WorkflowRun:
        """Cancel a workflow run: queued steps never start, running ones are told to stop."""
        request = workflows_pb2.WorkflowRunRef(tenant=self.tenant, workflow_run_id=workflow_run_id)
        return _workflow_run_from_pb(await self._call(self._connect().workflows.CancelWorkflowRun, request))

    async def resume_workflow_run(self, workflow_run_id: str) -> WorkflowRun:
        """Run a failed or cancelled workflow run on: failed steps again, succeeded ones not."""
        request = workflows_pb2.WorkflowRunRef(tenant=self.tenant, workflow_run_id=workflow_run_id)
        return _workflow_run_from_pb(await self._call(self._connect().workflows.ResumeWorkflowRun, request))


def _workflow_from_pb(message: workflows_pb2.Workflow) -> Workflow:
    spec = parse_definition(message.definition, tenant=message.tenant or DEFAULT_TENANT, max_payload=1 << 62)
    return Workflow(workflow_id=message.workflow_id, job_id=message.job_id, version=message.version, spec=spec,
                    definition=message.definition, created_at=wire.epoch_plus(message.created_at))


def _workflow_run_from_pb(message: workflows_pb2.WorkflowRun) -> WorkflowRun:
    return WorkflowRun(
        workflow_run_id=message.workflow_run_id, tenant=message.tenant, workflow_id="", job_id=message.job_id,
        workflow_name=message.workflow_name, version=message.version, shard_id=0,
        state=WorkflowRunState(message.state), input=message.input, error=message.error or None,
        created_at=wire.epoch_plus(message.created_at), updated_at=wire.epoch_plus(message.created_at),
        finished_at=wire.instant(message.finished_at, message.HasField("finished_at")),
    )
