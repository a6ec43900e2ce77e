"""The attempts a worker runs for one node stream: outcomes, timeouts, cancellation, results.

:func:`run_attempt` holds an attempt sent ahead until its start instant, then runs its handler
under its timeout, and :func:`judge_attempt` maps how it ended to the protocol's outcomes.
:class:`RunSlot` is the mutable side of one attempt in flight, and :class:`RunBook` holds, for one stream, the attempts in flight and the results the node has not
acknowledged: it outlives the stream's connections, and gives all it holds to another stream's book
when its node leaves. :func:`result_messages` and :func:`heartbeat_messages` pack them into as few messages as fit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from fastlane._proto import workers_pb2 as pb
from fastlane.domain.limits import MAX_CHECKPOINT_BYTES
from fastlane.domain.models import AttemptOutcome
from fastlane.errors import PermanentError
from fastlane.rpc.enums import ATTEMPT_OUTCOME
from fastlane.rpc.wire import timestamp
from fastlane.worker._failures import FailureLog, format_traceback
from fastlane.worker._hold import StartTimer
from fastlane.worker._metrics import WorkerMetrics

log = logging.getLogger("fastlane.worker")

# A node sends a run at most --send-ahead (at most 1 s) before its instant; with clock uncertainty
# and a slow stream on top, a start_at further ahead than this means a clock or the estimate of
# it is off. The run is held all the same (never started early) and the oddity logged.
MAX_HOLD_NS = 10_000_000_000
# A first attempt not sent ahead that comes late (due LATE_NS or more ago: it waited for a credit,
# out of a backlog) when a held run's instant is at most YIELD_NS away waits for that instant and
# starts just after it: starting a batch of runs keeps the loop a fraction of a
# millisecond, which a run promised its instant would otherwise wait out (a quiet tenant's held
# run due while a batch of a flooding tenant's late runs starts), and a run already that late
# loses nothing by it.
LATE_NS = 10_000_000
YIELD_NS = 2_000_000

RunKey = tuple[str, int]  # (run_id, lease_token): one attempt
Launch = Callable[["RunSlot", pb.Assignment, datetime], Coroutine[Any, Any, None]]
_Item = TypeVar("_Item", pb.RunResult, pb.RunHeartbeat)

MAX_ERROR_MESSAGE = 2000
# A node receives at most max(--max-payload-bytes, MAX_CHECKPOINT_BYTES) plus an envelope in one
# message (fastlane.server.grpc_server.max_message_bytes) and refuses the stream beyond it, so a
# batch is cut at the bound every node takes: a heartbeat with the largest checkpoint still fits.
_MESSAGE_BUDGET = MAX_CHECKPOINT_BYTES


@dataclass(frozen=True, slots=True)
class Verdict:
    """How an attempt ended, before it is stamped with its run and times."""

    outcome: AttemptOutcome
    error_code: str = ""
    error_message: str = ""
    traceback: str = ""  # the handler's, if it raised (format_traceback: already cut)

    def result(self, slot: RunSlot, started_at: datetime, finished_at: datetime) -> pb.RunResult:
        return pb.RunResult(
            run_id=slot.run_id,
            lease_token=slot.lease_token,
            outcome=ATTEMPT_OUTCOME.number(self.outcome),
            error_code=self.error_code,
            error_message=self.error_message[:MAX_ERROR_MESSAGE],
            started_at=timestamp(started_at),
            finished_at=timestamp(finished_at),
            error_traceback=self.traceback,
            output=slot.output if self.outcome is AttemptOutcome.SUCCEEDED else b"",
        )


_SUCCEEDED = Verdict(AttemptOutcome.SUCCEEDED)
# Outcomes of a handler that went wrong: logged (FailureLog), with the traceback where it raised.
_LOGGED = frozenset({AttemptOutcome.FAILED, AttemptOutcome.PERMANENT_FAILURE, AttemptOutcome.TIMED_OUT})
FAILURES = FailureLog()  # one per worker process: its budget is per job type


async def run_attempt(
    slot: RunSlot, assignment: pb.Assignment, call: Callable[[], Awaitable[None]] | None, starts: StartTimer,
    metrics: WorkerMetrics | None = None,
) -> None:
    """Run one assigned attempt (``call``, or ``None`` if no handler takes its type) and report it.

    An attempt sent ahead (``slot.start_at_ns`` set) is held until that instant first, by
    ``starts``; a late one not sent ahead may wait a moment for a held one to start first
    (:func:`yield_to_held`). Stopped while waiting (cancelled, withdrawn, the worker shutting
    down), it never calls ``call`` and reports the stop's verdict.
    """
    timeout = assignment.timeout.ToTimedelta().total_seconds() if assignment.HasField("timeout") else None
    if call is None:
        now = datetime.now(UTC)
        verdict = Verdict(AttemptOutcome.FAILED, "UnknownJobType", f"no handler here for {assignment.job_type!r}")
        slot.stream.finish(slot, verdict.result(slot, now, now))
        return
    if slot.start_at_ns is not None and not await _hold(slot, starts, slot.start_at_ns):
        return
    if slot.start_at_ns is None and slot.due_ns is not None:
        instant = yield_to_held(slot.due_ns, starts.alarm_set_for, time.time_ns())
        if instant is not None and not await _hold(slot, starts, instant, behind=True):
            return
    started_at = slot.begin()
    attempt = judge_attempt(call, slot, timeout or None)
    verdict = await (attempt if metrics is None else metrics.observed(assignment.job_type, attempt))
    slot.stream.finish(slot, verdict.result(slot, started_at, datetime.now(UTC)))
    if verdict.outcome in _LOGGED:
        error = f"{verdict.error_code}: {verdict.error_message}"
        FAILURES.failed(job_type=assignment.job_type, run_id=slot.run_id, attempt=assignment.attempt,
                        outcome=verdict.outcome.value, error=error, traceback_text=verdict.traceback or error)


def yield_to_held(due_ns: int, held_instant_ns: int | None, now_ns: int) -> int | None:
    """The instant a first attempt not sent ahead, due at ``due_ns`` (this worker's clock), is to
    wait for: the next held run's (``held_instant_ns``, None if none; it may have passed, the alarm
    not rung yet) if that is at most :data:`YIELD_NS` away and the run was due :data:`LATE_NS` ago
    or more; else None, to start it at once."""
    if held_instant_ns is None or held_instant_ns - now_ns > YIELD_NS or due_ns > now_ns - LATE_NS:
        return None
    return held_instant_ns


def held_until(start_at_ns: int, now_ns: int) -> int:
    """The instant to hold a run sent ahead until: its ``start_at``, however far ahead, since a
    run never starts before its instant; one more than :data:`MAX_HOLD_NS` ahead is logged, as a
    sign of a clock (or the estimate of the node's) that is off."""
    if start_at_ns - now_ns > MAX_HOLD_NS:
        log.warning("an assignment's start_at is %.1f s ahead (at most %.0f s expected): holding it until then; "
                    "check the clocks of this host and the node's", (start_at_ns - now_ns) / 1e9, MAX_HOLD_NS / 1e9)
    return start_at_ns


async def _hold(slot: RunSlot, starts: StartTimer, instant_ns: int, *, behind: bool = False) -> bool:
    """Wait for the start instant (``behind``: after the waits queued for it); False if the
    attempt was stopped meanwhile (and is reported)."""
    try:
        await starts.wait_until(instant_ns, behind=behind)
    except asyncio.CancelledError:
        verdict = _stopped(slot)
        now = datetime.now(UTC)
        slot.stream.finish(slot, verdict.result(slot, now, now))
        return False
    return True


def _stopped(slot: RunSlot) -> Verdict:
    """Inside ``except CancelledError``: the attempt's own stop (cancel, withdrawal, drain timeout)
    is absorbed and its verdict returned; a cancel of the worker itself propagates."""
    if slot.stop_reason is None:
        raise asyncio.CancelledError  # the worker itself is being torn down: nothing to report
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
    return slot.stop_reason


async def judge_attempt(call: Callable[[], Awaitable[None]], slot: RunSlot, timeout: float | None) -> Verdict:
    """Await a handler call and say how it ended, as the protocol's outcomes."""
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            await call()
    except asyncio.CancelledError:
        return _stopped(slot)
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
    """The verdict on a handler that raised ``exc``: its type, message and traceback (logged by
    :func:`run_attempt`, through :data:`FAILURES`, which keeps a failing job type from flooding the log)."""
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not lose the result
        message = f"<unprintable {type(exc).__name__}>"
    try:
        traced = format_traceback(exc)
    except Exception:  # nor a broken exception's frames
        traced = ""
    return Verdict(outcome, type(exc).__name__, message, traced)


class RunReporter(Protocol):
    """The stream an attempt in flight reports through (a :class:`~fastlane.worker._stream.NodeStream`)."""

    def finish(self, slot: RunSlot, result: pb.RunResult) -> None: ...

    def mark_changed(self, slot: RunSlot) -> None: ...

    async def beat_now(self, slot: RunSlot) -> None: ...


class RunSlot:
    """The mutable side of one attempt in flight: its task, start, progress, checkpoint, stop reason.

    An attempt sent ahead is *held* from its receipt until its start instant: in flight (it took a
    credit, it heartbeats with ``started=false``) but with no handler running yet.
    """

    __slots__ = (
        "stream", "run_id", "lease_token", "start_at_ns", "due_ns", "started_at", "task", "progress",
        "sent_progress", "checkpoint", "unsent_checkpoint", "stop_reason", "output", "awaited",
    )

    def __init__(self, stream: RunReporter, run_id: str, lease_token: int, start_at_ns: int | None = None,
                 due_ns: int | None = None, *, awaited: bool = False) -> None:
        self.stream = stream
        self.run_id = run_id
        self.lease_token = lease_token
        self.start_at_ns = start_at_ns  # when to start the handler (worker clock, ns); None: on receipt
        # When a first attempt was due (worker clock, ns); None for a retry, whose own time (after
        # its backoff) is not on the wire, or when not said.
        self.due_ns = due_ns
        self.started_at: datetime | None = None  # when the handler was started
        self.task: asyncio.Task[None] | None = None
        self.progress: float | None = None
        self.sent_progress: float | None = None
        self.checkpoint: bytes | None = None  # the latest this attempt saved
        self.unsent_checkpoint: bytes | None = None
        self.stop_reason: Verdict | None = None  # set when the worker itself cancels the handler
        self.output = b""  # what the handler returned, as JSON (a workflow step's result)
        self.awaited = awaited  # others wait on its result: sent at once (Assignment.awaited)

    @property
    def key(self) -> RunKey:
        return (self.run_id, self.lease_token)

    @property
    def held(self) -> bool:
        """Whether the attempt was sent ahead and waits for its start instant: no handler runs yet.

        An attempt not sent ahead is never held, even in the instant before its task first runs.
        """
        return self.start_at_ns is not None and self.started_at is None

    def begin(self) -> datetime:
        """Note that the handler starts now; the next heartbeat says so. Returns the instant."""
        self.started_at = datetime.now(UTC)
        if self.start_at_ns is not None:
            self.stream.mark_changed(self)  # the node heard started=false for it until now
        return self.started_at

    def set_progress(self, fraction: float) -> None:
        self.progress = fraction
        self.stream.mark_changed(self)

    def set_checkpoint(self, data: bytes) -> None:
        self.checkpoint = self.unsent_checkpoint = data
        self.stream.mark_changed(self)

    async def heartbeat(self) -> None:
        await self.stream.beat_now(self)

    def beat(self) -> pb.RunHeartbeat:
        beat = pb.RunHeartbeat(run_id=self.run_id, lease_token=self.lease_token, started=not self.held,
                               started_at=timestamp(self.started_at) if self.started_at is not None else None)
        if self.progress is not None and self.progress != self.sent_progress:
            beat.progress = self.sent_progress = self.progress
        if self.unsent_checkpoint is not None:
            beat.checkpoint, self.unsent_checkpoint = self.unsent_checkpoint, None
        return beat

    def has_unsent_state(self) -> bool:
        """Whether the node has not heard this attempt's latest progress or checkpoint."""
        return self.unsent_checkpoint is not None or (self.progress is not None and self.progress != self.sent_progress)

    def resync(self) -> None:
        # A new connection may reach a node that never saw the last beat: send everything again.
        self.sent_progress = None
        self.unsent_checkpoint = self.checkpoint

    def stop(self, verdict: Verdict) -> None:
        """Cancel the handler, reporting ``verdict`` for it."""
        if self.stop_reason is not None or self.task is None:
            return
        self.stop_reason = verdict
        self.task.cancel()
        # A task cancelled before its first step never runs its body, so it reports nothing itself.
        # The slot may have moved to another stream by then (hand_over): settle it where it is.
        self.task.add_done_callback(self._settle_stopped)

    def _settle_stopped(self, task: asyncio.Task[None]) -> None:
        if self.stop_reason is not None:
            now = datetime.now(UTC)
            self.stream.finish(self, self.stop_reason.result(self, now, now))  # no-op if already reported


class RunBook:
    """One stream's attempts in flight and the results its node has not acknowledged.

    Results wait in ``pending`` (with the credits their runs free) until the stream's flusher sends
    them, and in ``unacked`` until the node acknowledges them. Attempts adopted from a leaving stream
    report here but free no credit: this stream's node never granted them.
    """

    def __init__(self) -> None:
        self.in_flight: dict[RunKey, RunSlot] = {}
        self.unacked: dict[RunKey, pb.RunResult] = {}
        self._adopted: set[RunKey] = set()  # in flight here, assigned through another stream
        self.ack_clock = time.monotonic()  # last ack, or when the first unacked result appeared
        self._pending: list[pb.RunResult] = []  # finished, not yet written to the current connection
        self._pending_credits = 0
        self.pending_awaited = False  # a result others wait on is among the pending
        self._changed: set[RunKey] = set()  # due in the next prompt heartbeat
        # The last heartbeat of attempts that ended with progress or a checkpoint the node has not
        # heard: sent just before their results, so that a retry resumes from what the handler saved.
        self._final_beats: list[pb.RunHeartbeat] = []
        self.results_ready = asyncio.Event()
        self.settled = asyncio.Event()  # a run finished, a result was acknowledged, the stream went down

    @property
    def own_in_flight(self) -> int:
        """The attempts in flight on this stream's own credits."""
        return len(self.in_flight) - len(self._adopted)

    def start(
        self,
        reporter: RunReporter,
        assignments: Iterable[pb.Assignment],
        received_at: datetime,
        launch: Launch,
        clock_offset_ns: int | None = None,
    ) -> None:
        """Launch a task for each new assignment; the slots report through ``reporter``.

        An assignment sent ahead is held until its ``start_at`` (node clock), translated to this
        worker's clock with ``clock_offset_ns`` (node minus worker; None: taken as 0) once, here:
        the instant stays the same if the attempt later moves to another stream.
        """
        loop = asyncio.get_running_loop()
        for assignment in assignments:
            key = (assignment.run_id, assignment.lease_token)
            if key in self.in_flight or key in self.unacked:
                log.warning("ignoring a repeated assignment of run %s (lease %d)", *key)
                continue
            start_at_ns = due_ns = None
            if assignment.HasField("start_at"):
                start_at_ns = held_until(assignment.start_at.ToNanoseconds() - (clock_offset_ns or 0), time.time_ns())
            elif assignment.attempt <= 1 and assignment.HasField("scheduled_for"):
                due_ns = assignment.scheduled_for.ToNanoseconds() - (clock_offset_ns or 0)
            slot = RunSlot(reporter, assignment.run_id, assignment.lease_token, start_at_ns, due_ns,
                           awaited=assignment.awaited)
            self.in_flight[key] = slot
            slot.task = loop.create_task(launch(slot, assignment, received_at), name=f"run:{assignment.run_id}")

    def mark_changed(self, key: RunKey) -> None:
        self._changed.add(key)

    def finish(self, slot: RunSlot, result: pb.RunResult) -> None:
        """Buffer an attempt's result with the credit it frees."""
        if self.in_flight.pop(slot.key, None) is None:
            return  # aborted, or already settled after a cancel
        self._changed.discard(slot.key)
        if slot.has_unsent_state():
            self._final_beats.append(slot.beat())
        if not self.unacked:
            self.ack_clock = time.monotonic()
        self.unacked[slot.key] = result
        self._pending.append(result)
        self.pending_awaited |= slot.awaited
        if slot.key in self._adopted:
            self._adopted.discard(slot.key)  # its credit was another node's
        else:
            self._pending_credits += 1
        self.results_ready.set()
        self.settled.set()

    def acknowledge(self, acks: Iterable[pb.ResultAck]) -> None:
        for ack in acks:
            self.unacked.pop((ack.run_id, ack.lease_token), None)
        self.ack_clock = time.monotonic()
        self.settled.set()

    @property
    def pending_credits(self) -> int:
        """Credits freed by finished runs and not yet granted to the node."""
        return self._pending_credits

    @property
    def pending_count(self) -> int:
        """Results finished and not yet taken for sending."""
        return len(self._pending)

    def take_final_beats(self) -> list[pb.RunHeartbeat]:
        """The heartbeats to send before the pending results (see ``_final_beats``); then forgotten."""
        beats, self._final_beats = self._final_beats, []
        return beats

    def take_pending(self) -> tuple[list[pb.RunResult], int]:
        """The results not yet sent and the credits they free; both are then forgotten here."""
        batch, self._pending = self._pending, []
        credits, self._pending_credits = self._pending_credits, 0
        self.pending_awaited = False
        return batch, credits

    def resend_all(self) -> list[pb.RunResult]:
        """For a new connection: every unacknowledged result, and every attempt's full state again."""
        # The Hello's credits already count every finished run, so nothing pending is granted again.
        self._pending, self._pending_credits, self.pending_awaited = [], 0, False
        for slot in self.in_flight.values():
            slot.resync()
        self.ack_clock = time.monotonic()  # everything unacknowledged is about to be sent again
        return list(self.unacked.values())

    def beats_due(self, *, full: bool) -> list[RunSlot]:
        """The attempts the next heartbeat carries: all of them, or those that changed."""
        if full:
            slots = list(self.in_flight.values())
        else:
            slots = [slot for key in self._changed if (slot := self.in_flight.get(key)) is not None]
        self._changed.clear()
        return slots

    def take_all(self) -> tuple[list[RunSlot], list[pb.RunResult]]:
        """Give up every attempt in flight and every unacknowledged result, for another stream."""
        slots, results = list(self.in_flight.values()), list(self.unacked.values())
        self.in_flight, self.unacked = {}, {}
        self._adopted.clear()
        self._changed.clear()
        self._pending, self._pending_credits, self.pending_awaited = [], 0, False
        self.settled.set()
        return slots, results

    def adopt(self, slots: Sequence[RunSlot], results: Sequence[pb.RunResult]) -> None:
        """Take over what another stream gave up (:meth:`take_all`)."""
        if results and not self.unacked:
            self.ack_clock = time.monotonic()
        for slot in slots:
            slot.resync()  # this node may not have heard the last progress or checkpoint
            self.in_flight[slot.key] = slot
            self._adopted.add(slot.key)
            self._changed.add(slot.key)
        for result in results:
            key = (result.run_id, result.lease_token)
            if key not in self.unacked:
                self.unacked[key] = result
                self._pending.append(result)
        if results:
            self.results_ready.set()
        self.settled.set()

    def cancel(self, runs: Iterable[pb.ResultAck], verdict: Verdict, *, unstarted_only: bool = False) -> None:
        """Stop the listed attempts; with ``unstarted_only`` (a withdrawal), only the held ones."""
        for ref in runs:
            slot = self.in_flight.get((ref.run_id, ref.lease_token))
            if slot is not None and (slot.held or not unstarted_only):
                slot.stop(verdict)

    def abandon(self, verdict: Verdict) -> None:
        for slot in list(self.in_flight.values()):
            slot.stop(verdict)

    def abort(self) -> list[asyncio.Task[None]]:
        tasks = [slot.task for slot in self.in_flight.values() if slot.task is not None]
        self.in_flight.clear()
        self._adopted.clear()
        for task in tasks:
            task.cancel()
        return tasks


def result_messages(results: Iterable[pb.RunResult]) -> Iterator[pb.ConnectRequest]:
    return _batches(results, lambda batch: pb.ConnectRequest(results=pb.Results(results=batch)))


def heartbeat_messages(beats: Iterable[pb.RunHeartbeat]) -> Iterator[pb.ConnectRequest]:
    return _batches(beats, lambda batch: pb.ConnectRequest(heartbeats=pb.Heartbeats(beats=batch)))


def _batches(items: Iterable[_Item], wrap: Callable[[list[_Item]], pb.ConnectRequest]) -> Iterator[pb.ConnectRequest]:
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
