"""The worker's stream to one node: hello, assignments, heartbeats, results, reconnects.

:class:`NodeStream` keeps what must outlive a connection (the attempts in flight and the results
the node has not acknowledged) and builds the per-connection machinery (reader, writer, result
flusher, heartbeat loop) afresh for every ``WorkerService.Connect`` call. :func:`judge_attempt`
maps how a handler ended to the protocol's outcomes. The public face is :mod:`fastlane.worker`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import grpc

from fastlane._proto import workers_pb2 as pb
from fastlane._proto import workers_pb2_grpc as pb_grpc
from fastlane.errors import PermanentError
from fastlane.models import AttemptOutcome
from fastlane.wire import timestamp

log = logging.getLogger("fastlane.worker")

RunKey = tuple[str, int]  # (run_id, lease_token): one attempt
Launch = Callable[["RunSlot", pb.Assignment, datetime], Coroutine[Any, Any, None]]
_Item = TypeVar("_Item", pb.RunResult, pb.RunHeartbeat)

MAX_ERROR_MESSAGE = 2000
# gRPC servers refuse messages over 4 MiB by default; batches are cut well below that.
_MESSAGE_BUDGET = 3 << 20
_DEFAULT_HEARTBEAT_INTERVAL = 5.0
_BACKOFF_START = 0.1
_BACKOFF_CAP = 2.0
_CHANNEL_OPTIONS: Sequence[tuple[str, Any]] = (
    # gRPC's own reconnect backoff (1 s growing to 120 s) would keep failing our calls long after
    # the node is back; hold it to the same schedule as ours.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    # One assignment may carry a 1 MiB payload and a 1 MiB checkpoint, and a batch several.
    ("grpc.max_receive_message_length", -1),
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """How an attempt ended, before it is stamped with its run and times."""

    outcome: AttemptOutcome
    error_code: str = ""
    error_message: str = ""

    def result(self, slot: RunSlot, started_at: datetime, finished_at: datetime) -> pb.RunResult:
        return pb.RunResult(
            run_id=slot.run_id,
            lease_token=slot.lease_token,
            outcome=self.outcome.value,
            error_code=self.error_code,
            error_message=self.error_message[:MAX_ERROR_MESSAGE],
            started_at=timestamp(started_at),
            finished_at=timestamp(finished_at),
        )


_SUCCEEDED = Verdict(AttemptOutcome.SUCCEEDED)
_SHUTDOWN = Verdict(AttemptOutcome.FAILED, "WorkerShutdown", "the worker stopped before the handler finished")
_ABANDON_GRACE = 2.0  # after the drain timeout, for the cancelled runs' results to be acknowledged
_CLOSE_GRACE = 5.0  # for a node to end a stream the worker half-closed


async def judge_attempt(call: Callable[[], Awaitable[None]], slot: RunSlot, timeout: float | None) -> Verdict:
    """Await a handler call and say how it ended, as the protocol's outcomes."""
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            await call()
    except asyncio.CancelledError:
        if slot.stop_reason is None:
            raise  # the worker itself is being torn down: nothing to report
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        return slot.stop_reason
    except TimeoutError as exc:
        if deadline.expired():
            message = f"the handler ran past its timeout of {timeout:g} s"
            return Verdict(AttemptOutcome.TIMED_OUT, "TimeoutError", message)
        return _failure(AttemptOutcome.FAILED, exc)
    except PermanentError as exc:
        return _failure(AttemptOutcome.PERMANENT_FAILURE, exc)
    except Exception as exc:  # any handler error fails the attempt, never the worker
        return _failure(AttemptOutcome.FAILED, exc)
    return _SUCCEEDED


def _failure(outcome: AttemptOutcome, exc: Exception) -> Verdict:
    # DEBUG, not higher: under load a failing job type would flood the log with one line per run.
    log.debug("handler failed (%s)", outcome.value, exc_info=exc)
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not lose the result
        message = f"<unprintable {type(exc).__name__}>"
    return Verdict(outcome, type(exc).__name__, message)


class RunSlot:
    """The mutable side of one attempt in flight: its task, progress, checkpoint, stop reason."""

    __slots__ = (
        "stream", "run_id", "lease_token", "task", "progress", "sent_progress",
        "checkpoint", "unsent_checkpoint", "stop_reason",
    )

    def __init__(self, stream: NodeStream, run_id: str, lease_token: int) -> None:
        self.stream = stream
        self.run_id = run_id
        self.lease_token = lease_token
        self.task: asyncio.Task[None] | None = None
        self.progress: float | None = None
        self.sent_progress: float | None = None
        self.checkpoint: bytes | None = None  # the latest this attempt saved
        self.unsent_checkpoint: bytes | None = None
        self.stop_reason: Verdict | None = None  # set when the worker itself cancels the handler

    @property
    def key(self) -> RunKey:
        return (self.run_id, self.lease_token)

    def set_progress(self, fraction: float) -> None:
        self.progress = fraction
        self.stream.mark_changed(self)

    def set_checkpoint(self, data: bytes) -> None:
        self.checkpoint = self.unsent_checkpoint = data
        self.stream.mark_changed(self)

    async def heartbeat(self) -> None:
        await self.stream.beat_now(self)

    def beat(self) -> pb.RunHeartbeat:
        beat = pb.RunHeartbeat(run_id=self.run_id, lease_token=self.lease_token, started=True)
        if self.progress is not None and self.progress != self.sent_progress:
            beat.progress = self.sent_progress = self.progress
        if self.unsent_checkpoint is not None:
            beat.checkpoint, self.unsent_checkpoint = self.unsent_checkpoint, None
        return beat

    def resync(self) -> None:
        # A new connection may reach a node that never saw the last beat: send everything again.
        self.sent_progress = None
        self.unsent_checkpoint = self.checkpoint


class NodeStream:
    """One worker stream to one node, reconnected until closed.

    Args:
        address: ``host:port`` of the node.
        worker_id: Sent in every Hello.
        job_types: The job types this worker has handlers for.
        concurrency: Credits for this stream: the most attempts it may have in flight.
        launch: Makes the coroutine that runs one assignment and ends with :meth:`finish`.
    """

    def __init__(
        self, address: str, *, worker_id: str, job_types: Sequence[str], concurrency: int, launch: Launch
    ) -> None:
        self.address = address
        self._worker_id = worker_id
        self._job_types = list(job_types)
        self._concurrency = concurrency
        self._launch = launch
        self._in_flight: dict[RunKey, RunSlot] = {}
        self._unacked: dict[RunKey, pb.RunResult] = {}
        self._pending: list[pb.RunResult] = []  # finished, not yet written to the current stream
        self._pending_credits = 0
        self._changed_runs: set[RunKey] = set()  # due in the next prompt heartbeat
        self._results_ready = asyncio.Event()
        self._beat_wanted = asyncio.Event()
        self._next_beat: asyncio.Future[None] | None = None
        self._settled = asyncio.Event()  # a run finished or a result was acknowledged
        self._closing = asyncio.Event()
        self._outbound: asyncio.Queue[pb.WorkerMessage | None] | None = None
        self._welcomed = False
        self._draining = False
        self._heartbeat_interval = _DEFAULT_HEARTBEAT_INTERVAL
        self._last_end = ""  # why the last stream ended, for the reconnect log line

    @property
    def connected(self) -> bool:
        return self._welcomed

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    # -- lifecycle, driven by the Worker ---------------------------------------------------

    async def serve(self) -> None:
        """Keep a stream open until :meth:`half_close` and the node's end of it; reconnect on breaks."""
        channel = grpc.aio.insecure_channel(self.address, options=_CHANNEL_OPTIONS)
        stub = pb_grpc.WorkerServiceStub(channel)
        delay, failures = _BACKOFF_START, 0
        try:
            while not self._closing.is_set():
                if await self._session(stub):
                    delay, failures = _BACKOFF_START, 0
                if self._closing.is_set():
                    break
                failures += 1
                pause = random.uniform(delay / 2, delay)
                delay = min(delay * 2, _BACKOFF_CAP)
                # One line per outage at INFO; the retries of a long outage would flood the log.
                level = logging.INFO if failures == 1 else logging.DEBUG
                log.log(level, "reconnecting to %s in %.2f s (attempt %d, after %s)",
                        self.address, pause, failures, self._last_end)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await self._closing.wait()
        finally:
            await channel.close()

    def begin_drain(self) -> None:
        """Grant no more credits, here or in a later Hello: the node runs down what it sent."""
        self._draining = True

    async def drain(self) -> None:
        """Wait until nothing is in flight or unacknowledged, then close the sending side."""
        while self._in_flight or self._unacked:
            self._settled.clear()
            await self._settled.wait()
        self.half_close()

    def half_close(self) -> None:
        """Close the sending side; assignments that still arrive are not started."""
        self._closing.set()
        if self._outbound is not None:
            self._outbound.put_nowait(None)

    def abandon(self, verdict: Verdict) -> None:
        """Cancel every handler, reporting ``verdict`` for each."""
        for slot in list(self._in_flight.values()):
            self._stop(slot, verdict)

    def abort(self) -> list[asyncio.Task[None]]:
        """Cancel every handler without reporting; return the tasks so the caller can await them."""
        tasks = [slot.task for slot in self._in_flight.values() if slot.task is not None]
        self._in_flight.clear()
        for task in tasks:
            task.cancel()
        return tasks

    # -- called from run tasks -------------------------------------------------------------

    def finish(self, slot: RunSlot, result: pb.RunResult) -> None:
        """Buffer an attempt's result; the flusher sends it with the credit it frees."""
        if self._in_flight.pop(slot.key, None) is None:
            return  # aborted, or already settled after a cancel
        self._changed_runs.discard(slot.key)
        self._unacked[slot.key] = result
        self._pending.append(result)
        self._pending_credits += 1
        self._results_ready.set()
        self._settled.set()

    def mark_changed(self, slot: RunSlot) -> None:
        self._changed_runs.add(slot.key)

    async def beat_now(self, slot: RunSlot) -> None:
        """Ask for a prompt heartbeat carrying ``slot``; return once it is queued for the node."""
        self._changed_runs.add(slot.key)
        if not self._welcomed:
            return  # the full heartbeat sent after the next Welcome carries it
        if self._next_beat is None:
            self._next_beat = asyncio.get_running_loop().create_future()
        waiter = self._next_beat
        self._beat_wanted.set()
        # Shared by every caller of this beat: one cancelled handler must not cancel it for all.
        await asyncio.shield(waiter)

    # -- one connection --------------------------------------------------------------------

    async def _session(self, stub: pb_grpc.WorkerServiceStub) -> bool:
        """Run one Connect call to its end; return whether the node welcomed us."""
        call = stub.Connect()
        outbound: asyncio.Queue[pb.WorkerMessage | None] = asyncio.Queue()
        self._open(outbound)
        welcomed = asyncio.Event()
        reader = asyncio.create_task(self._read(call, welcomed), name=f"worker-read:{self.address}")
        helpers = [
            asyncio.create_task(self._write(call, outbound), name=f"worker-write:{self.address}"),
            asyncio.create_task(self._flush_results(outbound), name=f"worker-results:{self.address}"),
            asyncio.create_task(self._send_heartbeats(welcomed), name=f"worker-heartbeats:{self.address}"),
        ]
        error: BaseException | None = None
        try:
            waiting: set[asyncio.Task[None]] = {reader, *helpers}
            while reader in waiting and error is None:
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                error = next((t.exception() for t in done if not t.cancelled() and t.exception()), None)
        finally:
            for task in (reader, *helpers):
                task.cancel()
            await asyncio.gather(reader, *helpers, return_exceptions=True)
            call.cancel()
            self._close_session()
        self._log_end(welcomed.is_set(), error)
        return welcomed.is_set()

    def _open(self, outbound: asyncio.Queue[pb.WorkerMessage | None]) -> None:
        credits = 0 if self._draining else max(0, self._concurrency - len(self._in_flight))
        hello = pb.Hello(worker_id=self._worker_id, job_types=self._job_types, credits=credits, tenant="")
        outbound.put_nowait(pb.WorkerMessage(hello=hello))
        # The Hello's credits already count every finished run, so nothing pending is granted again.
        self._pending, self._pending_credits = [], 0
        for message in _batches(self._unacked.values(), _results_message):
            outbound.put_nowait(message)
        for slot in self._in_flight.values():
            slot.resync()
        self._outbound = outbound
        if self._closing.is_set():
            outbound.put_nowait(None)

    def _close_session(self) -> None:
        self._outbound = None
        self._welcomed = False
        waiter, self._next_beat = self._next_beat, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _log_end(self, welcomed: bool, error: BaseException | None) -> None:
        self._last_end = _describe(error) if error is not None else "the node ended the stream"
        if error is not None and not isinstance(error, grpc.aio.AioRpcError):
            log.error("worker stream to %s crashed", self.address, exc_info=error)
        if welcomed and self._closing.is_set() and error is None:
            log.info("disconnected from %s: worker stopped", self.address)
        elif welcomed:
            log.info("disconnected from %s: %s", self.address, self._last_end)

    async def _read(self, call: Any, welcomed: asyncio.Event) -> None:
        while (message := await call.read()) is not grpc.aio.EOF:
            body = message.WhichOneof("body")
            if body == "assignments":
                self._start_runs(message.assignments.assignments, datetime.now(UTC))
            elif body == "acks":
                self._forget(message.acks.acks)
            elif body == "cancel":
                self._cancel(message.cancel)
            elif body == "welcome":
                self._welcome(message.welcome, welcomed)

    async def _write(self, call: Any, outbound: asyncio.Queue[pb.WorkerMessage | None]) -> None:
        while (message := await outbound.get()) is not None:
            await call.write(message)
        await call.done_writing()

    async def _flush_results(self, outbound: asyncio.Queue[pb.WorkerMessage | None]) -> None:
        # Runs finishing in the same loop iterations pile up before this wakes: one message for all.
        while True:
            await self._results_ready.wait()
            self._results_ready.clear()
            batch, self._pending = self._pending, []
            for message in _batches(batch, _results_message):
                outbound.put_nowait(message)
            credits, self._pending_credits = self._pending_credits, 0
            if credits and not self._draining:
                outbound.put_nowait(pb.WorkerMessage(credit=pb.CreditGrant(credits=credits)))

    async def _send_heartbeats(self, welcomed: asyncio.Event) -> None:
        await welcomed.wait()
        loop = asyncio.get_running_loop()
        if self._in_flight:
            self._queue_beats(full=True)  # a node that restarted learns at once what runs here
        due = loop.time() + self._heartbeat_interval
        while True:
            try:
                async with asyncio.timeout_at(due):
                    await self._beat_wanted.wait()
            except TimeoutError:
                self._queue_beats(full=True)
                due = loop.time() + self._heartbeat_interval
                continue
            self._beat_wanted.clear()
            self._queue_beats(full=False)

    def _queue_beats(self, *, full: bool) -> None:
        if full:
            slots: Iterable[RunSlot] = list(self._in_flight.values())
        else:
            slots = [slot for key in self._changed_runs if (slot := self._in_flight.get(key)) is not None]
        self._changed_runs.clear()
        if self._outbound is not None:
            for message in _batches((slot.beat() for slot in slots), _heartbeats_message):
                self._outbound.put_nowait(message)
        waiter, self._next_beat = self._next_beat, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- node messages ---------------------------------------------------------------------

    def _welcome(self, welcome: pb.Welcome, welcomed: asyncio.Event) -> None:
        interval = welcome.heartbeat_interval.ToTimedelta().total_seconds()
        self._heartbeat_interval = interval if interval > 0 else _DEFAULT_HEARTBEAT_INTERVAL
        if not self._welcomed:
            log.info(
                "connected to %s (node %s, heartbeat every %.3g s, %d runs in flight)",
                self.address, welcome.node_id or "?", self._heartbeat_interval, len(self._in_flight),
            )
        self._welcomed = True
        welcomed.set()

    def _start_runs(self, assignments: Iterable[pb.Assignment], received_at: datetime) -> None:
        if self._closing.is_set():
            return  # we said goodbye: the node treats these like runs of a worker that left
        loop = asyncio.get_running_loop()
        for assignment in assignments:
            key = (assignment.run_id, assignment.lease_token)
            if key in self._in_flight or key in self._unacked:
                log.warning("ignoring a repeated assignment of run %s (lease %d)", *key)
                continue
            slot = RunSlot(self, assignment.run_id, assignment.lease_token)
            self._in_flight[key] = slot
            slot.task = loop.create_task(
                self._launch(slot, assignment, received_at), name=f"run:{assignment.run_id}"
            )

    def _forget(self, acks: Iterable[pb.ResultAck]) -> None:
        for ack in acks:
            self._unacked.pop((ack.run_id, ack.lease_token), None)
        self._settled.set()

    def _cancel(self, cancel: pb.CancelRuns) -> None:
        verdict = Verdict(AttemptOutcome.CANCELLED, "", cancel.reason)
        for ref in cancel.runs:
            slot = self._in_flight.get((ref.run_id, ref.lease_token))
            if slot is not None:
                self._stop(slot, verdict)

    def _stop(self, slot: RunSlot, verdict: Verdict) -> None:
        if slot.stop_reason is not None or slot.task is None:
            return
        slot.stop_reason = verdict
        slot.task.cancel()
        # A task cancelled before its first step never runs its body, so it reports nothing itself.
        slot.task.add_done_callback(functools.partial(self._settle_stopped, slot))

    def _settle_stopped(self, slot: RunSlot, task: asyncio.Task[None]) -> None:
        if slot.stop_reason is not None and slot.key in self._in_flight:
            now = datetime.now(UTC)
            self.finish(slot, slot.stop_reason.result(slot, now, now))


async def drain_streams(streams: Sequence[NodeStream], serving: Sequence[asyncio.Task[None]], timeout: float) -> None:
    """Stop every stream gracefully: no new credits, finish, report, half-close, await the node.

    Handlers still running after ``timeout`` seconds are cancelled and reported as retryable
    ``WorkerShutdown`` failures (``cancelled`` would end the run for good).
    """
    for stream in streams:
        stream.begin_drain()
    drains = [asyncio.create_task(s.drain(), name=f"worker-drain:{s.address}") for s in streams]
    try:
        _, late = await asyncio.wait(drains, timeout=timeout)
        if late:
            running = sum(stream.in_flight for stream in streams)
            log.warning("drain timeout (%g s) passed with %d runs in flight: cancelling them", timeout, running)
            for stream in streams:
                stream.abandon(_SHUTDOWN)
            await asyncio.wait(late, timeout=_ABANDON_GRACE)
            for stream in streams:
                stream.half_close()
        await asyncio.wait(serving, timeout=_CLOSE_GRACE)
    finally:
        for task in drains:
            task.cancel()
        await asyncio.gather(*drains, return_exceptions=True)


def _results_message(results: list[pb.RunResult]) -> pb.WorkerMessage:
    return pb.WorkerMessage(results=pb.Results(results=results))


def _heartbeats_message(beats: list[pb.RunHeartbeat]) -> pb.WorkerMessage:
    return pb.WorkerMessage(heartbeats=pb.Heartbeats(beats=beats))


def _batches(items: Iterable[_Item], wrap: Callable[[list[_Item]], pb.WorkerMessage]) -> Iterator[pb.WorkerMessage]:
    """As few messages as fit under the size budget (normally one)."""
    batch: list[_Item] = []
    size = 0
    for item in items:
        item_size = item.ByteSize() + 8
        if batch and size + item_size > _MESSAGE_BUDGET:
            yield wrap(batch)
            batch, size = [], 0
        batch.append(item)
        size += item_size
    if batch:
        yield wrap(batch)


def _describe(error: BaseException) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return f"{type(error).__name__}: {error}"
