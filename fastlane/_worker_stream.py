"""The worker's stream to one node: hello, assignments, heartbeats, results, reconnects.

:class:`NodeStream` keeps what must outlive a connection (the attempts in flight and the results
the node has not acknowledged) and builds the per-connection machinery (reader, writer, result
flusher, heartbeat loop) afresh for every ``WorkerService.Connect`` call. A stream the worker no
longer wants (its node left the cluster) drains while its node answers and otherwise hands what it
holds to another stream: every node records any result, since all share the database.
:func:`judge_attempt` maps how a handler ended to the protocol's outcomes. The public face is
:mod:`fastlane.worker`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import (
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
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
CHANNEL_OPTIONS: Sequence[tuple[str, Any]] = (
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
# A leaving stream whose node holds a result this long without acknowledging it hands its work on.
_ACK_PATIENCE = 5.0
_HANDOVER_RETRY = 1.0  # how often a leaving stream with no stream to hand over to looks again


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

    Attempts handed over from a leaving stream (:meth:`hand_over`) heartbeat and report here but
    free no credit: this node never granted them.
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
        self._adopted: set[RunKey] = set()  # in flight here, assigned through another stream
        self._ack_clock = time.monotonic()  # last ack, or when the first unacked result appeared
        self._pending: list[pb.RunResult] = []  # finished, not yet written to the current stream
        self._pending_credits = 0
        self._changed_runs: set[RunKey] = set()  # due in the next prompt heartbeat
        self._results_ready = asyncio.Event()
        self._beat_wanted = asyncio.Event()
        self._next_beat: asyncio.Future[None] | None = None
        self._settled = asyncio.Event()  # a run finished, a result was acknowledged, the stream went down
        self._closing = asyncio.Event()
        self._outbound: asyncio.Queue[pb.WorkerMessage | None] | None = None
        self._welcomed = False
        self._session_ended = False  # since this stream was made: a connection failed or broke
        self._draining = False
        self._heartbeat_interval = _DEFAULT_HEARTBEAT_INTERVAL
        self._last_end = ""  # why the last stream ended, for the reconnect log line

    @property
    def connected(self) -> bool:
        return self._welcomed

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def down(self) -> bool:
        """Whether the node has been tried and no stream to it is up now (a fresh stream is not)."""
        return self._session_ended and not self._welcomed

    @property
    def closing(self) -> bool:
        """Whether the sending side is closed or closing: the stream takes nothing more."""
        return self._closing.is_set()

    # -- lifecycle, driven by the Worker ---------------------------------------------------

    async def serve(self) -> None:
        """Keep a stream open until :meth:`half_close` and the node's end of it; reconnect on breaks."""
        channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
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

    async def drain(self, successor: Callable[[], NodeStream | None] | None = None) -> None:
        """Wait until nothing is in flight or unacknowledged, then close the sending side.

        Args:
            successor: For a stream that is leaving while the worker goes on. Once the stream is
                down, or its node has sat on a result for ``_ACK_PATIENCE`` seconds, what is still
                in flight or unacknowledged moves to the stream ``successor()`` names, if any, and
                this one closes at once.
        """
        while self._in_flight or self._unacked:
            wait: float | None = None
            if successor is not None:
                stalled = bool(self._unacked) and time.monotonic() - self._ack_clock >= _ACK_PATIENCE
                if not self._welcomed or stalled:
                    if (target := successor()) is not None:
                        self.hand_over(target)
                        break
                    wait = _HANDOVER_RETRY  # no stream to take it yet: look again soon
                elif self._unacked:
                    wait = self._ack_clock + _ACK_PATIENCE - time.monotonic()
            self._settled.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._settled.wait()
        self.half_close()

    def hand_over(self, successor: NodeStream) -> None:
        """Move every attempt in flight and every unacknowledged result to ``successor``.

        For a stream whose node is gone or stuck: the attempts heartbeat, and the results are
        reported, through the successor's node instead, which records them in the shared database.
        """
        slots, results = list(self._in_flight.values()), list(self._unacked.values())
        self._in_flight, self._unacked = {}, {}
        self._adopted.clear()
        self._changed_runs.clear()
        self._pending, self._pending_credits = [], 0
        successor.adopt(slots, results)
        self._settled.set()
        if slots or results:
            log.info("handed %d runs in flight and %d unacknowledged results from %s over to %s",
                     len(slots), len(results), self.address, successor.address)

    def adopt(self, slots: Sequence[RunSlot], results: Sequence[pb.RunResult]) -> None:
        """Take over attempts and results from a leaving stream; see :meth:`hand_over`."""
        if results and not self._unacked:
            self._ack_clock = time.monotonic()
        for slot in slots:
            slot.stream = self
            slot.resync()  # this node may not have heard the last progress or checkpoint
            self._in_flight[slot.key] = slot
            self._adopted.add(slot.key)
            self._changed_runs.add(slot.key)
        for result in results:
            key = (result.run_id, result.lease_token)
            if key not in self._unacked:
                self._unacked[key] = result
                self._pending.append(result)
        if results:
            self._results_ready.set()
        if slots and self._welcomed:
            self._beat_wanted.set()  # renew their leases through this node now
        self._settled.set()

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
        self._adopted.clear()
        for task in tasks:
            task.cancel()
        return tasks

    # -- called from run tasks -------------------------------------------------------------

    def finish(self, slot: RunSlot, result: pb.RunResult) -> None:
        """Buffer an attempt's result; the flusher sends it with the credit it frees."""
        if self._in_flight.pop(slot.key, None) is None:
            return  # aborted, or already settled after a cancel
        self._changed_runs.discard(slot.key)
        if not self._unacked:
            self._ack_clock = time.monotonic()
        self._unacked[slot.key] = result
        self._pending.append(result)
        if slot.key in self._adopted:
            self._adopted.discard(slot.key)  # its credit was another node's
        else:
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
        own = len(self._in_flight) - len(self._adopted)
        credits = 0 if self._draining else max(0, self._concurrency - own)
        hello = pb.Hello(worker_id=self._worker_id, job_types=self._job_types, credits=credits, tenant="")
        outbound.put_nowait(pb.WorkerMessage(hello=hello))
        # The Hello's credits already count every finished run, so nothing pending is granted again.
        self._pending, self._pending_credits = [], 0
        for message in _batches(self._unacked.values(), _results_message):
            outbound.put_nowait(message)
        for slot in self._in_flight.values():
            slot.resync()
        self._ack_clock = time.monotonic()  # everything unacknowledged was just sent again
        self._outbound = outbound
        if self._closing.is_set():
            outbound.put_nowait(None)

    def _close_session(self) -> None:
        self._outbound = None
        self._welcomed = False
        self._session_ended = True
        self._settled.set()  # a leaving stream hands its work over once it is down
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
        self._ack_clock = time.monotonic()
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
        # The slot may have moved to another stream by then (hand_over): settle it where it is.
        slot.task.add_done_callback(lambda task: slot.stream._settle_stopped(slot, task))

    def _settle_stopped(self, slot: RunSlot, task: asyncio.Task[None]) -> None:
        if slot.stop_reason is not None and slot.key in self._in_flight:
            now = datetime.now(UTC)
            self.finish(slot, slot.stop_reason.result(slot, now, now))


async def retire_stream(
    stream: NodeStream, serving: asyncio.Task[None], successor: Callable[[], NodeStream | None]
) -> None:
    """Stop one stream gracefully while the worker goes on: no new credits, finish, report, close.

    While its node answers, the stream's handlers finish and their results are acknowledged there;
    once it does not, the stream hands what it holds to ``successor()`` (see :meth:`NodeStream.drain`).
    """
    stream.begin_drain()
    await stream.drain(successor)
    _, late = await asyncio.wait([serving], timeout=_CLOSE_GRACE)
    for task in late:  # the node never ended the stream (or the address never answered)
        task.cancel()
    await asyncio.gather(serving, return_exceptions=True)


async def drain_streams(
    streams: Sequence[NodeStream],
    serving: Sequence[asyncio.Task[None]],
    timeout: float,
    retiring: Mapping[NodeStream, asyncio.Task[None]] | None = None,
) -> None:
    """Stop every stream gracefully: no new credits, finish, report, half-close, await the node.

    Handlers still running after ``timeout`` seconds are cancelled and reported as retryable
    ``WorkerShutdown`` failures (``cancelled`` would end the run for good).

    Args:
        streams: The streams to drain here.
        serving: The :meth:`NodeStream.serve` tasks of every stream, leaving ones included.
        timeout: Seconds for the handlers to finish.
        retiring: Streams already leaving, with their :func:`retire_stream` tasks, which go on
            (a leaving stream may still hand its work to one of ``streams``).
    """
    retiring = retiring or {}
    everything = [*streams, *retiring]
    for stream in everything:
        stream.begin_drain()
    drains = [
        *retiring.values(),
        *(asyncio.create_task(s.drain(), name=f"worker-drain:{s.address}") for s in streams),
    ]
    try:
        late = (await asyncio.wait(drains, timeout=timeout))[1] if drains else set()
        if late:
            running = sum(stream.in_flight for stream in everything)
            log.warning("drain timeout (%g s) passed with %d runs in flight: cancelling them", timeout, running)
            for stream in everything:
                stream.abandon(_SHUTDOWN)
            await asyncio.wait(late, timeout=_ABANDON_GRACE)
            for stream in everything:
                stream.half_close()
        if serving:
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
