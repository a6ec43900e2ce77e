"""WorkerService: one bidirectional stream per worker, bridged to the dispatcher.

A reader task turns the worker's messages into dispatcher calls; the handler itself writes what
the dispatcher puts in the session's outbox. Reads and writes run concurrently on the call.

Every message is validated whole before any of it reaches the dispatcher. A bad Hello, and
likewise a bad later message, ends the stream with INVALID_ARGUMENT naming the field (e.g.
``results.results[3].run_id``). Ending the stream, rather than refusing the one item, because
the protocol has no per-item refusal (an acknowledgement means "durable"), so a silently dropped
item would look to the worker like a slow node; the status is the one answer it can see, and the
SDK itself never sends what is refused here. Error codes and messages are the exception: they are
a handler's arbitrary exception text, so they are cut to ``MAX_ERROR_TEXT`` and cleaned, not refused.

A clock probe is answered at once with a ClockEcho carrying this node's time when the probe was
read; the estimate it reports decides whether the worker is sent runs ahead of their instant
(see :mod:`fastlane.engine.dispatch.send_ahead`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import TypeAlias, TypeVar

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from fastlane._proto import workers_pb2, workers_pb2_grpc
from fastlane.auth.caller import qualified_worker_id, worker_tenant
from fastlane.domain import validation
from fastlane.domain.errors import PermissionDenied
from fastlane.domain.limits import (
    MAX_CHECKPOINT_BYTES,
    MAX_CREDITS,
    MAX_JOB_TYPES,
    MAX_WORKER_CLOCK_OFFSET,
    MAX_WORKER_CLOCK_UNCERTAINTY,
)
from fastlane.domain.workflow_definitions import output_of
from fastlane.domain.workflows import WORKFLOW_JOB_TYPE
from fastlane.engine.dispatch.dispatcher import Dispatcher
from fastlane.engine.dispatch.lease_tokens import MAX_LEASE_TOKEN
from fastlane.engine.dispatch.messages import Acknowledge, Assign, Cancel, ClockEcho, Outgoing, WorkerSession
from fastlane.engine.dispatch.send_ahead import ClockProbe
from fastlane.errors import InvalidArgument
from fastlane.rpc import wire
from fastlane.rpc.enums import reported_outcome
from fastlane.storage import AttemptResult, Heartbeat

# A worker stream: WorkerMessages in, NodeMessages out.
WorkerContext: TypeAlias = grpc.aio.ServicerContext[workers_pb2.ConnectRequest, workers_pb2.ConnectResponse]

T = TypeVar("T")
M = TypeVar("M")

log = logging.getLogger("fastlane.api.workers")

# Merged assignments stop growing at this many runs: a message stays well under gRPC's 4 MiB.
MAX_RUNS_PER_MESSAGE = 1_000



class WorkerServicer(workers_pb2_grpc.WorkerServiceServicer):
    def __init__(self, dispatcher: Dispatcher, *, node_id: str, heartbeat_interval: timedelta,
                 prompt_results: bool = True) -> None:
        self._dispatcher = dispatcher
        self._node_id = node_id
        self._heartbeat_interval = heartbeat_interval
        self._prompt_results = prompt_results  # told to workers: see Welcome.prompt_results

    async def Connect(self, request_iterator: object, context: WorkerContext) -> None:
        first = await context.read()
        # types-grpcio's read() omits the EOF it returns at the end of the stream
        if first is grpc.aio.EOF or first.WhichOneof("body") != "hello":  # type: ignore[comparison-overlap]
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message on a worker stream must be a hello")
        hello = first.hello
        try:
            validate_hello(hello)
        except InvalidArgument as error:
            # The id is not logged as sent: it may be what is wrong (control characters, length).
            log.warning("refused a worker stream: %s", error)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        try:
            tenant = worker_tenant(hello.tenant)
        except PermissionDenied as error:
            log.warning("refused a worker stream: %s", error)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(error))
        await context.write(workers_pb2.ConnectResponse(welcome=workers_pb2.Welcome(
            node_id=self._node_id, heartbeat_interval=wire.duration(self._heartbeat_interval),
            takes_credits_with_results=True, prompt_results=self._prompt_results, takes_drain=True)))
        # Under a tenant's token, the worker id is qualified by the tenant: reports are checked by
        # worker id, so a worker of one tenant can never pass for another tenant's worker.
        session = self._dispatcher.connect(qualified_worker_id(hello.worker_id), hello.job_types, hello.credits, tenant)
        reader = asyncio.create_task(self._read(session, context), name=f"worker-read:{hello.worker_id}")
        try:
            while True:
                outgoing = await _next(session, reader)
                if outgoing is None:
                    break
                for message in coalesced(outgoing, session):
                    await context.write(_to_pb(message))
            if (refused := _refusal(reader)) is not None:
                log.warning("ended the stream of worker %s: %s", session.worker_id, refused)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(refused))
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self._dispatcher.disconnect(session)

    async def _read(self, session: WorkerSession, context: WorkerContext) -> None:
        """Pass the worker's messages to the dispatcher; raises InvalidArgument at a bad one."""
        while True:
            message = await context.read()
            if message is grpc.aio.EOF:  # type: ignore[comparison-overlap]  # EOF: a stub gap, as in Connect
                return
            body = message.WhichOneof("body")
            if body == "credit":
                self._dispatcher.grant(session, validation.count("credit.credits", message.credit.credits, 0, MAX_CREDITS))
            elif body == "heartbeats":
                self._dispatcher.heartbeats(session, heartbeats_of(message.heartbeats, worker_offset=session.clock_offset))
            elif body == "results":
                results = results_of(message.results, worker_offset=session.clock_offset)
                freed = validation.count("results.credits", message.results.credits, 0, MAX_CREDITS)
                self._dispatcher.results(session, results)
                if freed:  # after the results, as when a CreditGrant follows them
                    self._dispatcher.grant(session, freed)
            elif body == "clock_probe":
                self._dispatcher.clock_probed(session, clock_probe_of(message.clock_probe))
            elif body == "drain":
                self._dispatcher.drain(session)
            else:
                log.warning("worker %s sent an unexpected %s message", session.worker_id, body)


async def _next(session: WorkerSession, reader: asyncio.Task[None]) -> Outgoing | None:
    """The next message to send, or None once the worker's side of the stream has ended."""
    if not session.outbox.empty():
        return session.outbox.get_nowait()
    getter = asyncio.ensure_future(session.outbox.get())
    done, _ = await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
    if getter in done:
        return getter.result()
    getter.cancel()
    return None


def coalesced(first: Outgoing, session: WorkerSession) -> list[Outgoing]:
    """``first`` and everything queued behind it, consecutive assignments (and acknowledgements)
    merged into one message each: under load one write carries many runs. Order is kept, so a
    cancel never overtakes the assignment it cancels."""
    messages = [first]
    while not session.outbox.empty():
        following = session.outbox.get_nowait()
        last = messages[-1]
        if isinstance(last, Assign) and isinstance(following, Assign) and len(last.runs) < MAX_RUNS_PER_MESSAGE:
            messages[-1] = Assign(last.runs + following.runs)
        elif isinstance(last, Acknowledge) and isinstance(following, Acknowledge):
            messages[-1] = Acknowledge(last.results + following.results)
        else:
            messages.append(following)
    return messages


def _refusal(reader: asyncio.Task[None]) -> InvalidArgument | None:
    """Why the reader stopped reading, if it was a bad message."""
    if not reader.done() or reader.cancelled():
        return None
    error = reader.exception()
    return error if isinstance(error, InvalidArgument) else None


# -- what a worker sends, validated ------------------------------------------------------------


def validate_hello(hello: workers_pb2.Hello) -> None:
    """Raise :class:`InvalidArgument` naming the first field of ``hello`` out of bounds."""
    validation.identifier("hello.worker_id", hello.worker_id)
    validation.count("hello.job_types (how many)", len(hello.job_types), 1, MAX_JOB_TYPES)
    for index, job_type in enumerate(hello.job_types):
        validation.name(f"hello.job_types[{index}]", job_type)
        if job_type == WORKFLOW_JOB_TYPE:
            raise InvalidArgument(f"hello.job_types[{index}]", f"{job_type!r} is started by the nodes themselves")
    validation.count("hello.credits", hello.credits, 0, MAX_CREDITS)
    if hello.tenant:
        validation.name("hello.tenant", hello.tenant)


def heartbeats_of(message: workers_pb2.Heartbeats, *, worker_offset: timedelta | None = None) -> list[Heartbeat]:
    """The heartbeats of a batch; a handler's start they report is put on this node's clock as a
    result's times are (see :func:`results_of`)."""
    offset = worker_offset or _NO_OFFSET
    return _each("heartbeats.beats", message.beats, lambda beat: _heartbeat(beat, offset))


def results_of(message: workers_pb2.Results, *, worker_offset: timedelta | None = None) -> list[AttemptResult]:
    """The results of a batch. The times they report are on the worker's clock; ``worker_offset``
    (node minus worker, as the worker measured it) puts them on this node's, so history's start
    lags are real ones whatever the worker's clock says."""
    offset = worker_offset or _NO_OFFSET
    return _each("results.results", message.results, lambda result: _result(result, offset))


_NO_OFFSET = timedelta(0)


def clock_probe_of(probe: workers_pb2.ClockProbe) -> ClockProbe:
    """A clock probe within bounds: an offset of at most a day either way, an uncertainty of 0–60 s."""
    uncertainty: timedelta | None = None
    offset: timedelta | None = None
    if probe.HasField("uncertainty"):
        uncertainty = validation.duration("clock_probe.uncertainty", wire.duration_in(
            "clock_probe.uncertainty", probe.uncertainty), timedelta(0), MAX_WORKER_CLOCK_UNCERTAINTY)
    if probe.HasField("offset"):
        offset = validation.duration("clock_probe.offset", wire.duration_in("clock_probe.offset", probe.offset),
                                     -MAX_WORKER_CLOCK_OFFSET, MAX_WORKER_CLOCK_OFFSET)
    return ClockProbe(
        probe_id=probe.probe_id,
        sent_at_ns=_sent_at_ns(probe) if probe.HasField("sent_at") else None,
        uncertainty=uncertainty,
        offset=offset,
    )


def _sent_at_ns(probe: workers_pb2.ClockProbe) -> int:
    """The probe's send time, checked as any instant but kept to the nanosecond: it is echoed."""
    wire.instant_in("clock_probe.sent_at", probe.sent_at)
    return probe.sent_at.seconds * 1_000_000_000 + probe.sent_at.nanos


def _each(field: str, items: Iterable[M], convert: Callable[[M], T]) -> list[T]:
    """Convert every item; an error names the item's index under ``field``. (Names are built
    only on error: a busy worker reports thousands of results a second.)"""
    converted = []
    for index, item in enumerate(items):
        try:
            converted.append(convert(item))
        except InvalidArgument as error:
            raise InvalidArgument(f"{field}[{index}].{error.field}", error.problem) from None
    return converted


def _heartbeat(beat: workers_pb2.RunHeartbeat, offset: timedelta = _NO_OFFSET) -> Heartbeat:
    progress = None
    if beat.HasField("progress"):
        progress = validation.progress(beat.progress)
    checkpoint = None
    if beat.HasField("checkpoint"):
        # Enforced here, not only by the SDK: the checkpoint is stored and handed to the next attempt.
        checkpoint = validation.payload("checkpoint", beat.checkpoint, MAX_CHECKPOINT_BYTES)
    return Heartbeat(
        run_id=validation.identifier("run_id", beat.run_id),
        lease_token=_lease_token("lease_token", beat.lease_token),
        started=beat.started,
        started_at=(wire.instant_in("started_at", beat.started_at) + offset
                    if beat.started and beat.HasField("started_at") else None),
        progress=progress,
        checkpoint=checkpoint,
    )


def _result(result: workers_pb2.RunResult, offset: timedelta = _NO_OFFSET) -> AttemptResult:
    # A busy worker reports thousands of results a second: empty texts skip their cleaning.
    code, message, traceback = result.error_code, result.error_message, result.error_traceback
    return AttemptResult(
        run_id=validation.identifier("run_id", result.run_id),
        lease_token=_lease_token("lease_token", result.lease_token),
        outcome=reported_outcome(result.outcome),
        error_code=validation.error_text(code) if code else None,
        error_message=validation.error_text(message) if message else None,
        error_traceback=validation.traceback_text(traceback) if traceback else None,
        started_at=wire.instant_in("started_at", result.started_at) + offset if result.HasField("started_at") else None,
        finished_at=(wire.instant_in("finished_at", result.finished_at) + offset
                     if result.HasField("finished_at") else None),
        output=output_of(result.output) if result.output else b"",
    )


def _lease_token(field: str, token: int) -> int:
    # Every token a node hands out is positive; another cannot name an attempt.
    return validation.count(field, token, 1, MAX_LEASE_TOKEN)


def _timestamp_of_ns(ns: int | None) -> Timestamp | None:
    if ns is None:
        return None
    seconds, nanos = divmod(ns, 1_000_000_000)
    return Timestamp(seconds=seconds, nanos=nanos)


def _to_pb(outgoing: Outgoing) -> workers_pb2.ConnectResponse:
    if isinstance(outgoing, Assign):
        return workers_pb2.ConnectResponse(assignments=workers_pb2.Assignments(assignments=[
            workers_pb2.Assignment(
                run_id=item.run.run_id,
                job_id=item.run.job_id,
                job_type=item.run.job_type,
                tenant=item.run.tenant,
                attempt=item.attempt,
                payload=item.run.payload,
                scheduled_for=wire.timestamp(item.run.scheduled_for),
                idempotency_key=item.run.idempotency_key,
                lease_token=item.lease_token,
                lease_ttl=wire.duration(item.run.lease_ttl),
                checkpoint=item.run.checkpoint,
                timeout=wire.duration(item.run.timeout),
                released_at=wire.timestamp(item.released_at),
                start_at=wire.timestamp(item.start_at) if item.start_at is not None else None,
                awaited=item.run.workflow_run_id is not None,
            )
            for item in outgoing.runs
        ]))
    if isinstance(outgoing, Acknowledge):
        return workers_pb2.ConnectResponse(acks=workers_pb2.ResultAcks(acks=[
            workers_pb2.ResultAck(run_id=ref.run_id, lease_token=ref.lease_token) for ref in outgoing.results
        ]))
    if isinstance(outgoing, ClockEcho):
        return workers_pb2.ConnectResponse(clock_echo=workers_pb2.ClockEcho(
            probe_id=outgoing.probe_id, probe_sent_at=_timestamp_of_ns(outgoing.probe_sent_at_ns),
            node_time=wire.timestamp(outgoing.node_time),
        ))
    assert isinstance(outgoing, Cancel)
    return workers_pb2.ConnectResponse(cancel=workers_pb2.CancelRuns(
        runs=[workers_pb2.ResultAck(run_id=ref.run_id, lease_token=ref.lease_token) for ref in outgoing.attempts],
        reason=outgoing.reason,
        unstarted_only=outgoing.unstarted_only,
    ))
