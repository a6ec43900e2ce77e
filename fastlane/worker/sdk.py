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
and keeps following as nodes join and leave. Behind this module: :mod:`fastlane.worker._membership`
(the set of streams, following the cluster), :mod:`fastlane.worker._stream` (one stream: hello,
heartbeats, clock probes, reconnects), :mod:`fastlane.worker._clock` (estimating a node's clock),
:mod:`fastlane.worker._runs` (running handlers, buffering their results), :mod:`fastlane.worker._hold`
(starting runs sent ahead on their instant) and :mod:`fastlane.worker._cli` (``fastlane worker``).

A node may send a run ahead of its time, with the instant to start it: the worker then holds it
(in flight, but with no handler running yet) and starts the handler on that instant, translated to
its own clock with the estimate of the node's clock it keeps from probe round trips
(:meth:`Worker.clock_estimates`).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import numbers
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import grpc
import orjson

from fastlane._proto import workers_pb2 as pb
from fastlane.auth.tls import ClientTls
from fastlane.domain.limits import MAX_CHECKPOINT_BYTES
from fastlane.domain.workflows import MAX_OUTPUT_BYTES
from fastlane.errors import ConfigurationError
from fastlane.rpc import wire
from fastlane.rpc.channel import load_token, open_channel
from fastlane.worker._clock import ClockEstimate
from fastlane.worker._hold import StartTimer
from fastlane.worker._membership import ClusterStreams
from fastlane.worker._metrics import WorkerMetrics
from fastlane.worker._realtime import MAX_PRIORITY, RealtimeGrant, request_realtime
from fastlane.worker._runs import RunSlot, run_attempt
from fastlane.worker._slice import MAX_SLICE, MIN_SLICE, request_cpu_slice
from fastlane.worker._stream import CHANNEL_OPTIONS, NodeStream

log = logging.getLogger("fastlane.worker")

Handler = Callable[["RunContext"], Awaitable[Any]]
"""An async function that runs one attempt of a run, given its :class:`RunContext`. What it
returns (JSON-serialisable, up to 16 KiB), if not None, is the step's output in a workflow: the
steps after it receive it in their payload's ``parents``."""
H = TypeVar("H", bound=Handler)


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
        started_at: When this worker started the handler (UTC): on receipt, or, for a run the node
            sent ahead of its time, on the instant the node asked for (translated to this
            worker's clock), however early it arrived. The result reports this start.
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
    started_at: datetime
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


# Short enough to preempt a busy neighbour at once on waking (the kernel's default slice is a
# millisecond or more), long enough to stay above the kernel's floor: see fastlane/worker/_slice.py.
DEFAULT_CPU_SLICE = timedelta(microseconds=200)


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
        token: The API token (a worker token) sent on every stream; None: the
            ``FASTLANE_TOKEN`` environment variable, if set. Under a tenant's token the worker
            receives only that tenant's runs.
        tls: Connect over TLS (with a client certificate for mutual TLS); None: plain TCP.
        cpu_slice: Ask Linux (6.12 or later) for CPU time slices this short for the thread that runs
            :meth:`run` (its event loop), so that it wakes on a held run's instant without waiting
            for a busy neighbour's slice to end (see ``fastlane/worker/_slice.py``); 0.1 to 100 ms.
            None leaves the thread's scheduling as it is.
        realtime_priority: Run the event loop's thread under Linux's real-time scheduling
            (``SCHED_FIFO``) at this priority, 1 to 99, while :meth:`run` runs, so that a held run
            starts on its instant even while every core is busy; needs ``CAP_SYS_NICE`` (or
            ``ulimit -r``) and the loop on the main thread, else the worker says why and runs
            normally. Every async handler then runs at that priority too. A loop that runs 250 ms
            without blocking is lowered to normal scheduling until the worker stops (see
            ``fastlane/worker/_realtime.py``). None or 0 (the default): normal scheduling.
        metrics: ``HOST:PORT`` to serve this worker's Prometheus metrics on, over plain HTTP, while
            :meth:`run` runs (see ``fastlane/worker/_metrics.py``); None (the default): none kept.
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
        token: str | None = None,
        tls: ClientTls | None = None,
        cpu_slice: timedelta | None = DEFAULT_CPU_SLICE,
        realtime_priority: int | None = None,
        metrics: str | None = None,
    ) -> None:
        if cpu_slice is not None and not MIN_SLICE <= cpu_slice <= MAX_SLICE:
            raise ConfigurationError(f"cpu_slice must be from {MIN_SLICE} to {MAX_SLICE} or None, got {cpu_slice}")
        self._cpu_slice = cpu_slice
        self._servers: list[str] = []
        self._concurrency = 0
        self._connection = Connection(token=token if token is not None else load_token(), tls=tls)
        self._realtime_priority: int | None = None
        self._metrics_listen: str | None = None  # HOST:PORT of /metrics; None: no metrics at all
        self._metrics: WorkerMetrics | None = None  # from run(), when _metrics_listen is set
        self.override(servers=servers, concurrency=concurrency, realtime_priority=realtime_priority, metrics=metrics)
        if drain_timeout < 0:
            raise ConfigurationError(f"drain_timeout must not be negative, got {drain_timeout}")
        self._drain_timeout = drain_timeout
        if not discovery_interval > 0:
            raise ConfigurationError(f"discovery_interval must be positive (seconds), got {discovery_interval}")
        self._follow_cluster = follow_cluster
        self._discovery_interval = discovery_interval
        self._worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._handlers: dict[str, Handler] = {}
        self._streams: ClusterStreams | None = None  # from run(): the seeds are final by then
        self._starts = StartTimer()  # wakes the runs sent ahead on their instants
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
        return self._streams is not None and self._streams.connected

    @property
    def node_addresses(self) -> tuple[str, ...]:
        """The addresses of the nodes this worker takes work from now (leaving streams excluded)."""
        return self._streams.addresses if self._streams is not None else ()

    def clock_estimates(self) -> dict[str, ClockEstimate]:
        """How far each node's clock is from this worker's, as estimated now; for information.

        The worker probes each node's clock after connecting and then once per heartbeat
        interval, and keeps the best of the recent round trips. It uses the estimate to start runs
        that a node sends ahead of their time on their instant.

        Returns:
            By node address (streams taking work only), ``(offset_s, uncertainty_s)``: the node's
            clock minus this worker's, in seconds, right to within ``uncertainty_s``. A node is
            missing until its first echo, and for good if it never echoes (an older daemon, which
            then never sends runs ahead).
        """
        return self._streams.clock_estimates() if self._streams is not None else {}

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
        realtime: RealtimeGrant | None = None
        try:
            if self._stop_requested.is_set():
                return
            if not self._handlers:
                raise ConfigurationError("no handlers: register one with @worker.handler(job_type) first")
            self._request_cpu_slice()
            priority = self._realtime_priority
            if priority and (realtime := request_realtime(priority, on_lowered=self._request_cpu_slice)):
                log.info("this thread runs at real-time priority %d (SCHED_FIFO)", priority)
            log.info("worker %s serving %s, %d at once, on %s", self.worker_id, ", ".join(sorted(self._handlers)),
                     self._concurrency, ", ".join(self._servers))
            if self._metrics_listen is not None:
                self._metrics = WorkerMetrics(credits_free=self._credits_free, clock_estimates=self.clock_estimates)
                self._metrics.serve(self._metrics_listen)
                log.info("worker metrics on http://%s/metrics", self._metrics_listen)
            streams = self._streams = ClusterStreams(self._servers, self._open_stream, self._open_channel)
            for address in self._servers:
                streams.add(address)
            following: asyncio.Task[None] | None = None
            if self._follow_cluster:
                log.info("following the cluster's membership from %s (every %g s)",
                         ", ".join(self._servers), self._discovery_interval)
                following = asyncio.create_task(
                    streams.follow(self._discovery_interval, self._stop_requested), name="worker-membership"
                )
            try:
                await self._serve_until_stopped(streams, following)
                if following is not None:
                    following.cancel()  # no stream comes or goes while the rest drain
                    await asyncio.gather(following, return_exceptions=True)
                await streams.drain(self._drain_timeout)
            finally:
                await streams.tear_down(following)
        finally:
            if realtime is not None:
                realtime.release()
            if self._metrics is not None:
                await asyncio.to_thread(self._metrics.close)
            await self._starts.close()
            self._finished.set()

    async def stop(self) -> None:
        """Stop gracefully: take no new work, let running handlers finish, report, disconnect.

        Runs held for their start instant (sent ahead by a node) are in flight like running ones:
        they start on their instant and finish, unless the drain timeout passes first.

        Waits until :meth:`run` returns. Safe to call twice, or before ``run`` (which then returns at
        once). Do not await it from a handler: the drain would wait for that handler.
        """
        self._stop_requested.set()
        if self._started:
            await self._finished.wait()

    # -- lifecycle -------------------------------------------------------------------------

    async def _serve_until_stopped(self, streams: ClusterStreams, following: asyncio.Task[None] | None) -> None:
        stop_wait = asyncio.create_task(self._stop_requested.wait(), name="worker-stop-wait")
        crash_wait = asyncio.create_task(streams.crash.wait(), name="worker-crash-wait")
        watched = [stop_wait, crash_wait, *([following] if following is not None else [])]
        try:
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_wait.cancel()
            crash_wait.cancel()
        # Following the membership ends by itself only at a stop; any other ending is a crash.
        ended = streams.crashed[:1]
        if not ended and following is not None and following in done and not self._stop_requested.is_set():
            ended = [following]
        for task in ended:
            task.result()  # these loops only end early by crashing: surface it
            raise RuntimeError(f"worker task {task.get_name()} ended unexpectedly")

    def _open_stream(self, address: str) -> NodeStream:
        return NodeStream(address, worker_id=self._worker_id, job_types=self.job_types,
                          concurrency=self._concurrency, launch=self._run_attempt, open_channel=self._open_channel,
                          on_reconnect=None if self._metrics is None else self._metrics.reconnected)

    def _credits_free(self) -> float:
        streams = self._streams
        return 0.0 if streams is None else float(streams.credits_free(self._concurrency))

    def _open_channel(self, address: str) -> grpc.aio.Channel:
        connection = self._connection
        return open_channel(address, tls=connection.tls, token=connection.token, options=CHANNEL_OPTIONS)

    async def _run_attempt(self, slot: RunSlot, assignment: pb.Assignment, received_at: datetime) -> None:
        handler = self._handlers.get(assignment.job_type)
        # The context is made when the handler starts: a run sent ahead is held first.
        call = functools.partial(_call, handler, slot, assignment, received_at) if handler is not None else None
        await run_attempt(slot, assignment, call, self._starts, self._metrics)

    def _request_cpu_slice(self) -> None:
        if self._cpu_slice is not None and request_cpu_slice(self._cpu_slice):
            log.info("this thread runs in CPU slices of %g ms", self._cpu_slice / timedelta(milliseconds=1))

    def override(
        self,
        *,
        servers: str | Sequence[str] | None = None,
        concurrency: int | None = None,
        token: str | None = None,
        tls: ClientTls | None = None,
        realtime_priority: int | None = None,
        metrics: str | None = None,
    ) -> None:
        """Replace the servers, concurrency, token, TLS, real-time priority or metrics address
        (``HOST:PORT``) given at construction (``fastlane worker`` flags win); None leaves one as it is.

        Raises:
            ConfigurationError: no server address is left, concurrency is below 1, or the
                real-time priority is not an integer from 0 (off) to 99.
        """
        if realtime_priority is not None:
            if (isinstance(realtime_priority, bool) or not isinstance(realtime_priority, int)
                    or not 0 <= realtime_priority <= MAX_PRIORITY):
                raise ConfigurationError(f"realtime_priority must be an integer from 0 (off) to {MAX_PRIORITY} "
                                         f"or None, got {realtime_priority!r}")
            self._realtime_priority = realtime_priority or None
        if metrics is not None:
            host, _, port = metrics.rpartition(":")
            if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
                raise ConfigurationError(f"metrics must be HOST:PORT, got {metrics!r}")
            self._metrics_listen = metrics
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
        if token is not None or tls is not None:
            current = self._connection
            self._connection = Connection(token=token if token is not None else current.token,
                                          tls=tls if tls is not None else current.tls)


@dataclass(frozen=True, slots=True)
class Connection:
    """How a worker reaches nodes: its API token and TLS settings (None: without)."""

    token: str | None
    tls: ClientTls | None


def _is_async(fn: object) -> bool:
    # An object whose __call__ is async (a class-based handler) is as good as an async function.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


async def _call(handler: Handler, slot: RunSlot, assignment: pb.Assignment, received_at: datetime) -> None:
    returned = await handler(_context(slot, assignment, received_at))
    if returned is not None:
        slot.output = _output(assignment.job_type, returned)


def _output(job_type: str, returned: object) -> bytes:
    """What a handler returned, as the JSON kept for the workflow steps after it; a value that is
    not JSON or is over MAX_OUTPUT_BYTES is dropped (with a warning), never failing the run."""
    try:
        encoded = orjson.dumps(returned)
    except TypeError as error:
        log.warning("the %s handler returned a value that is not JSON (%s): its output is dropped", job_type, error)
        return b""
    if len(encoded) > MAX_OUTPUT_BYTES:
        log.warning("the %s handler returned %d bytes of output, over the limit of %d: dropped",
                    job_type, len(encoded), MAX_OUTPUT_BYTES)
        return b""
    return encoded


def _context(slot: RunSlot, a: pb.Assignment, received_at: datetime) -> RunContext:
    return RunContext(
        run_id=a.run_id, job_id=a.job_id, job_type=a.job_type, tenant=a.tenant, attempt=a.attempt,
        payload=a.payload, scheduled_for=wire.epoch_plus(a.scheduled_for),
        idempotency_key=a.idempotency_key, lease_token=a.lease_token,
        checkpoint=a.checkpoint if a.HasField("checkpoint") else None, received_at=received_at,
        released_at=wire.instant(a.released_at, a.HasField("released_at")),
        started_at=slot.started_at or datetime.now(UTC), _slot=slot,
    )
