"""RunService: run history (store reads), and cancel and retry (:mod:`~fastlane.engine.operations` steps)."""

from __future__ import annotations

import grpc

from fastlane._proto import runs_pb2, runs_pb2_grpc
from fastlane.domain import validation
from fastlane.domain.models import RunState
from fastlane.engine.operations import Operations
from fastlane.errors import InvalidArgument
from fastlane.rpc import wire
from fastlane.rpc.enums import RUN_STATE
from fastlane.server.guard import rpc, tenant_of
from fastlane.server.quotas import QuotaGuard
from fastlane.storage import Store


class RunServicer(runs_pb2_grpc.RunServiceServicer):
    def __init__(self, store: Store, operations: Operations, *, quotas: QuotaGuard | None = None) -> None:
        self._store = store
        self._operations = operations
        self._quotas = quotas

    @rpc
    async def ListRuns(
        self,
        request: runs_pb2.ListRunsRequest,
        context: grpc.aio.ServicerContext[runs_pb2.ListRunsRequest, runs_pb2.ListRunsResponse],
    ) -> runs_pb2.ListRunsResponse:
        # An unspecified entry adds nothing (the filter's unspecified is any); an unknown one is refused.
        states = [RUN_STATE.member(state, f"states[{index}]")
                  for index, state in enumerate(request.states[:len(RunState)]) if state]
        if len(request.states) > len(RunState):
            raise InvalidArgument("states", f"at most {len(RunState)} states may be given")
        job_id = validation.identifier("job_id", request.job_id, required=False) or None
        tenant, limit = tenant_of(request.tenant), validation.page_size(request.page_size)
        scheduled_from = wire.instant_in("scheduled_from", request.scheduled_from) \
            if request.HasField("scheduled_from") else None
        scheduled_before = wire.instant_in("scheduled_before", request.scheduled_before) \
            if request.HasField("scheduled_before") else None
        if scheduled_from is not None and scheduled_before is not None and scheduled_before <= scheduled_from:
            raise InvalidArgument("scheduled_before", "must be later than scheduled_from")
        if request.id_prefix:  # one page, in id order: for finding a run by the start of its id
            prefix = validation.identifier("id_prefix", request.id_prefix)
            found = [run for run in await self._store.runs.runs_by_id_prefix(tenant, prefix, limit)
                     if (job_id is None or run.job_id == job_id) and (not states or run.state in states)
                     and (scheduled_from is None or run.scheduled_for >= scheduled_from)
                     and (scheduled_before is None or run.scheduled_for < scheduled_before)]
            return runs_pb2.ListRunsResponse(runs=[wire.run_to_pb(run) for run in found])
        page = await self._store.runs.list_runs(
            tenant, job_id=job_id, states=states, limit=limit, page_token=request.page_token,
            scheduled_from=scheduled_from, scheduled_before=scheduled_before,
        )
        return runs_pb2.ListRunsResponse(runs=[wire.run_to_pb(run) for run in page.items],
                                         next_page_token=page.next_page_token)

    @rpc
    async def GetRun(
        self, request: runs_pb2.GetRunRequest,
        context: grpc.aio.ServicerContext[runs_pb2.GetRunRequest, runs_pb2.GetRunResponse],
    ) -> runs_pb2.GetRunResponse:
        run = await self._store.runs.get_run(tenant_of(request.tenant), _run_id(request))
        attempts = await self._store.runs.list_attempts(run.run_id)
        return runs_pb2.GetRunResponse(run=wire.run_to_pb(run), attempts=[wire.attempt_to_pb(a) for a in attempts],
                                       checkpoint=run.checkpoint or b"")

    @rpc
    async def CancelRun(
        self, request: runs_pb2.CancelRunRequest,
        context: grpc.aio.ServicerContext[runs_pb2.CancelRunRequest, runs_pb2.CancelRunResponse],
    ) -> runs_pb2.CancelRunResponse:
        run = await self._operations.cancel_run(tenant_of(request.tenant), _run_id(request))
        return runs_pb2.CancelRunResponse(run=wire.run_to_pb(run))

    @rpc
    async def RetryRun(
        self, request: runs_pb2.RetryRunRequest,
        context: grpc.aio.ServicerContext[runs_pb2.RetryRunRequest, runs_pb2.RetryRunResponse],
    ) -> runs_pb2.RetryRunResponse:
        tenant = tenant_of(request.tenant)
        if self._quotas is not None:
            await self._quotas.admit_run(tenant)
        run = await self._operations.retry_run(tenant, _run_id(request))
        return runs_pb2.RetryRunResponse(run=wire.run_to_pb(run))


def _run_id(request: runs_pb2.GetRunRequest | runs_pb2.CancelRunRequest | runs_pb2.RetryRunRequest) -> str:
    return validation.identifier("run_id", request.run_id)
