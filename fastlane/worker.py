"""The worker SDK: register async handlers by job type, connect to nodes, run what they assign.

Example::

    worker = Worker("node-1:7070")

    @worker.handler("email.send")
    async def send_email(ctx: RunContext) -> None:
        await deliver(ctx.json())

    asyncio.run(worker.run())

Each node pushes attempts over one stream, never more than the credits this worker granted. The
stream plumbing (batching, heartbeats, reconnects) lives in :mod:`fastlane._worker_stream`.
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

import orjson

from fastlane._proto import workers_pb2 as pb
from fastlane._worker_stream import NodeStream, RunSlot, Verdict, drain_streams, judge_attempt
from fastlane.errors import ConfigurationError
from fastlane.models import MAX_CHECKPOINT_BYTES, AttemptOutcome

log = logging.getLogger("fastlane.worker")

Handler = Callable[["RunContext"], Awaitable[None]]
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
        servers: Node addresses (``host:port``), as a sequence or one comma-separated string. The
            worker keeps one stream to each.
        worker_id: How nodes and run history name this worker; default ``host-pid-random``.
        concurrency: The most attempts each node stream may have in flight at once.
        drain_timeout: Seconds :meth:`stop` waits for running handlers and result acknowledgements.
    """

    def __init__(
        self,
        servers: str | Sequence[str] = "127.0.0.1:7070",
        *,
        worker_id: str | None = None,
        concurrency: int = 64,
        drain_timeout: float = 30.0,
    ) -> None:
        self._servers: list[str] = []
        self._concurrency = 0
        self._configure(servers, concurrency)
        if drain_timeout < 0:
            raise ConfigurationError(f"drain_timeout must not be negative, got {drain_timeout}")
        self._drain_timeout = drain_timeout
        self._worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._handlers: dict[str, Handler] = {}
        self._streams: list[NodeStream] = []
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
        return any(stream.connected for stream in self._streams)

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
        """Connect to every server and run assigned attempts until :meth:`stop`, then drain.

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
            self._streams = [
                NodeStream(address, worker_id=self._worker_id, job_types=self.job_types,
                           concurrency=self._concurrency, launch=self._run_attempt)
                for address in self._servers
            ]
            serving = [asyncio.create_task(s.serve(), name=f"worker-stream:{s.address}") for s in self._streams]
            try:
                await self._serve_until_stopped(serving)
                await drain_streams(self._streams, serving, self._drain_timeout)
            finally:
                await self._tear_down(serving)
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

    async def _serve_until_stopped(self, serving: list[asyncio.Task[None]]) -> None:
        stop_wait = asyncio.create_task(self._stop_requested.wait(), name="worker-stop-wait")
        try:
            done, _ = await asyncio.wait([*serving, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_wait.cancel()
        for task in done:
            if task is not stop_wait:
                task.result()  # a stream loop only ends early by crashing: surface it
                raise RuntimeError(f"worker stream task {task.get_name()} ended unexpectedly")

    async def _tear_down(self, serving: list[asyncio.Task[None]]) -> None:
        handlers = [task for stream in self._streams for task in stream.abort()]
        for task in serving:
            task.cancel()
        await asyncio.gather(*serving, *handlers, return_exceptions=True)

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
