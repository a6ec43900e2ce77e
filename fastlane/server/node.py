"""The composition root: one node opens its store, builds its parts and runs its plans.

Start-up: build the parts (:mod:`.assembly`, which binds the API's ports: a node that cannot
listen fails before it touches its database), migrate (on SQLite taking the file for this node
alone), start the API (health NOT_SERVING) and the services of the start plan, acquire shards and
rebuild their window, then report SERVING.
Shutdown, on the first SIGTERM/SIGINT: walk the stop plan (:mod:`.plans`) — NOT_SERVING, stop
firing, make the dispatches durable, release the shards so a successor takes them at once, stop
the server, record and acknowledge the last results. A second signal exits immediately.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import time

from fastlane.auth.authenticator import Authenticator
from fastlane.domain.errors import StorageUnavailable
from fastlane.engine.shards import ShardOwnership
from fastlane.errors import FastlaneError
from fastlane.runtime.aio import first_of
from fastlane.runtime.clock import Clock, CorrectedClock
from fastlane.runtime.metrics import Metrics
from fastlane.runtime.supervise import Backoff, LoopGaveUp
from fastlane.server.assembly import Parts, build
from fastlane.server.plans import start_plan, stop_plan
from fastlane.server.services import Phase, Supervisor, walk
from fastlane.server.settings import Settings
from fastlane.storage import Store, open_store, redacted_url

log = logging.getLogger("fastlane.node")

GC_YOUNG_THRESHOLD = 50_000  # allocations between young-generation collections (default 700)
STARTUP_DATABASE_WAIT = 60.0  # seconds a starting node waits for an unreachable database
STARTUP_BACKOFF = Backoff(first=0.2, cap=5.0)


def _protection(settings: Settings) -> str:
    """How the API is protected, for the start-up line: an operator should see it at a glance."""
    transport = ("mutual TLS" if settings.tls_client_ca else "TLS") if settings.tls else "no TLS"
    if settings.auth:
        return f"API tokens required, {transport}"
    return (f"authentication OFF, {transport}: anyone who can reach this address acts for every tenant; "
            "for development only (--auth to require tokens)")


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
        # Opening the store reads and writes nothing: the node first binds its ports, so that one
        # that cannot listen fails before it makes, migrates or locks a database.
        store = open_store(settings.db_url, shard_count=settings.shard_count, lease_ttl=settings.shard_lease_ttl,
                           node=True)
        try:
            parts = build(settings, store, clock=self.clock, metrics=self.metrics, ready=self.ready,
                          stopping=self._stop)
            self.port = parts.server.port
            try:
                if settings.metrics_listen:
                    self.metrics.serve(settings.metrics_listen, names_in_clear=not settings.auth or settings.metrics_names,
                                       secret=settings.db_url.encode())
                    log.info("metrics on http://%s/metrics", settings.metrics_listen)
                try:
                    version = await self._migrate(store)
                except StorageUnavailable:
                    if not self._stop.is_set():
                        raise
                    log.info("node %s stopped before it could reach its database", settings.node_id)
                    return
                log.info("database %s at schema version %d", redacted_url(settings.db_url), version)
                shards = await store.shard_count()
                self.metrics.shard_count.set(shards)
                if shards != settings.shard_count:
                    # Fixed when the database was made (by the first node, migrate or tokens create):
                    # every node must agree, so the database's count wins over the flag.
                    log.warning("the database has %d shards: --shards %d is ignored (the count is fixed when the "
                                "database is created)", shards, settings.shard_count)
                await self._run_with(parts)
            finally:
                await parts.server.stop(0)
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

    def _gave_up(self, failure: LoopGaveUp) -> None:
        """A background loop cannot go on: neither can the node."""
        log.error("node %s cannot go on: %s; stopping", self.settings.node_id, failure)
        self._failure = self._failure or failure
        self._stop.set()

    async def _run_with(self, parts: Parts) -> None:
        """Start the API and the services of the start plan, report ready, and once asked to stop
        walk the stop plan (:mod:`.plans`)."""
        settings = self.settings
        self._ownership, self.authenticator = parts.ownership, parts.authenticator
        server, console = parts.server, parts.console
        self.port = server.port
        await server.start()
        log.info("node %s listening on %s (%s)", settings.node_id, settings.listen, _protection(settings))
        try:
            if console is not None:  # inside the try: a console that cannot listen stops the API too
                await console.start()
                self.console_url = console.url
                log.info("web console on %s", console.url)
            plan = start_plan(parts)
            async with asyncio.TaskGroup() as group:
                services = Supervisor(group, metrics=self.metrics, stop=self._stop, gave_up=self._gave_up)
                services.start(plan, Phase.START)
                await first_of(parts.shards_ready, self._stop)
                if not self._stop.is_set():
                    await server.set_ready(True)
                    self.ready.set()
                    log.info("node %s ready: %d shards, %d in window", settings.node_id, len(parts.ownership.leases),
                             parts.lane.size)
                services.start(plan, Phase.READY)
                await self._stop.wait()
                log.info("node %s stopping", settings.node_id)
                await walk(stop_plan(parts, services), node_id=settings.node_id)
        finally:
            if console is not None:
                await console.stop()
            await server.stop(0)  # before the store closes (run() stops it again on the way out, a no-op)
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
