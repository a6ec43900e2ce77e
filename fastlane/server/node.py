"""The composition root: one node wires storage, shard ownership, fast lane, dispatcher and API.

Start-up: migrate, start the API (health NOT_SERVING), acquire shards and rebuild their window,
then report SERVING. Shutdown, on the first SIGTERM/SIGINT: NOT_SERVING, stop firing, make
in-flight results durable and acknowledge them, stop the server, release the shards so a
successor takes them at once. A second signal exits immediately.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from fastlane._proto import admin_pb2
from fastlane.auth.authenticator import Authenticator
from fastlane.auth.tls import ServerTls
from fastlane.domain.errors import StorageUnavailable
from fastlane.domain.models import Run, ShardLease
from fastlane.engine.changes import ChangeFollower
from fastlane.engine.dispatch.dispatcher import Dispatcher
from fastlane.engine.lane import FastLane
from fastlane.engine.operations import Operations
from fastlane.engine.retention import LOOP_NAME as TRIM_LOOP
from fastlane.engine.retention import HistoryTrimmer
from fastlane.engine.shards import ShardOwnership
from fastlane.engine.workflows import WorkflowCoordinator
from fastlane.errors import FastlaneError
from fastlane.runtime.aio import first_of
from fastlane.runtime.clock import Clock, CorrectedClock
from fastlane.runtime.metrics import Metrics
from fastlane.runtime.stalls import GcPauses, LoopLagProbe
from fastlane.runtime.supervise import Backoff, LoopGaveUp, supervised
from fastlane.server.access import AccessInterceptor
from fastlane.server.grpc_server import ApiServer
from fastlane.server.quotas import QuotaGuard
from fastlane.server.servicers.admin import AdminServicer
from fastlane.server.servicers.jobs import JobServicer
from fastlane.server.servicers.runs import RunServicer
from fastlane.server.servicers.workers import WorkerServicer
from fastlane.server.servicers.workflows import WorkflowServicer
from fastlane.server.settings import Settings
from fastlane.storage import Store, open_store, redacted_url

if TYPE_CHECKING:
    from fastlane.console.server import ConsoleServer

log = logging.getLogger("fastlane.node")


def _protection(settings: Settings) -> str:
    """How the API is protected, for the start-up line: an operator should see it at a glance."""
    transport = ("mutual TLS" if settings.tls_client_ca else "TLS") if settings.tls else "no TLS"
    if settings.auth:
        return f"API tokens required, {transport}"
    return (f"authentication OFF, {transport}: anyone who can reach this address acts for every tenant; "
            "for development only (--auth to require tokens)")

# Workers heartbeat every in-flight attempt this often; leases are at least three times longer.
HEARTBEAT_INTERVAL = timedelta(seconds=1)
DRAIN_TIMEOUT = 5.0
SERVER_GRACE = 2.0
GC_YOUNG_THRESHOLD = 50_000  # allocations between young-generation collections (default 700)
STARTUP_DATABASE_WAIT = 60.0  # seconds a starting node waits for an unreachable database
STARTUP_BACKOFF = Backoff(first=0.2, cap=5.0)


class Node:
    """One fastlane daemon process."""

    def __init__(self, settings: Settings, *, clock: Clock | None = None) -> None:
        self.settings = settings
        # By default the node fires on its wall clock corrected to the database's (measured each
        # lease cycle), so every node fires on the same instant, and a step of the wall clock is
        # taken back at once (see CorrectedClock).
        self.clock = clock or CorrectedClock(on_step=self._clock_stepped)
        self.metrics = Metrics()
        self._ownership: ShardOwnership | None = None
        self.ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._failure: FastlaneError | None = None  # why the node could not go on, if it could not
        self.port: int | None = None
        self.authenticator: Authenticator | None = None  # with --auth, once running
        self.console_url: str | None = None  # with --console, once listening

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Run until :meth:`request_stop`.

        Raises:
            FastlaneError: The node cannot go on (its database stayed unreachable at start-up,
                or a background loop kept failing); it has stopped and says why.
        """
        settings = self.settings
        store = open_store(settings.db_url, shard_count=settings.shard_count, lease_ttl=settings.shard_lease_ttl)
        try:
            version = await self._migrate(store)
            log.info("database %s at schema version %d", redacted_url(settings.db_url), version)
            shards = await store.shard_count()
            self.metrics.shard_count.set(shards)
            if shards != settings.shard_count:
                # Fixed when the database was made (by the first node, migrate or tokens create):
                # every node must agree, so the database's count wins over the flag.
                log.warning("the database has %d shards: --shards %d is ignored (the count is fixed when the "
                            "database is created)", shards, settings.shard_count)
            await self._run_with(store)
        finally:
            await store.close()
        if self._failure is not None:
            raise self._failure

    async def _migrate(self, store: Store) -> int:
        """Migrate, waiting a while for a database that cannot be reached yet: a node and its
        database are often started together."""
        deadline = time.monotonic() + STARTUP_DATABASE_WAIT
        failures = 0
        while True:
            try:
                return await store.migrate()
            except StorageUnavailable as error:
                failures += 1
                delay = STARTUP_BACKOFF.delay(failures)
                if time.monotonic() + delay > deadline or self._stop.is_set():
                    raise
                log.warning("cannot reach the database yet (%s); trying again in %.1f s", error, delay)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._stop.wait()

    def _clock_stepped(self, jump_ns: int) -> None:
        """The wall clock jumped: the corrected clock took it back; count it, say so, and
        measure the offset to the database again now rather than at the next lease cycle."""
        self.metrics.clock_steps.inc()
        log.warning("the wall clock stepped %+.1f ms against the monotonic clock: firing on the clock as it was, "
                    "measuring the offset to the database again", jump_ns / 1e6)
        if self._ownership is not None:
            self._ownership.wake()

    async def _report_health(self, server: ApiServer, ownership: ShardOwnership, store: Store) -> None:
        """Readiness follows the database: a node that cannot reach it (so cannot renew its
        leases, and fires nothing) says NOT_SERVING until it can again; so does one whose
        SQLite file cannot be written (a full disk, a read-only file), at once and with one
        ERROR line naming the cause. Restartable: it says the current state first."""
        faults = store if store.capabilities.write_faults else None
        fault = faults.write_fault if faults is not None else None
        reachable = ownership.healthy
        await self._set_health(server, reachable=reachable, fault=fault)
        while True:
            waits = [asyncio.create_task(ownership.health_changed(reachable), name="health-leases")]
            if faults is not None:
                waits.append(asyncio.create_task(faults.write_fault_changed(fault), name="health-writes"))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
            was_serving = reachable and fault is None
            new_fault = faults.write_fault if faults is not None else None
            if new_fault != fault:
                if new_fault is not None:
                    log.error("the database cannot be written: %s; not serving meanwhile", new_fault)
                else:
                    log.info("the database can be written again")
                fault = new_fault
            if ownership.healthy != reachable:
                reachable = ownership.healthy
                if not reachable:
                    log.warning("cannot reach the database: not serving")
            serving = reachable and fault is None
            if serving and not was_serving:
                log.info("database reachable and writable again: serving")
            await self._set_health(server, reachable=reachable, fault=fault)

    async def _set_health(self, server: ApiServer, *, reachable: bool, fault: str | None) -> None:
        self.metrics.database_writable.set(fault is None)
        await server.set_ready(reachable and fault is None)

    async def _supervise(self, name: str, make_loop: Callable[[], Awaitable[None]], until: asyncio.Event) -> None:
        """Run a background loop under supervision; if it cannot go on, neither can the node."""
        try:
            await supervised(name, make_loop, metrics=self.metrics, stop=until)
        except LoopGaveUp as failure:
            log.error("node %s cannot go on: %s; stopping", self.settings.node_id, failure)
            self._failure = self._failure or failure
            self._stop.set()

    def _server_tls(self) -> ServerTls | None:
        settings = self.settings
        if settings.tls_cert is None or settings.tls_key is None:
            return None
        return ServerTls(cert_file=settings.tls_cert, key_file=settings.tls_key, client_ca_file=settings.tls_client_ca)

    async def _run_with(self, store: Store) -> None:
        settings, metrics = self.settings, self.metrics
        lane: FastLane | None = None

        def reschedule(run: Run) -> None:
            if lane is not None:
                lane.schedule_run(run)

        # Dispatch hands it due runs of workflow jobs and hears of step runs ending; it acts on
        # them through the operations and the shard ownership, bound once those exist.
        workflows = WorkflowCoordinator(store)
        dispatcher = Dispatcher(store, node_id=settings.node_id, clock=self.clock, metrics=metrics,
                                max_ready_per_type=settings.max_ready_per_type,
                                max_ready_bytes_per_type=settings.max_ready_bytes_per_type,
                                send_ahead=settings.send_ahead, tenant_weights=settings.tenant_weights,
                                tenant_max_in_flight=settings.tenant_max_in_flight,
                                priority_reserve=settings.priority_reserve,
                                reschedule=reschedule, workflows=workflows)

        def shards_lost(shard_ids: Sequence[int]) -> None:
            if lane is not None:
                lane.shards_lost(shard_ids)
            dispatcher.drop_shards(shard_ids)

        async def shards_acquired(leases: Sequence[ShardLease]) -> None:
            # The windows are built from the database: first let this node's own dispatches and
            # results land there. A node taking back shards it held before an outage or a
            # failover has sent runs whose dispatch is still in its journal; read as still
            # scheduled, they would be delivered a second time.
            await dispatcher.journal_written(timeout=settings.shard_lease_ttl.total_seconds() / 3)
            if lane is not None:
                await lane.shards_acquired(leases)

        ownership = ShardOwnership(
            store, node_id=settings.node_id, ttl=settings.shard_lease_ttl, metrics=metrics,
            on_acquired=shards_acquired, on_lost=shards_lost, address=settings.advertised_address, clock=self.clock,
            max_clock_offset=settings.max_clock_offset, workers=lambda: dispatcher.workers_connected,
        )
        self._ownership = ownership
        lane = FastLane(store, settings=settings, clock=self.clock, metrics=metrics, shards=ownership,
                        on_stale=ownership.lost, dispatch=dispatcher)

        operations = Operations(store, lane=lane, dispatcher=dispatcher)
        workflows.bind(events=operations, owned=ownership.owned)
        follower = ChangeFollower(store, operations=operations, ownership=ownership)

        def node_status() -> admin_pb2.NodeStatus:
            return admin_pb2.NodeStatus(
                node_id=settings.node_id, address=settings.advertised_address,
                shards_owned=len(ownership.leases), workers_connected=dispatcher.workers_connected,
                clock_offset_ms=ownership.clock_offset.total_seconds() * 1000, heap_size=lane.size,
                ready_runs=dispatcher.ready_depth, ready=self.ready.is_set(), eligible=not ownership.note,
                note=ownership.note,
            )

        def worker_statuses() -> list[admin_pb2.WorkerStatus]:
            return [
                admin_pb2.WorkerStatus(worker_id=session.worker_id, tenant=session.tenant or "",
                                       job_types=sorted(session.job_types), credits=session.credits,
                                       in_flight=held, node_id=settings.node_id)
                for session, held in dispatcher.worker_sessions()
            ]

        authenticator = self.authenticator = Authenticator(store) if settings.auth else None
        quotas = QuotaGuard(store, settings.quotas)
        jobs = JobServicer(store, operations, max_payload=settings.max_payload_bytes, quotas=quotas)
        runs = RunServicer(store, operations, quotas=quotas)
        workflow_api = WorkflowServicer(store, operations, max_payload=settings.max_payload_bytes, quotas=quotas)
        admin = AdminServicer(store, node_status, settings.node_id, live_within=settings.shard_lease_ttl,
                              quotas=quotas, workers=worker_statuses)
        server = ApiServer(
            settings.listen,
            interceptors=[AccessInterceptor(authenticator)] if authenticator is not None else [],
            tls=self._server_tls(),
            health_listen=settings.health_listen,
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
        if settings.console_listen is not None:
            # Imported only for a node that serves it: aiohttp and Jinja2 add about 12 MB to a node.
            from fastlane.console import console_server

            tls_files = (settings.tls_cert, settings.tls_key) if settings.tls_cert and settings.tls_key else None
            # The console calls the same servicers, in process: the API's rules are its rules.
            services = {"JobService": jobs, "RunService": runs, "WorkflowService": workflow_api, "AdminService": admin}
            console, activity = console_server(settings.console_listen, services=services, authenticator=authenticator,
                                               metrics=metrics, node_id=settings.node_id, tls_files=tls_files)
        self.port = server.port
        if settings.metrics_listen:
            metrics.serve(settings.metrics_listen)
        await server.start()
        log.info("node %s listening on %s (%s)", settings.node_id, settings.listen, _protection(settings))
        shards_ready = asyncio.Event()
        # The journal is restarted while it has results to record, even while stopping: it
        # returns once drained. Only a drain that cannot finish in time is abandoned.
        journal_abandoned = asyncio.Event()
        try:
            if console is not None:  # inside the try: a console that cannot listen stops the API too
                await console.start()
                self.console_url = console.url
                log.info("web console on %s", console.url)
            async with asyncio.TaskGroup() as group:

                def supervise(
                    name: str, make_loop: Callable[[], Awaitable[None]], until: asyncio.Event = self._stop
                ) -> asyncio.Task[None]:
                    return group.create_task(self._supervise(name, make_loop, until), name=name)

                supervise("shard-ownership", lambda: ownership.run(shards_ready))
                supervise("fast-lane", lane.run)
                if authenticator is not None:
                    supervise("token-use", lambda: authenticator.run(self._stop))
                if console is not None:
                    supervise("console-activity", lambda: activity.run(self._stop))
                # Measures the loop's own lag until the node stops (it never returns by itself).
                probe = LoopLagProbe(lag=metrics.loop_lag, stalls=metrics.loop_stalls,
                                     gc_pauses=GcPauses(metrics.gc_pauses), watchdog=True)
                probing = supervise("loop-probe", probe.run)
                journal = supervise("dispatch-journal", dispatcher.run, until=journal_abandoned)
                watcher = supervise("change-listener", lambda: store.watch_changes(follower.enqueue))
                following = supervise("change-follower", follower.run)
                advancing = supervise("workflows", workflows.run)
                if settings.history_retention is not None:
                    trimmer = HistoryTrimmer(store, retention=settings.history_retention, owned_shards=ownership.owned,
                                             metrics=metrics, stopping=self._stop,
                                             batch_size=store.capabilities.trim_batch)
                    supervise(TRIM_LOOP, trimmer.run)
                await first_of(shards_ready, self._stop)
                if not self._stop.is_set():
                    await server.set_ready(True)
                    self.ready.set()
                    log.info("node %s ready: %d shards, %d in window", settings.node_id, len(ownership.leases), lane.size)
                health = supervise("health", lambda: self._report_health(server, ownership, store))
                await self._stop.wait()
                health.cancel()
                probing.cancel()
                log.info("node %s stopping", settings.node_id)
                # Not ready, stop firing, send nothing new, make the dispatches durable, hand the
                # shards over; then drain results while the streams are still open.
                await server.set_ready(False)
                lane.stop()
                dispatcher.stop_assigning()
                await dispatcher.flush(DRAIN_TIMEOUT)
                # Every dispatch is durable and nothing more fires here: successors may take the
                # shards now, while this node still records and acknowledges late results.
                await ownership.stop()
                await server.stop(SERVER_GRACE)
                dispatcher.stop()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(DRAIN_TIMEOUT):
                        await asyncio.shield(journal)
                if not journal.done():
                    # The database is out of reach: the unrecorded results are lost here, and
                    # their runs go to another attempt when their leases expire.
                    log.warning("node %s could not record every result within %.0f s", settings.node_id, DRAIN_TIMEOUT)
                    journal_abandoned.set()
                    journal.cancel()
                watcher.cancel()
                following.cancel()
                advancing.cancel()
        finally:
            if console is not None:
                await console.stop()
            await server.stop(0)
        log.info("node %s stopped", settings.node_id)


def serve(settings: Settings, *, log_format: str | None = None) -> int:
    """Run a node in this process until SIGTERM/SIGINT; the exit code of the daemon. ``log_format``:
    ``json`` or ``text`` (None: as :func:`fastlane.runtime.logs.configure` decides)."""
    from fastlane.runtime import logs

    logs.configure(os.environ.get("FASTLANE_LOG_LEVEL", "INFO"), json=None if log_format is None else log_format == "json")
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    # A node holds up to hundreds of thousands of long-lived objects (the window, runs waiting
    # for their time) that form no cycles. With the default thresholds the cyclic collector
    # rescans them again and again under load; freezing what start-up made and collecting the
    # young generation less often keeps those pauses off the timer.
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 50)
    return asyncio.run(_serve(settings))


async def _serve(settings: Settings) -> int:
    node = Node(settings)
    loop = asyncio.get_running_loop()
    signals_seen = 0

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:
            log.warning("second signal: exiting at once")
            os._exit(1)
        log.info("received %s: shutting down gracefully", signal.Signals(signum).name)
        node.request_stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await node.run()
    except FastlaneError as error:
        log.error("node cannot run: %s", error)
        return 1
    except Exception:  # an ExceptionGroup from the task group lands here too
        log.exception("node crashed")
        return 1
    return 0
