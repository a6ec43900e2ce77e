"""The worker SDK: register async handlers by job type, connect to nodes, run what they assign.

Example::

    worker = Worker("node-1:7070")

    @worker.handler("email.send")
    async def send_email(ctx: RunContext) -> None:
        await deliver(ctx.json())

    asyncio.run(worker.run())

Each node pushes attempts over one stream, never more than the credits this worker granted, and
only for the shards it owns: so the worker keeps a stream to every live node of the cluster. The
addresses it is given are seeds: it asks them (``AdminService.GetCluster``) which nodes are live,
and keeps following as nodes join and leave. The stream plumbing (batching, heartbeats, reconnects,
handing work over from a stream that leaves) lives in :mod:`fastlane._worker_stream`.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import logging
import numbers
import os
import secrets
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import grpc
import orjson

from fastlane._proto import admin_pb2, admin_pb2_grpc
from fastlane._proto import workers_pb2 as pb
from fastlane._worker_stream import (
    CHANNEL_OPTIONS,
    NodeStream,
    RunSlot,
    Verdict,
    drain_streams,
    judge_attempt,
    retire_stream,
)
from fastlane.errors import ConfigurationError
from fastlane.models import MAX_CHECKPOINT_BYTES, AttemptOutcome

log = logging.getLogger("fastlane.worker")

Handler = Callable[["RunContext"], Awaitable[None]]
H = TypeVar("H", bound=Handler)

_DISCOVERY_TIMEOUT = 2.0  # per GetCluster call; a node that takes longer is skipped this round
_UNSPECIFIED_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})  # a listen address, not one to dial

@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """What a handler knows about the attempt it runs; one per attempt.

    Attributes:
        run_id: The run (one occurrence of a job); the same across its attempts.
        job_id: The job the run belongs to.
        job_type: The type this handler was registered for.
        tenant: The job's tenant.
        attempt: 1 for the first attempt, 2 for the first retry, and so on.
        payload: The job's payload bytes.
        scheduled_for: The instant the run was scheduled for (UTC).
        idempotency_key: Stable across attempts; use it to make side effects happen once.
        lease_token: Identifies this attempt; results of older attempts are ignored.
        checkpoint: The last checkpoint saved by an earlier attempt, if any.
        received_at: When this worker received the assignment (UTC).
        released_at: When the node's timer released the run, if it said.
    """

    run_id: str
    job_id: str
    job_type: str
    tenant: str
    attempt: int
    payload: bytes
    scheduled_for: datetime
    idempotency_key: str
    lease_token: int
    checkpoint: bytes | None
    received_at: datetime
    released_at: datetime | None
    _slot: RunSlot = field(repr=False, compare=False)

    def json(self) -> Any:
        """The payload parsed as JSON; ``None`` for an empty payload."""
        return orjson.loads(self.payload) if self.payload else None

    def report_progress(self, fraction: float) -> None:
        """Record progress (0 to 1); the next heartbeat carries it if it changed.

        Raises:
            ValueError: ``fraction`` is not a number between 0 and 1.
        """
        if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0.0 <= fraction <= 1.0:
            raise ValueError(f"progress must be a number from 0 to 1, got {fraction!r}")
        self._slot.set_progress(float(fraction))

    def save_checkpoint(self, data: bytes) -> None:
        """Record a checkpoint for a later attempt to resume from; the next heartbeat carries it.

        Raises:
            ValueError: ``data`` is not bytes, or is larger than ``MAX_CHECKPOINT_BYTES`` (1 MiB).
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ValueError(f"a checkpoint must be bytes, got {type(data).__name__}")
        if len(data) > MAX_CHECKPOINT_BYTES:
            raise ValueError(f"checkpoint of {len(data)} bytes is over the limit of {MAX_CHECKPOINT_BYTES}")
        self._slot.set_checkpoint(bytes(data))

    async def heartbeat(self) -> None:
        """Send a heartbeat for this run now, with any new progress and checkpoint."""
        await self._slot.heartbeat()


class Worker:
    """Runs handlers for the attempts that fastlane nodes assign to it.

    Args:
        servers: Node addresses (``host:port``), as a sequence or one comma-separated string. With
            ``follow_cluster``, these are seeds: the worker asks them for the cluster's live nodes
            and keeps one stream to each of those. Without, it keeps one stream to each given.
        worker_id: How nodes and run history name this worker; default ``host-pid-random``.
        concurrency: The most attempts each node stream may have in flight at once.
        drain_timeout: Seconds :meth:`stop` waits for running handlers and result acknowledgements.
        follow_cluster: Follow the cluster's membership: connect to nodes that join, and let the
            streams to nodes that leave finish their runs and go. If no node answers
            ``AdminService.GetCluster`` (an older daemon, or all down), the streams stay as they are.
        discovery_interval: Seconds between two membership checks.
    """

    def __init__(
        self,
        servers: str | Sequence[str] = "127.0.0.1:7070",
        *,
        worker_id: str | None = None,
        concurrency: int = 64,
        drain_timeout: float = 30.0,
        follow_cluster: bool = True,
        discovery_interval: float = 2.0,
    ) -> None:
        self._servers: list[str] = []
        self._concurrency = 0
        self._configure(servers, concurrency)
        if drain_timeout < 0:
            raise ConfigurationError(f"drain_timeout must not be negative, got {drain_timeout}")
        self._drain_timeout = drain_timeout
        if not discovery_interval > 0:
            raise ConfigurationError(f"discovery_interval must be positive (seconds), got {discovery_interval}")
        self._follow_cluster = follow_cluster
        self._discovery_interval = discovery_interval
        self._worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._handlers: dict[str, Handler] = {}
        self._streams: dict[str, NodeStream] = {}  # by address: the streams taking work
        self._serving: dict[NodeStream, asyncio.Task[None]] = {}  # every stream's serve() task
        self._retiring: dict[NodeStream, asyncio.Task[None]] = {}  # leaving streams: retire_stream()
        self._crashed: list[asyncio.Task[None]] = []
        self._crash = asyncio.Event()
        self._discovery_failing: bool | None = None  # for one log line per change, not per check
        self._unusable_addresses: set[str] = set()
        self._started = False
        self._stop_requested = asyncio.Event()
        self._finished = asyncio.Event()

    @property
    def worker_id(self) -> str:
        """The id sent to nodes in every Hello."""
        return self._worker_id

    @property
    def job_types(self) -> tuple[str, ...]:
        """The job types with a registered handler."""
        return tuple(self._handlers)

    @property
    def connected(self) -> bool:
        """Whether at least one node has welcomed this worker on its current stream."""
        return any(stream.connected for stream in self._serving)

    @property
    def node_addresses(self) -> tuple[str, ...]:
        """The addresses of the nodes this worker takes work from now (leaving streams excluded)."""
        return tuple(self._streams)

    def handler(self, job_type: str) -> Callable[[H], H]:
        """Register the decorated ``async def fn(ctx: RunContext) -> None`` for ``job_type``.

        Returning means success. Raising :class:`~fastlane.errors.PermanentError` fails the run for
        good; any other exception fails this attempt, and the job's retry policy decides the rest.

        Raises:
            ConfigurationError: The type is empty or already has a handler, or the worker runs.
            TypeError: The function is not ``async def``.
        """
        if not job_type:
            raise ConfigurationError("a handler's job type must be a non-empty string")

        def register(fn: H) -> H:
            if not _is_async(fn):
                raise TypeError(f"the handler for {job_type!r} must be an async function (async def), got {fn!r}")
            if job_type in self._handlers:
                raise ConfigurationError(
                    f"job type {job_type!r} already has a handler ({self._handlers[job_type]!r}); "
                    "register each job type once"
                )
            if self._started:
                raise ConfigurationError("register handlers before Worker.run(): nodes learn job types at connect")
            self._handlers[job_type] = fn
            return fn

        return register

    async def run(self) -> None:
        """Connect to the nodes and run assigned attempts until :meth:`stop`, then drain.

        With ``follow_cluster``, streams come and go with the cluster's live members while this runs.

        Raises:
            ConfigurationError: No handler is registered.
            RuntimeError: ``run`` was called before.
        """
        if self._started:
            raise RuntimeError("Worker.run() may be called only once per Worker")
        self._started = True
        try:
            if self._stop_requested.is_set():
                return
            if not self._handlers:
                raise ConfigurationError("no handlers: register one with @worker.handler(job_type) first")
            for address in self._servers:
                self._add_stream(address)
            following: asyncio.Task[None] | None = None
            if self._follow_cluster:
                log.info("following the cluster's membership from %s (every %g s)",
                         ", ".join(self._servers), self._discovery_interval)
                following = asyncio.create_task(self._follow_membership(), name="worker-membership")
            try:
                await self._serve_until_stopped(following)
                if following is not None:
                    following.cancel()  # no stream comes or goes while the rest drain
                    await asyncio.gather(following, return_exceptions=True)
                await drain_streams(list(self._streams.values()), list(self._serving.values()),
                                    self._drain_timeout, dict(self._retiring))
            finally:
                await self._tear_down(following)
        finally:
            self._finished.set()

    async def stop(self) -> None:
        """Stop gracefully: take no new work, let running handlers finish, report, disconnect.

        Waits until :meth:`run` returns. Safe to call twice, or before ``run`` (which then returns at
        once). Do not await it from a handler: the drain would wait for that handler.
        """
        self._stop_requested.set()
        if self._started:
            await self._finished.wait()

    # -- lifecycle -------------------------------------------------------------------------

    async def _serve_until_stopped(self, following: asyncio.Task[None] | None) -> None:
        stop_wait = asyncio.create_task(self._stop_requested.wait(), name="worker-stop-wait")
        crash_wait = asyncio.create_task(self._crash.wait(), name="worker-crash-wait")
        watched = [stop_wait, crash_wait, *([following] if following is not None else [])]
        try:
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_wait.cancel()
            crash_wait.cancel()
        # Following the membership ends by itself only at a stop; any other ending is a crash.
        ended = self._crashed[:1] or [t for t in done if t is following and not self._stop_requested.is_set()]
        for task in ended:
            task.result()  # these loops only end early by crashing: surface it
            raise RuntimeError(f"worker task {task.get_name()} ended unexpectedly")

    async def _tear_down(self, following: asyncio.Task[None] | None) -> None:
        handlers = [task for stream in self._serving for task in stream.abort()]
        tasks = [*self._serving.values(), *self._retiring.values(), *([following] if following else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, *handlers, return_exceptions=True)

    def _task_ended(self, task: asyncio.Task[None], *, expected: bool) -> None:
        if task.cancelled() or (expected and task.exception() is None):
            return
        self._crashed.append(task)
        self._crash.set()

    # -- node streams ----------------------------------------------------------------------

    def _add_stream(self, address: str) -> None:
        stream = NodeStream(address, worker_id=self._worker_id, job_types=self.job_types,
                            concurrency=self._concurrency, launch=self._run_attempt)
        serving = asyncio.create_task(stream.serve(), name=f"worker-stream:{address}")
        # serve() returns only once the stream was closed on purpose; ending otherwise is a crash.
        serving.add_done_callback(lambda task: self._task_ended(task, expected=stream.closing))
        self._streams[address] = stream
        self._serving[stream] = serving

    def _retire_stream(self, address: str) -> None:
        stream = self._streams.pop(address)
        retiring = asyncio.create_task(
            retire_stream(stream, self._serving[stream], functools.partial(self._successor, stream)),
            name=f"worker-retire:{address}",
        )
        self._retiring[stream] = retiring
        retiring.add_done_callback(functools.partial(self._retired, stream))

    def _retired(self, stream: NodeStream, task: asyncio.Task[None]) -> None:
        self._retiring.pop(stream, None)
        if not task.cancelled() and task.exception() is None:
            self._serving.pop(stream, None)
            log.info("stream to %s closed", stream.address)
        self._task_ended(task, expected=True)

    def _successor(self, leaving: NodeStream) -> NodeStream | None:
        """The stream that takes over the work of a leaving one whose node is gone: a connected
        one if there is any."""
        candidates = [s for s in self._streams.values() if s is not leaving and not s.closing]
        return next((s for s in candidates if s.connected), candidates[0] if candidates else None)

    # -- cluster membership ----------------------------------------------------------------

    async def _follow_membership(self) -> None:
        stubs: dict[str, tuple[grpc.aio.Channel, admin_pb2_grpc.AdminServiceStub]] = {}
        try:
            while True:
                nodes = await self._ask_cluster(stubs)
                if nodes is None:
                    self._fall_back_to_seeds()
                else:
                    self._follow(nodes)
                with suppress(TimeoutError):
                    async with asyncio.timeout(self._discovery_interval):
                        await self._stop_requested.wait()
                        return
        finally:
            await asyncio.gather(*(channel.close() for channel, _ in stubs.values()), return_exceptions=True)

    async def _ask_cluster(
        self, stubs: dict[str, tuple[grpc.aio.Channel, admin_pb2_grpc.AdminServiceStub]]
    ) -> list[admin_pb2.NodeStatus] | None:
        """The cluster's nodes, from the first seed or known node that answers; None if none does."""
        candidates = list(dict.fromkeys([*self._servers, *self._streams]))
        for address in stubs.keys() - set(candidates):
            await stubs.pop(address)[0].close()
        failures: list[str] = []
        for address in candidates:
            if address not in stubs:
                channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
                stubs[address] = (channel, admin_pb2_grpc.AdminServiceStub(channel))
            try:
                status = await stubs[address][1].GetCluster(admin_pb2.GetClusterRequest(), timeout=_DISCOVERY_TIMEOUT)
            except grpc.aio.AioRpcError as error:
                failures.append(f"{address}: {error.code().name}")
                continue
            except Exception as error:  # one odd answer must not end the worker; the next check retries
                failures.append(f"{address}: {type(error).__name__}: {error}")
                continue
            if self._discovery_failing:
                log.info("cluster membership known again (from %s)", address)
            self._discovery_failing = False
            return list(status.nodes)
        if not self._discovery_failing:
            # Once per outage: an older daemon without GetCluster answers UNIMPLEMENTED every time.
            log.info("no node reports the cluster's membership (%s): keeping the streams to %s",
                     "; ".join(failures), ", ".join(self._streams))
        self._discovery_failing = True
        return None

    def _follow(self, nodes: Sequence[admin_pb2.NodeStatus]) -> None:
        live: dict[str, str] = {}  # address: node id
        for node in nodes:
            if node.live and self._usable(node):
                live.setdefault(node.address, node.node_id)
        if not live:
            self._fall_back_to_seeds()  # a cluster still starting: its nodes have not heartbeaten
            return
        # Add before removing, so a leaving stream whose node is gone has a stream to hand over to.
        for address, node_id in live.items():
            if address not in self._streams:
                log.info("node %s at %s is live: adding a stream to it", node_id, address)
                self._add_stream(address)
        # A stream that works, or may yet (to a seed spelled otherwise than the node advertises
        # itself, say), stays until one to a listed node works: listed addresses the worker cannot
        # reach must not leave it with no work at all.
        anchored = any(self._streams[address].connected for address in live)
        for address in [address for address in self._streams if address not in live]:
            stream = self._streams[address]
            if not anchored and not stream.down:
                continue
            log.info("%s is not a live cluster member: removing its stream (%d runs in flight finish first)",
                     address, stream.in_flight)
            self._retire_stream(address)

    def _usable(self, node: admin_pb2.NodeStatus) -> bool:
        if not node.address:
            return False  # not known yet
        host = node.address.rpartition(":")[0]
        if host not in _UNSPECIFIED_HOSTS:
            return True
        if node.address not in self._unusable_addresses:
            self._unusable_addresses.add(node.address)
            log.warning("node %s advertises %r, which a worker cannot dial: start it with --advertise HOST:PORT",
                        node.node_id, node.address)
        return False

    def _fall_back_to_seeds(self) -> None:
        """Without a usable answer, keep every stream; add the seeds back if no stream is up."""
        if any(stream.connected for stream in self._streams.values()):
            return
        for address in self._servers:
            if address not in self._streams:
                log.info("no live node is known and no stream is up: adding a stream to seed %s", address)
                self._add_stream(address)

    # -- one attempt -----------------------------------------------------------------------

    async def _run_attempt(self, slot: RunSlot, assignment: pb.Assignment, received_at: datetime) -> None:
        ctx = _context(slot, assignment, received_at)
        timeout = assignment.timeout.ToTimedelta().total_seconds() if assignment.HasField("timeout") else None
        started_at = datetime.now(UTC)
        handler = self._handlers.get(assignment.job_type)
        if handler is None:
            verdict = Verdict(AttemptOutcome.FAILED, "UnknownJobType", f"no handler here for {ctx.job_type!r}")
        else:
            verdict = await judge_attempt(functools.partial(handler, ctx), slot, timeout or None)
        slot.stream.finish(slot, verdict.result(slot, started_at, datetime.now(UTC)))

    def _configure(self, servers: str | Sequence[str] | None, concurrency: int | None) -> None:
        # Also called by run_worker_cli, after __init__: the command line's servers and concurrency win.
        if servers:
            parts = [servers] if isinstance(servers, str) else servers
            # "a:1,b:2" works wherever a list does ($FASTLANE_SERVER, say).
            addresses = [a.strip() for part in parts for a in part.split(",") if a.strip()]
            if not addresses:
                raise ConfigurationError("a worker needs at least one server address (host:port)")
            self._servers = list(dict.fromkeys(addresses))
        elif not self._servers:
            raise ConfigurationError("a worker needs at least one server address (host:port)")
        if concurrency is not None:
            if concurrency < 1:
                raise ConfigurationError(f"concurrency must be at least 1, got {concurrency}")
            self._concurrency = concurrency


def _is_async(fn: object) -> bool:
    # An object whose __call__ is async (a class-based handler) is as good as an async function.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def _context(slot: RunSlot, a: pb.Assignment, received_at: datetime) -> RunContext:
    return RunContext(
        run_id=a.run_id, job_id=a.job_id, job_type=a.job_type, tenant=a.tenant, attempt=a.attempt,
        payload=a.payload, scheduled_for=a.scheduled_for.ToDatetime(tzinfo=UTC),
        idempotency_key=a.idempotency_key, lease_token=a.lease_token,
        checkpoint=a.checkpoint if a.HasField("checkpoint") else None, received_at=received_at,
        released_at=a.released_at.ToDatetime(tzinfo=UTC) if a.HasField("released_at") else None,
        _slot=slot,
    )


# -- command line ------------------------------------------------------------------------------


def run_worker_cli(target: str, servers: Sequence[str], concurrency: int | None) -> int:
    """Run the worker named by ``target`` until SIGTERM or SIGINT; return the exit code.

    The first signal stops gracefully (drain); a second one exits at once.

    Args:
        target: ``"package.module:attribute"``, a :class:`Worker` or a zero-argument callable
            returning one.
        servers: Node addresses replacing the worker's own, if any are given.
        concurrency: Replaces the worker's concurrency if given.

    Returns:
        0 after a graceful stop, 1 after a forced exit, 2 if the target is unusable.
    """
    try:
        worker = _load_worker(target)
        worker._configure(servers, concurrency)
        if not worker.job_types:
            raise ConfigurationError(f"{target!r} has no handlers: register one with @worker.handler(job_type)")
    except ConfigurationError as exc:
        print(f"fastlane worker: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop
    except ImportError:
        loop_factory = None
    else:
        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(_run_until_signalled(worker))


async def _run_until_signalled(worker: Worker) -> int:
    loop = asyncio.get_running_loop()
    running = asyncio.create_task(worker.run(), name="worker-run")
    stopping: list[asyncio.Task[None]] = []

    def on_signal(signum: signal.Signals) -> None:
        if not stopping:
            log.info("%s received: stopping gracefully (send it again to exit at once)", signum.name)
            stopping.append(loop.create_task(worker.stop(), name="worker-graceful-stop"))
        else:
            log.warning("%s received again: exiting at once", signum.name)
            running.cancel()

    signals = (signal.SIGTERM, signal.SIGINT)
    for signum in signals:
        with suppress(NotImplementedError):  # platforms without loop signal handlers
            loop.add_signal_handler(signum, on_signal, signum)
    try:
        await running
        return 0
    except asyncio.CancelledError:
        if running.cancelled() and len(stopping) == 1:
            return 1
        raise
    finally:
        for signum in signals:
            with suppress(NotImplementedError):
                loop.remove_signal_handler(signum)
        for task in stopping:
            task.cancel()


def _load_worker(target: str) -> Worker:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"worker target {target!r} must look like 'package.module:attribute'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would, so a worker module beside you imports
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as exc:  # whatever breaks the import, report it the same way
        raise ConfigurationError(f"cannot import {module_name!r} for {target!r}: {type(exc).__name__}: {exc}") from exc
    for name in attribute.split("."):
        try:
            found = getattr(found, name)
        except AttributeError:
            raise ConfigurationError(f"{module_name!r} has no attribute {attribute!r} (from {target!r})") from None
    if not isinstance(found, Worker) and callable(found):
        try:
            found = found()
        except Exception as exc:  # a failing factory is an unusable target too
            raise ConfigurationError(f"{target!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(found, Worker):
        kind = type(found).__name__
        raise ConfigurationError(f"{target!r} is a {kind}, not a fastlane Worker (or a function returning one)")
    return found
