"""Replies the client alone reads, turned into domain objects, and the parts of requests only it
builds (the messages both sides share are converted in :mod:`fastlane.rpc.wire`)."""

from __future__ import annotations

from fastlane._proto import admin_pb2, jobs_pb2, runs_pb2, workflows_pb2
from fastlane.domain.audit import AuditEvent
from fastlane.domain.cluster import ClusterStatus, NodeStatus, ShardStatus, WorkerStatus
from fastlane.domain.models import DEFAULT_TENANT
from fastlane.domain.records import BulkOutcome, JobFilter, RunFilter
from fastlane.domain.workflow_definitions import parse_definition
from fastlane.domain.workflows import StepView, Workflow, WorkflowRun
from fastlane.rpc import wire
from fastlane.rpc.enums import AUDIT_ACTION, AUDIT_TARGET, JOB_STATE, RUN_STATE, STEP_STATE, WORKFLOW_RUN_STATE


def audit_event_from_pb(event: jobs_pb2.AuditEvent) -> AuditEvent:
    return AuditEvent(
        event_id=event.event_id, tenant=event.tenant, at=wire.epoch_plus(event.at), action=AUDIT_ACTION.member(event.action, "action"),
        target_kind=AUDIT_TARGET.member(event.target_kind, "target_kind"), target_id=event.target_id, job_id=event.job_id,
        token_id=event.token_id or None, actor=event.actor, detail=event.detail,
    )


def cluster_from_pb(status: admin_pb2.GetClusterResponse) -> ClusterStatus:
    return ClusterStatus(
        database_time=wire.instant(status.database_time, status.HasField("database_time")),
        nodes=tuple(
            NodeStatus(
                node_id=node.node_id, address=node.address, shards_owned=node.shards_owned,
                workers_connected=node.workers_connected, clock_offset_ms=node.clock_offset_ms,
                heap_size=node.heap_size if node.HasField("heap_size") else None,
                ready_runs=node.ready_runs if node.HasField("ready_runs") else None,
                ready=node.ready if node.HasField("ready") else None, eligible=node.eligible,
                note=node.note, heartbeat_at=wire.instant(node.heartbeat_at, node.HasField("heartbeat_at")),
                live=node.live,
            )
            for node in status.nodes
        ),
        shards=tuple(
            ShardStatus(shard_id=shard.shard_id, owner=shard.owner, token=shard.token,
                        lease_expires_at=wire.instant(shard.lease_expires_at, shard.HasField("lease_expires_at")))
            for shard in status.shards
        ),
        workers=tuple(
            WorkerStatus(worker_id=worker.worker_id, tenant=worker.tenant, job_types=tuple(worker.job_types),
                         credits=worker.credits, in_flight=worker.in_flight, node_id=worker.node_id)
            for worker in status.workers
        ),
    )


def workflow_from_pb(message: workflows_pb2.Workflow) -> Workflow:
    spec = parse_definition(message.definition, tenant=message.tenant or DEFAULT_TENANT, max_payload=1 << 62)
    return Workflow(workflow_id=message.workflow_id, job_id=message.job_id, version=message.version, spec=spec,
                    definition=message.definition, created_at=wire.epoch_plus(message.created_at))


def workflow_run_from_pb(message: workflows_pb2.WorkflowRun) -> WorkflowRun:
    return WorkflowRun(
        workflow_run_id=message.workflow_run_id, tenant=message.tenant, workflow_id="", job_id=message.job_id,
        workflow_name=message.workflow_name, version=message.version, shard_id=0,
        state=WORKFLOW_RUN_STATE.member(message.state, "state"), input=message.input, error=message.error or None,
        created_at=wire.epoch_plus(message.created_at), updated_at=wire.epoch_plus(message.created_at),
        finished_at=wire.instant(message.finished_at, message.HasField("finished_at")),
    )


def step_views_from_pb(detail: workflows_pb2.GetWorkflowRunResponse) -> list[StepView]:
    return [StepView(name=step.name, state=STEP_STATE.member(step.state, "state"), run_ids=tuple(step.run_ids),
                     run_states=tuple(RUN_STATE.member(state, "run_states") for state in step.run_states),
                     items=len(step.run_ids), error=step.error or None,
                     outputs=tuple(output or None for output in step.outputs)) for step in detail.steps]


def run_selection_pb(selection: RunFilter) -> runs_pb2.RunSelection:
    return runs_pb2.RunSelection(
        job_id=selection.job_id or "", job_type=selection.job_type or "",
        states=[RUN_STATE.number(state) for state in sorted(selection.states)],
        scheduled_from=wire.timestamp(selection.scheduled_from), scheduled_before=wire.timestamp(selection.scheduled_before),
        backfill_id=selection.backfill_id or "")


def job_selection_pb(selection: JobFilter) -> jobs_pb2.JobSelection:
    return jobs_pb2.JobSelection(job_type=selection.job_type or "",
                                 states=[JOB_STATE.number(state) for state in sorted(selection.states)])


def bulk_outcome_from_pb(got: runs_pb2.ActOnRunsResponse | jobs_pb2.ActOnJobsResponse) -> BulkOutcome:
    stopped = got.stopped_because if isinstance(got, runs_pb2.ActOnRunsResponse) else ""
    return BulkOutcome(matched=got.matched, acted=got.acted, skipped=got.skipped, next_page_token=got.next_page_token,
                       stopped_because=stopped)
