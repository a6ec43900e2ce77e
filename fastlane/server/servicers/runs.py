"""RunService: run history (store reads), and cancel and retry, of one run or in bulk (:mod:`~fastlane.engine.operations` steps)."""

from __future__ import annotations

import grpc

from fastlane._proto import runs_pb2, runs_pb2_grpc
from fastlane.domain import validation
from fastlane.domain.limits import DEFAULT_BULK_LIMIT, MAX_BULK_LIMIT
from fastlane.domain.records import RunAction
from fastlane.engine.operations import Operations
from fastlane.rpc import wire
from fastlane.rpc.enums import RUN_ACTION
from fastlane.rpc.filters import run_filter_in
from fastlane.server.guard import rpc, tenant_of
from fastlane.server.payloads import payloads_shown
from fastlane.server.quotas import QuotaGuard
from fastlane.storage import Store


class RunServicer(runs_pb2_grpc.RunServiceServicer):
    def __init__(self, store: Store, operations: Operations, *, quotas: QuotaGuard | None = None,
                 hide_payloads: bool = False) -> None:
        self._store = store
        self._operations = operations
        self._quotas = quotas
        self._hide_payloads = hide_payloads

    @rpc
    async def ListRuns(
        self,
        request: runs_pb2.ListRunsRequest,
        context: grpc.aio.ServicerContext[runs_pb2.ListRunsRequest, runs_pb2.ListRunsResponse],
    ) -> runs_pb2.ListRunsResponse:
        selected = run_filter_in(
            "", job_id=request.job_id, job_type=request.job_type, states=request.states,
            scheduled_from=request.scheduled_from if request.HasField("scheduled_from") else None,
            scheduled_before=request.scheduled_before if request.HasField("scheduled_before") else None,
            backfill_id=request.backfill_id)
        tenant, limit = tenant_of(request.tenant), validation.page_size(request.page_size)
        if request.id_prefix:  # one page, in id order: for finding a run by the start of its id
            prefix = validation.identifier("id_prefix", request.id_prefix)
            found = [run for run in await self._store.runs.runs_by_id_prefix(tenant, prefix, limit)
                     if selected.matches(run)]
            return runs_pb2.ListRunsResponse(runs=[wire.run_to_pb(run) for run in found])
        page = await self._store.runs.list_runs(
            tenant, job_id=selected.job_id, job_type=selected.job_type, states=selected.states, limit=limit,
            page_token=request.page_token,
            scheduled_from=selected.scheduled_from, scheduled_before=selected.scheduled_before,
            backfill_id=selected.backfill_id,
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
        answer = runs_pb2.GetRunResponse(run=wire.run_to_pb(run), attempts=[wire.attempt_to_pb(a) for a in attempts])
        if payloads_shown(self._hide_payloads):
            answer.checkpoint, answer.payload, answer.output = run.checkpoint or b"", run.payload, run.output or b""
        else:
            answer.payloads_hidden = True
        return answer

    @rpc
    async def CancelRun(
        self, request: runs_pb2.CancelRunRequest,
        context: grpc.aio.ServicerContext[runs_pb2.CancelRunRequest, runs_pb2.CancelRunResponse],
    ) -> runs_pb2.CancelRunResponse:
        run = await self._operations.cancel_run(tenant_of(request.tenant), _run_id(request))
        return runs_pb2.CancelRunResponse(run=wire.run_to_pb(run))

    @rpc
    async def ActOnRuns(
        self, request: runs_pb2.ActOnRunsRequest,
        context: grpc.aio.ServicerContext[runs_pb2.ActOnRunsRequest, runs_pb2.ActOnRunsResponse],
    ) -> runs_pb2.ActOnRunsResponse:
        action = RUN_ACTION.member(request.action, "action")
        given = request.selection
        selection = run_filter_in(
            "selection.", job_id=given.job_id, job_type=given.job_type, states=given.states,
            scheduled_from=given.scheduled_from if given.HasField("scheduled_from") else None,
            scheduled_before=given.scheduled_before if given.HasField("scheduled_before") else None,
            backfill_id=given.backfill_id)
        limit = validation.count("limit", request.limit, 0, MAX_BULK_LIMIT) or DEFAULT_BULK_LIMIT
        tenant = tenant_of(request.tenant)
        admit = self._quotas.admit_run if self._quotas is not None and action is RunAction.RETRY else None
        outcome = await self._operations.act_on_runs(
            tenant, action, selection, dry_run=request.dry_run, limit=limit, page_token=request.page_token,
            admit=admit)
        return runs_pb2.ActOnRunsResponse(matched=outcome.matched, acted=outcome.acted, skipped=outcome.skipped,
                                          next_page_token=outcome.next_page_token,
                                          stopped_because=outcome.stopped_because)

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
