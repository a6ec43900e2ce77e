"""Testing a worker's handlers without a daemon: :class:`FakeNode`.

A handler is best tested as it runs: under a real :class:`~fastlane.Worker`, given a real
:class:`~fastlane.RunContext`, its outcome judged by the SDK's own rules (what it raised, its
timeout, a cancellation) and its checkpoints carried by real heartbeats. So the fake node is a
real gRPC server on 127.0.0.1 that the worker connects to as to a daemon; the test plays the
daemon's part, one assignment at a time, and reads back domain values, never protobuf::

    async with FakeNode() as node, node.serving(worker):
        result = await node.run("report.build", {"day": "2030-01-01"})
        assert result.succeeded, result.error_message

Everything is bounded: each wait by ``timeout`` (TimeoutError naming what did not happen), and
leaving :meth:`FakeNode.serving` stops the worker (cancelled if it does not drain in time), as
leaving the node stops its server.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Self

import grpc
import orjson

from fastlane._proto import workers_pb2 as pb
from fastlane.domain.models import AttemptOutcome
from fastlane.domain.transitions import RETRYABLE_OUTCOMES
from fastlane.rpc.enums import reported_outcome
from fastlane.rpc.wire import duration, timestamp
from fastlane.testing.waiting import WaitTimedOut, until
from fastlane.testing.wire import SCHEDULED_FOR, FakeStream, FakeWorkerService, start_server
from fastlane.worker import Worker

DEFAULT_TIMEOUT = 10.0
# Short, so that a run's start and its checkpoints reach the node soon without the handler asking
# (``await ctx.heartbeat()`` sends one at once); a daemon's default is seconds.
DEFAULT_HEARTBEAT = timedelta(milliseconds=100)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """How one attempt ended, as the node heard it.

    Attributes:
        run_id: The run the attempt belongs to.
        attempt: Its number (1 for the first).
        outcome: ``succeeded``, ``failed`` (retryable: any exception but a
            :class:`~fastlane.PermanentError`), ``permanent_failure``, ``timed_out`` or ``cancelled``.
        error_type: The class name of what the handler raised (``RetryableError``, say), or the
            SDK's code for how it ended otherwise (``TimeoutError``); empty on success.
        error_message: What the handler raised, as text; for a cancellation, the reason.
        traceback: The handler's traceback, if it raised.
        output: What the handler returned (decoded from JSON), or None.
        started_at: When the worker started the handler.
        finished_at: When it ended.
        checkpoint: The last checkpoint the node heard from this attempt (it travels on
            heartbeats), or None.
        progress: The last progress (0 to 1) the node heard, or None.
    """

    run_id: str
    attempt: int
    outcome: AttemptOutcome
    error_type: str
    error_message: str
    traceback: str
    output: Any
    started_at: datetime | None
    finished_at: datetime | None
    checkpoint: bytes | None
    progress: float | None

    @property
    def succeeded(self) -> bool:
        return self.outcome is AttemptOutcome.SUCCEEDED

    @property
    def retryable(self) -> bool:
        """Whether the job's retry policy may give the run another attempt (failed, timed out)."""
        return self.outcome in RETRYABLE_OUTCOMES


class RunHandle:
    """One attempt assigned to the worker: wait for its start, checkpoints and result; cancel it."""

    def __init__(self, node: FakeNode, stream: FakeStream, assignment: pb.Assignment) -> None:
        self._node = node
        self._stream = stream
        self.run_id: str = assignment.run_id
        self.attempt: int = assignment.attempt
        self.lease_token: int = assignment.lease_token

    def __repr__(self) -> str:
        return f"RunHandle(run_id={self.run_id!r}, attempt={self.attempt})"

    @property
    def checkpoints(self) -> list[bytes]:
        """Every checkpoint the node has heard from this attempt so far, oldest first."""
        return [beat.checkpoint for beat in self._beats() if beat.HasField("checkpoint")]

    @property
    def progress(self) -> float | None:
        """The last progress the node heard from this attempt, or None."""
        reported = [beat.progress for beat in self._beats() if beat.HasField("progress")]
        return reported[-1] if reported else None

    async def started(self, timeout: float | None = None) -> None:
        """Wait until a heartbeat says the handler runs (within the node's heartbeat interval)."""
        await self._node._wait(lambda: any(beat.started for beat in self._beats()), timeout,
                               f"run {self.run_id} to start")

    async def checkpoint_saved(self, timeout: float | None = None) -> bytes:
        """Wait until the node has heard a checkpoint of this attempt; return the latest."""
        await self._node._wait(lambda: self.checkpoints, timeout, f"a checkpoint of run {self.run_id}")
        return self.checkpoints[-1]

    def cancel(self, reason: str = "cancelled by the test") -> None:
        """Ask the worker to cancel the attempt, as a node does for a run cancelled by request:
        the handler's task is cancelled and the result says ``cancelled``, with ``reason``."""
        self._stream.cancel(self.run_id, self.lease_token, reason)

    async def result(self, timeout: float | None = None) -> RunResult:
        """Wait for the attempt's result (by default at most the node's ``timeout``).

        Raises:
            TimeoutError: No result came in time.
        """
        await self._node._wait(lambda: self._found() is not None, timeout, f"the result of run {self.run_id}")
        found = self._found()
        assert found is not None
        return self._convert(found)

    def _beats(self) -> list[pb.RunHeartbeat]:
        return [beat for stream in self._node._service.streams for beat in stream.beats_of(self.run_id)
                if beat.lease_token == self.lease_token]

    def _found(self) -> pb.RunResult | None:
        for stream in self._node._service.streams:
            for result in stream.results():
                if result.run_id == self.run_id and result.lease_token == self.lease_token:
                    return result
        return None

    def _convert(self, result: pb.RunResult) -> RunResult:
        checkpoints = self.checkpoints
        return RunResult(
            run_id=result.run_id,
            attempt=self.attempt,
            outcome=reported_outcome(result.outcome),  # as a node takes it
            error_type=result.error_code,
            error_message=result.error_message,
            traceback=result.error_traceback,
            output=orjson.loads(result.output) if result.output else None,
            started_at=result.started_at.ToDatetime(tzinfo=UTC) if result.HasField("started_at") else None,
            finished_at=result.finished_at.ToDatetime(tzinfo=UTC) if result.HasField("finished_at") else None,
            checkpoint=checkpoints[-1] if checkpoints else None,
            progress=self.progress,
        )


class FakeNode:
    """A stand-in for a fastlane daemon that a test drives: it assigns runs to a real worker and
    reads back their results.

    Args:
        heartbeat_interval: The interval the node asks the worker to heartbeat at.
        timeout: The default bound, in seconds, of every wait (connecting, a result, a checkpoint)
            and of stopping the worker.
        tenant: The tenant of runs assigned without one.
    """

    def __init__(self, *, heartbeat_interval: timedelta = DEFAULT_HEARTBEAT, timeout: float = DEFAULT_TIMEOUT,
                 tenant: str = "acme") -> None:
        self._service = FakeWorkerService(heartbeat_interval=heartbeat_interval)
        self._service.prompt_results = True  # as a PostgreSQL node: a result goes at once
        self._server: grpc.aio.Server | None = None
        self._timeout = timeout
        self._tenant = tenant
        self._tokens = itertools.count(1)
        self._runs = itertools.count(1)

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, once started."""
        if self._server is None:
            raise RuntimeError("the fake node is not started: use `async with FakeNode() as node`")
        return self._service.address

    async def start(self) -> Self:
        """Serve on a free port of 127.0.0.1."""
        if self._server is None:
            self._server = await start_server(self._service)
        return self

    async def stop(self) -> None:
        """Stop serving; every stream ends. Safe to call twice."""
        server, self._server = self._server, None
        if server is not None:
            await asyncio.wait_for(server.stop(grace=None), self._timeout)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @asynccontextmanager
    async def serving(self, worker: Worker) -> AsyncIterator[Worker]:
        """Run ``worker`` (its handlers registered; ``run()`` not called yet) against this node
        until the block ends, then stop it. Its server addresses are replaced by this node's.

        Raises:
            TimeoutError: The worker did not connect in time.
            Exception: What ``worker.run()`` raised (a worker with no handler, say).
        """
        worker.override(servers=self.address)
        task = asyncio.create_task(worker.run(), name="fake-node-worker")
        try:
            await until(lambda: task.done() or self._stream() is not None, self._timeout,
                        f"the worker to connect to the fake node at {self.address}", interval=0.005)
            if task.done():
                task.result()  # it failed to start: say why
                raise RuntimeError("Worker.run() returned before connecting")
            yield worker
        finally:
            if not task.done():
                try:
                    await asyncio.wait_for(worker.stop(), self._timeout)
                except TimeoutError:
                    task.cancel()
            await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), self._timeout)
        if not task.cancelled() and (error := task.exception()) is not None:
            raise error

    def assign(self, job_type: str, payload: Any = None, *, run_id: str | None = None, attempt: int = 1,
               job_id: str | None = None, tenant: str | None = None, checkpoint: bytes | None = None,
               scheduled_for: datetime = SCHEDULED_FOR, handler_timeout: timedelta | None = None) -> RunHandle:
        """Send the worker one attempt of a run, as a node does when it fires; return at once.

        Args:
            job_type: Which handler runs it.
            payload: Bytes as they are, or any value orjson encodes (a dict, say); None: empty.
            run_id: Default ``run-1``, ``run-2``...; the idempotency key is ``key-<run_id>``.
            attempt: The attempt's number: 2 and up is a retry.
            job_id: Default ``job-<run_id>``.
            tenant: Default the node's.
            checkpoint: What an earlier attempt saved (``ctx.checkpoint``).
            scheduled_for: The instant the run was due.
            handler_timeout: The job's timeout: past it the handler is cancelled (``timed_out``).

        Raises:
            RuntimeError: No worker is connected (use :meth:`serving`).
        """
        stream = self._stream()
        if stream is None:
            raise RuntimeError("no worker is connected to the fake node: assign inside `async with node.serving(worker)`")
        run_id = run_id or f"run-{next(self._runs)}"
        data = payload if isinstance(payload, bytes) else b"" if payload is None else orjson.dumps(payload)
        message = pb.Assignment(
            run_id=run_id, job_id=job_id or f"job-{run_id}", job_type=job_type, tenant=tenant or self._tenant,
            attempt=attempt, payload=data, scheduled_for=timestamp(scheduled_for), idempotency_key=f"key-{run_id}",
            lease_token=next(self._tokens), lease_ttl=duration(timedelta(seconds=30)), checkpoint=checkpoint,
            timeout=duration(handler_timeout),
        )
        stream.assign(message)
        return RunHandle(self, stream, message)

    async def run(self, job_type: str, payload: Any = None, *, timeout: float | None = None, **options: Any) -> RunResult:
        """:meth:`assign` one attempt (``options`` as there) and wait for its result."""
        return await self.assign(job_type, payload, **options).result(timeout)

    def _stream(self) -> FakeStream | None:
        """The newest stream the worker opened and said Hello on, while it is open."""
        for stream in reversed(self._service.streams):
            if stream.received and not stream.worker_closed:
                return stream
        return None

    async def _wait(self, predicate: Callable[[], object], timeout: float | None, what: str) -> None:
        bound = self._timeout if timeout is None else timeout
        try:
            await self._service.wait_until(predicate, bound)
        except TimeoutError:
            raise WaitTimedOut(f"timed out after {bound:g} s waiting for {what}") from None
