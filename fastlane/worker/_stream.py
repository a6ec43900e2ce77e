"""The worker's stream to one node: hello, assignments, heartbeats, results, reconnects.

:class:`NodeStream` keeps what must outlive a connection (a :class:`~fastlane.worker._runs.RunBook`)
and builds the per-connection machinery (reader, writer, result flusher, heartbeat loop) afresh for
every ``WorkerService.Connect`` call, the clock probes included: after each Welcome the stream
estimates its node's clock (:mod:`fastlane.worker._clock`), so that runs the node sends ahead start
on their instant. A stream the worker no longer wants (its node left the cluster)
drains while its node answers and otherwise hands what it holds to another stream: every node
records any result, since all share the database. The public face is :mod:`fastlane.worker`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import grpc

from fastlane._proto import workers_pb2 as pb
from fastlane._proto import workers_pb2_grpc as pb_grpc
from fastlane.domain.models import AttemptOutcome
from fastlane.runtime.clock import StepWatch
from fastlane.worker._clock import ClockEstimate, ClockEstimator
from fastlane.worker._outage import Outage, StreamEnd, unreachable
from fastlane.worker._runs import Launch, RunBook, RunSlot, Verdict, heartbeat_messages, result_messages
from fastlane.worker._terms import NodeTerms

log = logging.getLogger("fastlane.worker")

_DEFAULT_HEARTBEAT_INTERVAL = 5.0
_BACKOFF_START = 0.1
_BACKOFF_CAP = 2.0
_REFUSED_RETRY = 30.0  # seconds between attempts while a node refuses this worker's API token
# Results messages go at most one per RESULT_COALESCE (see _flush_results), so results of runs
# ending close together share one; at once when this many are waiting.
RESULT_COALESCE = 0.004
RESULT_COALESCE_ENOUGH = 256


def coalesce_wait(pending: int, node_credits_left: int, since_last_sent: float, *, awaited: bool = False) -> float:
    """How long finished results wait to share one message: until RESULT_COALESCE has passed
    since the last results message, so a result after a quiet spell goes at once (a workflow's
    next step waits on it) and a busy stream still sends at most one message per RESULT_COALESCE.
    A node that does not ask for prompt results (Welcome.prompt_results: its database has one
    writer, and fewer, fuller writes serve it better) is given ``since_last_sent`` 0: every
    result waits the whole window.

    Not at all when one of them is ``awaited`` (Assignment.awaited: a workflow's next steps wait
    on it; with the leading edge alone, of parallel steps ending within 4 ms of each other the
    last still waited for the window the first opened, the hand-over's largest tail).

    Nor when many are waiting, or when the node has no credit left for this stream. Then every
    slot is busy and runs wait at the node for one: a freed slot is worth more at once than a
    write saved, and holding it made slots free in step (all handlers of a fixed length ending in
    the same 4 ms, waiting runs going out only in those batches, whatever their priority)."""
    if awaited or pending >= RESULT_COALESCE_ENOUGH or node_credits_left <= 0:
        return 0.0
    return max(RESULT_COALESCE - since_last_sent, 0.0)
CHANNEL_OPTIONS: Sequence[tuple[str, Any]] = (
    # gRPC's own reconnect backoff (1 s growing to 120 s) would keep failing our calls long after
    # the node is back; hold it to the same schedule as ours.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    # One assignment may carry a 1 MiB payload and a 1 MiB checkpoint, and a batch several.
    ("grpc.max_receive_message_length", -1),
)

# Opens the channel to one node address: TLS and the API token are the Worker's to configure.
OpenChannel = Callable[[str], grpc.aio.Channel]


def plain_channel(address: str) -> grpc.aio.Channel:
    """A channel without TLS or API token: a development node on loopback."""
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)


# A leaving stream whose node holds a result this long without acknowledging it hands its work on.
_ACK_PATIENCE = 5.0
_HANDOVER_RETRY = 1.0  # how often a leaving stream with no stream to hand over to looks again
# Clock probes: a few in quick succession after each Welcome, for a usable estimate at once, then
# one per heartbeat interval to follow drift. A node that has not echoed any (an older daemon)
# hears one a minute only: it logs each as unexpected.
_QUICK_PROBES = 5
_QUICK_PROBE_GAP = 0.02
_SILENT_NODE_PROBE_INTERVAL = 60.0


class NodeStream:
    """One worker stream to one node, reconnected until closed.

    Args:
        address: ``host:port`` of the node.
        worker_id, job_types: Sent in every Hello: the worker, and the job types it has handlers for.
        concurrency: Credits for this stream: the most attempts it may have in flight.
        launch: Makes the coroutine that runs one assignment and ends with :meth:`finish`.
        open_channel: Opens the channel to a node (TLS and the API token, when configured).
        on_reconnect: Told the address each time the stream is opened again (the worker's metrics).

    Attempts handed over from a leaving stream (:meth:`hand_over`) heartbeat and report here but
    free no credit: this node never granted them.
    """

    def __init__(
        self, address: str, *, worker_id: str, job_types: Sequence[str], concurrency: int, launch: Launch,
        open_channel: OpenChannel = plain_channel, on_reconnect: Callable[[str], None] | None = None,
    ) -> None:
        self.address = address
        self._on_reconnect = on_reconnect or (lambda address: None)
        self._open_channel = open_channel
        self._worker_id = worker_id
        self._job_types = list(job_types)
        self._concurrency = concurrency
        self._launch = launch
        self._runs = RunBook()
        self._beat_wanted, self._closing = asyncio.Event(), asyncio.Event()
        self._next_beat: asyncio.Future[None] | None = None
        self._outbound: asyncio.Queue[pb.ConnectRequest | None] | None = None
        self._welcomed = self._draining = False
        self._terms = NodeTerms()  # what this connection's node reads (its Welcome)
        self._session_ended = False  # since this stream was made: a connection failed or broke
        self._heartbeat_interval = _DEFAULT_HEARTBEAT_INTERVAL
        self._last_end = ""  # why the last stream ended, for the reconnect log line
        self._refused: str | None = None  # the last stream was refused access: why
        self._tls_failure: str | None = None  # the last connection failed its TLS handshake: why
        self._clock = ClockEstimator()
        self._steps = StepWatch()

    @property
    def connected(self) -> bool:
        return self._welcomed

    @property
    def in_flight(self) -> int:
        return len(self._runs.in_flight)

    @property
    def clock_estimate(self) -> ClockEstimate | None:
        """The node's clock relative to this worker's, on the current connection; None if unknown."""
        return self._clock.estimate

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
        channel = self._open_channel(self.address)
        stub = pb_grpc.WorkerServiceStub(channel)
        delay, failures = _BACKOFF_START, 0
        refused_before: str | None = None
        outage = Outage()
        try:
            while not self._closing.is_set():
                if await self._session(stub):
                    delay, failures = _BACKOFF_START, 0
                    if (lasted := outage.ended()) is not None:
                        log.info("reconnected to %s after %.0f s", self.address, lasted)
                if self._closing.is_set():
                    break
                failures += 1
                self._on_reconnect(self.address)
                pause = random.uniform(delay / 2, delay)
                delay = min(delay * 2, _BACKOFF_CAP)
                if self._refused:
                    # The node will not take this worker (its API token, its role or tenant): say so
                    # loudly once, and ask again now and then rather than every second.
                    if self._refused != refused_before:
                        log.error("%s refused this worker: %s; check its token (--token-file or FASTLANE_TOKEN); "
                                  "asking again every %g s", self.address, self._refused, _REFUSED_RETRY)
                    refused_before, pause = self._refused, _REFUSED_RETRY
                elif self._tls_failure:
                    # Not an outage a retry cures by itself: a certificate or CA does not match.
                    if self._tls_failure != refused_before:
                        log.error("could not establish a TLS connection to %s: %s; check --tls-ca (the CA that "
                                  "signed the node's certificate) and --tls-cert/--tls-key", self.address,
                                  self._tls_failure)
                    refused_before = self._tls_failure
                    log.debug("reconnecting to %s in %.2f s (attempt %d, after %s)", self.address, pause, failures,
                              self._last_end)
                else:
                    # INFO as an outage begins, then warnings at growing intervals (_outage.py): not every retry.
                    level = logging.INFO if failures == 1 else logging.DEBUG
                    log.log(level, "reconnecting to %s in %.2f s (attempt %d, after %s)",
                            self.address, pause, failures, self._last_end)
                    if (lasted := outage.warning_due()) is not None:
                        log.warning("%s", unreachable(self.address, lasted, failures, self._last_end))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await self._closing.wait()
        finally:
            await channel.close()

    def begin_drain(self) -> None:
        """Grant no more credits, here or in a later Hello, and take back those granted (Drain):
        the node sends nothing more, and the worker runs down what it was sent."""
        self._draining = True
        if self._welcomed:
            self._send_drain()

    def _send_drain(self) -> None:
        if self._terms.takes_drain and self._outbound is not None:
            self._outbound.put_nowait(pb.ConnectRequest(drain=pb.Drain()))

    async def drain(self, successor: Callable[[], NodeStream | None] | None = None) -> None:
        """Wait until nothing is in flight or unacknowledged, then close the sending side.

        Args:
            successor: For a stream that is leaving while the worker goes on. Once the stream is
                down, or its node has sat on a result for ``_ACK_PATIENCE`` seconds, what is still
                in flight or unacknowledged moves to the stream ``successor()`` names, if any, and
                this one closes at once.
        """
        runs = self._runs
        while runs.in_flight or runs.unacked:
            wait: float | None = None
            if successor is not None:
                stalled = bool(runs.unacked) and time.monotonic() - runs.ack_clock >= _ACK_PATIENCE
                if not self._welcomed or stalled:
                    if (target := successor()) is not None:
                        self.hand_over(target)
                        break
                    wait = _HANDOVER_RETRY  # no stream to take it yet: look again soon
                elif runs.unacked:
                    wait = runs.ack_clock + _ACK_PATIENCE - time.monotonic()
            runs.settled.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await runs.settled.wait()
        self.half_close()

    def hand_over(self, successor: NodeStream) -> None:
        """Move every attempt in flight and every unacknowledged result to ``successor``.

        For a stream whose node is gone or stuck: the attempts heartbeat, and the results are
        reported, through the successor's node instead, which records them in the shared database.
        """
        slots, results = self._runs.take_all()
        successor.adopt(slots, results)
        if slots or results:
            log.info("handed %d runs in flight and %d unacknowledged results from %s over to %s",
                     len(slots), len(results), self.address, successor.address)

    def adopt(self, slots: Sequence[RunSlot], results: Sequence[pb.RunResult]) -> None:
        """Take over attempts and results from a leaving stream; see :meth:`hand_over`."""
        for slot in slots:
            slot.stream = self
        self._runs.adopt(slots, results)
        if slots and self._welcomed:
            self._beat_wanted.set()  # renew their leases through this node now

    def half_close(self) -> None:
        """Close the sending side; assignments that still arrive are not started."""
        self._closing.set()
        if self._outbound is not None:
            self._outbound.put_nowait(None)

    def abandon(self, verdict: Verdict) -> None:
        """Cancel every handler, reporting ``verdict`` for each."""
        self._runs.abandon(verdict)

    def abort(self) -> list[asyncio.Task[None]]:
        """Cancel every handler without reporting; return the tasks so the caller can await them."""
        return self._runs.abort()

    # -- called from run tasks -------------------------------------------------------------

    def finish(self, slot: RunSlot, result: pb.RunResult) -> None:
        """Buffer an attempt's result; the flusher sends it with the credit it frees."""
        self._runs.finish(slot, result)

    def mark_changed(self, slot: RunSlot) -> None:
        self._runs.mark_changed(slot.key)

    async def beat_now(self, slot: RunSlot) -> None:
        """Ask for a prompt heartbeat carrying ``slot``; return once it is queued for the node."""
        self._runs.mark_changed(slot.key)
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
        outbound: asyncio.Queue[pb.ConnectRequest | None] = asyncio.Queue()
        self._open(outbound)
        welcomed = asyncio.Event()
        reader = asyncio.create_task(self._read(call, welcomed), name=f"worker-read:{self.address}")
        helpers = [
            asyncio.create_task(self._write(call, outbound), name=f"worker-write:{self.address}"),
            asyncio.create_task(self._flush_results(outbound), name=f"worker-results:{self.address}"),
            asyncio.create_task(self._send_heartbeats(welcomed), name=f"worker-heartbeats:{self.address}"),
            asyncio.create_task(self._probe_clock(welcomed), name=f"worker-clock:{self.address}"),
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

    def _open(self, outbound: asyncio.Queue[pb.ConnectRequest | None]) -> None:
        credits = 0 if self._draining else max(0, self._concurrency - self._runs.own_in_flight)
        hello = pb.Hello(worker_id=self._worker_id, job_types=self._job_types, credits=credits, tenant="")
        outbound.put_nowait(pb.ConnectRequest(hello=hello))
        for message in result_messages(self._runs.resend_all()):
            outbound.put_nowait(message)
        self._outbound = outbound
        self._clock.reset()  # the address may now reach another node, or the same one restarted
        if self._closing.is_set():
            outbound.put_nowait(None)

    def _close_session(self) -> None:
        self._outbound = None
        self._welcomed = False
        self._terms = NodeTerms()
        self._session_ended = True
        self._runs.settled.set()  # a leaving stream hands its work over once it is down
        waiter, self._next_beat = self._next_beat, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _log_end(self, welcomed: bool, error: BaseException | None) -> None:
        end = StreamEnd.of(error)
        self._last_end = end.text
        self._refused = end.text if end.refused else None
        self._tls_failure = end.text if end.tls_failed else None
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
                self._runs.acknowledge(message.acks.acks)
            elif body == "cancel":
                cancel = message.cancel
                self._runs.cancel(cancel.runs, Verdict(AttemptOutcome.CANCELLED, "", cancel.reason),
                                  unstarted_only=cancel.unstarted_only)
            elif body == "clock_echo":
                self._clock_echo(message.clock_echo, self._wall_ns())
            elif body == "welcome":
                self._welcome(message.welcome, welcomed)

    async def _write(self, call: Any, outbound: asyncio.Queue[pb.ConnectRequest | None]) -> None:
        while (message := await outbound.get()) is not None:
            await call.write(message)
        await call.done_writing()

    async def _flush_results(self, outbound: asyncio.Queue[pb.ConnectRequest | None]) -> None:
        # Results of runs finishing within RESULT_COALESCE of the last message go in one message,
        # with the credits they free (in a CreditGrant of its own to a node older than
        # Welcome.takes_credits_with_results). Each message costs the worker's loop more than the
        # results it carries, so a message (and a grant) per run would make the stream's writes the
        # largest cost on that loop at a steady rate, and it is the loop that must start held runs
        # on their instant.
        loop = asyncio.get_running_loop()
        last_sent = -RESULT_COALESCE
        while True:
            await self._runs.results_ready.wait()
            runs = self._runs
            credits_left = self._concurrency - runs.own_in_flight - runs.pending_credits
            quiet_for = loop.time() - last_sent if self._terms.prompt_results else 0.0
            if wait := coalesce_wait(runs.pending_count, credits_left, quiet_for, awaited=runs.pending_awaited):
                await asyncio.sleep(wait)
            last_sent = loop.time()
            self._runs.results_ready.clear()
            beats = list(heartbeat_messages(self._runs.take_final_beats()))
            batch, credits = self._runs.take_pending()
            messages = list(result_messages(batch))
            for message in beats:  # on the same stream just before the results: the node records them first
                outbound.put_nowait(message)
            grant = 0 if self._draining else credits
            if grant and messages and self._terms.credits_with_results:
                messages[-1].results.credits, grant = grant, 0  # one message: a node that says it reads them
            for message in messages:
                outbound.put_nowait(message)
            if grant:
                outbound.put_nowait(pb.ConnectRequest(credit=pb.CreditGrant(credits=grant)))

    async def _send_heartbeats(self, welcomed: asyncio.Event) -> None:
        await welcomed.wait()
        loop = asyncio.get_running_loop()
        if self._runs.in_flight:
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

    async def _probe_clock(self, welcomed: asyncio.Event) -> None:
        await welcomed.wait()
        for _ in range(_QUICK_PROBES):
            self._send_probe()
            await asyncio.sleep(_QUICK_PROBE_GAP)
        while True:
            await asyncio.sleep(self._heartbeat_interval if self._clock.echoed else _SILENT_NODE_PROBE_INTERVAL)
            self._send_probe()

    def _send_probe(self) -> None:
        if self._outbound is not None:
            self._outbound.put_nowait(pb.ConnectRequest(clock_probe=self._clock.probe(self._wall_ns())))

    def _queue_beats(self, *, full: bool) -> None:
        slots = self._runs.beats_due(full=full)
        if self._outbound is not None:
            for message in heartbeat_messages(slot.beat() for slot in slots):
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
                self.address, welcome.node_id or "?", self._heartbeat_interval, len(self._runs.in_flight),
            )
        self._welcomed = True
        self._terms = NodeTerms.of(welcome)
        if self._draining:
            self._send_drain()  # reconnected while stopping: the Hello granted nothing, but say so
        welcomed.set()

    def _clock_echo(self, echo: pb.ClockEcho, received_ns: int) -> None:
        sample = self._clock.echo(echo, received_ns)
        if sample is None:
            log.debug("ignored a clock echo from %s (probe %d): unknown, repeated or absurd", self.address,
                      echo.probe_id)
            return
        if (estimate := self._clock.estimate) is not None:
            log.debug("clock of %s: sample offset %+.3f ms (round trip %.3f ms); estimate %+.3f ms ± %.3f ms",
                      self.address, sample.offset_ns / 1e6, sample.round_trip_ns / 1e6,
                      estimate.offset_s * 1e3, estimate.uncertainty_s * 1e3)

    def _start_runs(self, assignments: Iterable[pb.Assignment], received_at: datetime) -> None:
        if self._closing.is_set():
            return  # we said goodbye: the node treats these like runs of a worker that left
        self._wall_ns()  # a step since the last reading moves the estimate first
        self._runs.start(self, assignments, received_at, self._launch, self._clock.offset_ns)

    def _wall_ns(self) -> int:
        """The wall clock; a step of it since the last reading (against the monotonic clock)
        moves the estimate of the node's clock with it, so no held run starts early or late by it."""
        wall, jump = self._steps.read()
        if jump:
            self._clock.stepped(jump)
            log.warning("this worker's wall clock stepped %+.1f ms: the estimate of %s's clock moved with it",
                        jump / 1e6, self.address)
        return wall
