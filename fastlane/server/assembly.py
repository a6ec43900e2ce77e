"""The builder: one node's parts, wired in dependency order, nothing running yet.

store -> workflow inbox -> dispatcher -> shard ownership -> fast lane -> (ownership listens to the
lane and dispatcher) -> operations -> workflow coordinator -> change follower -> servicers -> API
server (and console). Each part is given the parts it uses when it is made; the one edge that
points backwards (the dispatcher's journal puts retried runs back on the lane, which is built over
the dispatcher) is :class:`_LaneRetries`, pointed at the lane before :func:`build` returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from fastlane._proto import admin_pb2
from fastlane.auth.authenticator import Authenticator
from fastlane.auth.tls import ServerTls
from fastlane.domain.models import Run, ShardLease
from fastlane.engine.changes import ChangeFollower
from fastlane.engine.dispatch.dispatcher import Dispatcher
from fastlane.engine.lane import FastLane
from fastlane.engine.operations import Operations
from fastlane.engine.retention import HistoryTrimmer
from fastlane.engine.shards import ShardOwnership
from fastlane.engine.workflows import WorkflowCoordinator, WorkflowInbox
from fastlane.runtime.clock import Clock
from fastlane.runtime.metrics import Metrics
from fastlane.runtime.stalls import GcPauses, LoopLagProbe
from fastlane.server.access import AccessInterceptor
from fastlane.server.grpc_server import ApiServer
from fastlane.server.health import HealthReporter
from fastlane.server.quotas import QuotaGuard
from fastlane.server.servicers.admin import AdminServicer
from fastlane.server.servicers.jobs import JobServicer
from fastlane.server.servicers.runs import RunServicer
from fastlane.server.servicers.workers import WorkerServicer
from fastlane.server.servicers.workflows import WorkflowServicer
from fastlane.server.settings import Settings
from fastlane.storage import Store

if TYPE_CHECKING:
    from fastlane.console.activity import Activity
    from fastlane.console.server import ConsoleServer

# Workers heartbeat every in-flight attempt this often; leases are at least three times longer.
HEARTBEAT_INTERVAL = timedelta(seconds=1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Parts:
    """A node's parts, wired; what the start and stop plans (:mod:`.plans`) act on."""

    settings: Settings
    store: Store
    dispatcher: Dispatcher
    ownership: ShardOwnership
    lane: FastLane
    operations: Operations
    workflows: WorkflowCoordinator
    follower: ChangeFollower
    authenticator: Authenticator | None
    server: ApiServer
    health: HealthReporter
    probe: LoopLagProbe
    trimmer: HistoryTrimmer | None
    console: ConsoleServer | None
    activity: Activity | None
    stopping: asyncio.Event  # set when the node is asked to stop
    shards_ready: asyncio.Event  # set once this node holds its share with every window built


class ShardHandover:
    """What shard ownership tells of the shards it gains and loses: the lane and the dispatcher."""

    def __init__(self, lane: FastLane, dispatcher: Dispatcher, *, journal_wait: float) -> None:
        self._lane = lane
        self._dispatcher = dispatcher
        self._journal_wait = journal_wait

    async def acquired(self, leases: Sequence[ShardLease]) -> None:
        # The windows are built from the database: first let this node's own dispatches and
        # results land there. A node taking back shards it owned before an outage or a
        # failover has sent runs whose dispatch is still in its journal; read as still
        # scheduled, they would be delivered a second time.
        await self._dispatcher.journal_written(timeout=self._journal_wait)
        await self._lane.shards_acquired(leases)

    def lost(self, shard_ids: Sequence[int]) -> None:
        self._lane.shards_lost(shard_ids)
        self._dispatcher.drop_shards(shard_ids)


class _LaneRetries:
    """Where the dispatcher's journal puts back runs to try again: the lane, once it is built
    (before anything runs; nothing is put back before then)."""

    def __init__(self) -> None:
        self.lane: FastLane | None = None

    def schedule_run(self, run: Run) -> None:
        if self.lane is not None:
            self.lane.schedule_run(run)


class NodeReport:
    """This node as the admin API shows it."""

    def __init__(self, settings: Settings, *, ownership: ShardOwnership, dispatcher: Dispatcher, lane: FastLane,
                 ready: asyncio.Event) -> None:
        self._settings = settings
        self._ownership = ownership
        self._dispatcher = dispatcher
        self._lane = lane
        self._ready = ready

    def status(self) -> admin_pb2.NodeStatus:
        ownership, dispatcher = self._ownership, self._dispatcher
        return admin_pb2.NodeStatus(
            node_id=self._settings.node_id, address=self._settings.advertised_address,
            shards_owned=len(ownership.leases), workers_connected=dispatcher.workers_connected,
            clock_offset_ms=ownership.clock_offset.total_seconds() * 1000, heap_size=self._lane.size,
            ready_runs=dispatcher.ready_depth, ready=self._ready.is_set(), eligible=not ownership.note,
            note=ownership.note,
        )

    def workers(self) -> list[admin_pb2.WorkerStatus]:
        return [
            admin_pb2.WorkerStatus(worker_id=session.worker_id, tenant=session.tenant or "",
                                   job_types=sorted(session.job_types), credits=session.credits,
                                   in_flight=in_flight, node_id=self._settings.node_id)
            for session, in_flight in self._dispatcher.worker_sessions()
        ]


def build(settings: Settings, store: Store, *, clock: Clock, metrics: Metrics, ready: asyncio.Event,
          stopping: asyncio.Event) -> Parts:
    """Wire one node over ``store``; ``ready`` is the node's readiness (shown by the admin API),
    ``stopping`` is set when it is asked to stop. Nothing here reads or writes the store, so a
    node builds (and binds its API's ports) before it migrates.

    Raises:
        ConfigurationError: The API's or the health service's address cannot be listened on.
    """
    inbox = WorkflowInbox()  # the dispatcher hands it due runs of workflow jobs and step runs ended
    retries = _LaneRetries()
    dispatcher = Dispatcher(store, node_id=settings.node_id, clock=clock, metrics=metrics,
                            max_ready_per_type=settings.max_ready_per_type,
                            max_ready_bytes_per_type=settings.max_ready_bytes_per_type,
                            send_ahead=settings.send_ahead, tenant_weights=settings.tenant_weights,
                            tenant_max_in_flight=settings.tenant_max_in_flight,
                            priority_reserve=settings.priority_reserve,
                            reschedule=retries.schedule_run, workflows=inbox)
    ownership = ShardOwnership(
        store, node_id=settings.node_id, ttl=settings.shard_lease_ttl, metrics=metrics,
        address=settings.advertised_address, clock=clock, max_clock_offset=settings.max_clock_offset,
        workers=lambda: dispatcher.workers_connected,
    )
    lane = FastLane(store, settings=settings.lane, clock=clock, metrics=metrics, shards=ownership,
                    on_stale=ownership.lost, dispatch=dispatcher)
    retries.lane = lane
    ownership.listen(ShardHandover(lane, dispatcher, journal_wait=settings.shard_lease_ttl.total_seconds() / 3))
    operations = Operations(store, lane=lane, dispatcher=dispatcher)
    workflows = WorkflowCoordinator(store, inbox, events=operations, owned=ownership.owned)
    follower = ChangeFollower(store, operations=operations, ownership=ownership)

    report = NodeReport(settings, ownership=ownership, dispatcher=dispatcher, lane=lane, ready=ready)
    authenticator = Authenticator(store) if settings.auth else None
    quotas = QuotaGuard(store, settings.quotas)
    jobs = JobServicer(store, operations, max_payload=settings.max_payload_bytes, quotas=quotas,
                       hide_payloads=settings.hide_payloads)
    runs = RunServicer(store, operations, quotas=quotas, hide_payloads=settings.hide_payloads)
    workflow_api = WorkflowServicer(store, operations, max_payload=settings.max_payload_bytes, quotas=quotas,
                                    hide_payloads=settings.hide_payloads)
    admin = AdminServicer(store, report.status, settings.node_id, live_within=settings.shard_lease_ttl,
                          quotas=quotas, workers=report.workers)
    server = ApiServer(
        settings.listen,
        interceptors=[AccessInterceptor(authenticator)] if authenticator is not None else [],
        tls=_server_tls(settings),
        health_listen=settings.health_listen,
        max_payload_bytes=settings.max_payload_bytes,
        jobs=jobs,
        runs=runs,
        # Where one writer records results, those that wait the worker's window share its
        # writes, and fewer, fuller writes serve it better. A workflow step's result goes at
        # once on every backend (Assignment.awaited).
        workers=WorkerServicer(dispatcher, node_id=settings.node_id, heartbeat_interval=HEARTBEAT_INTERVAL,
                               prompt_results=store.capabilities.prompt_results),
        workflows=workflow_api,
        admin=admin,
    )
    console: ConsoleServer | None = None
    activity: Activity | None = None
    if settings.console_listen is not None:
        # Imported only for a node that serves it: aiohttp and Jinja2 add megabytes to a node.
        from fastlane.console import console_server

        tls_files = (settings.tls_cert, settings.tls_key) if settings.tls_cert and settings.tls_key else None
        # The console calls the same servicers, in process: the API's rules are its rules.
        services = {"JobService": jobs, "RunService": runs, "WorkflowService": workflow_api, "AdminService": admin}
        console, activity = console_server(settings.console_listen, services=services, authenticator=authenticator,
                                           metrics=metrics, node_id=settings.node_id, tls_files=tls_files)
    trimmer = None
    if settings.history_retention is not None:
        trimmer = HistoryTrimmer(store, retention=settings.history_retention, owned_shards=ownership.owned,
                                 metrics=metrics, stopping=stopping, batch_size=store.capabilities.trim_batch)
    return Parts(
        settings=settings, store=store, dispatcher=dispatcher, ownership=ownership, lane=lane,
        operations=operations, workflows=workflows, follower=follower, authenticator=authenticator,
        server=server, health=HealthReporter(server, ownership, store, metrics),
        # Measures the loop's own lag until the node stops (it never returns by itself).
        probe=LoopLagProbe(lag=metrics.loop_lag, stalls=metrics.loop_stalls, sites=metrics.loop_stall_sites,
                           gc_pauses=GcPauses(metrics.gc_pauses),
                           watchdog=True),
        trimmer=trimmer, console=console, activity=activity, stopping=stopping, shards_ready=asyncio.Event(),
    )


def _server_tls(settings: Settings) -> ServerTls | None:
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    return ServerTls(cert_file=settings.tls_cert, key_file=settings.tls_key, client_ca_file=settings.tls_client_ca)
