"""WorkerService: one bidirectional stream per worker, bridged to the dispatcher.

A reader task turns the worker's messages into dispatcher calls; the handler itself writes what
the dispatcher puts in the session's outbox. Reads and writes run concurrently on the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta

import grpc

from fastlane import wire
from fastlane._proto import workers_pb2, workers_pb2_grpc
from fastlane.engine.dispatch import (
    Acknowledge,
    Assign,
    Cancel,
    Dispatcher,
    Outgoing,
    WorkerSession,
)
from fastlane.models import AttemptOutcome
from fastlane.storage import AttemptResult, Heartbeat

log = logging.getLogger("fastlane.api.workers")

# Merged assignments stop growing at this many runs: a message stays well under gRPC's 4 MiB.
MAX_RUNS_PER_MESSAGE = 1_000

# What a worker may report; the rest of AttemptOutcome is decided by the node.
_WORKER_OUTCOMES = frozenset({
    AttemptOutcome.SUCCEEDED, AttemptOutcome.FAILED, AttemptOutcome.PERMANENT_FAILURE,
    AttemptOutcome.TIMED_OUT, AttemptOutcome.CANCELLED,
})


class WorkerServicer(workers_pb2_grpc.WorkerServiceServicer):
    def __init__(self, dispatcher: Dispatcher, *, node_id: str, heartbeat_interval: timedelta) -> None:
        self._dispatcher = dispatcher
        self._node_id = node_id
        self._heartbeat_interval = heartbeat_interval

    async def Connect(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        first = await context.read()
        if first is grpc.aio.EOF or first.WhichOneof("body") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message on a worker stream must be a hello")
        hello = first.hello
        if not hello.worker_id or not hello.job_types:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "hello: worker_id and job_types are required")
        await context.write(workers_pb2.NodeMessage(welcome=workers_pb2.Welcome(
            node_id=self._node_id, heartbeat_interval=wire.duration(self._heartbeat_interval))))
        session = self._dispatcher.connect(hello.worker_id, hello.job_types, hello.credits, hello.tenant)
        reader = asyncio.create_task(self._read(session, context), name=f"worker-read:{hello.worker_id}")
        try:
            while True:
                outgoing = await _next(session, reader)
                if outgoing is None:
                    break
                for message in coalesced(outgoing, session):
                    await context.write(_to_pb(message))
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self._dispatcher.disconnect(session)

    async def _read(self, session: WorkerSession, context: grpc.aio.ServicerContext) -> None:
        while True:
            message = await context.read()
            if message is grpc.aio.EOF:
                return
            body = message.WhichOneof("body")
            if body == "credit":
                self._dispatcher.grant(session, message.credit.credits)
            elif body == "heartbeats":
                self._dispatcher.heartbeats(session, (_heartbeat(beat) for beat in message.heartbeats.beats))
            elif body == "results":
                self._dispatcher.results(session, [r for r in map(_result, message.results.results) if r])
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


def _heartbeat(beat: workers_pb2.RunHeartbeat) -> Heartbeat:
    return Heartbeat(
        run_id=beat.run_id,
        lease_token=beat.lease_token,
        started=beat.started,
        progress=beat.progress if beat.HasField("progress") else None,
        checkpoint=beat.checkpoint if beat.HasField("checkpoint") else None,
    )


def _result(result: workers_pb2.RunResult) -> AttemptResult | None:
    try:
        outcome = AttemptOutcome(result.outcome)
    except ValueError:
        outcome = AttemptOutcome.FAILED
    if outcome not in _WORKER_OUTCOMES:
        outcome = AttemptOutcome.FAILED
    return AttemptResult(
        run_id=result.run_id,
        lease_token=result.lease_token,
        outcome=outcome,
        error_code=result.error_code or None,
        error_message=result.error_message or None,
        started_at=wire.instant(result.started_at, result.HasField("started_at")),
        finished_at=wire.instant(result.finished_at, result.HasField("finished_at")),
    )


def _to_pb(outgoing: Outgoing) -> workers_pb2.NodeMessage:
    if isinstance(outgoing, Assign):
        return workers_pb2.NodeMessage(assignments=workers_pb2.Assignments(assignments=[
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
            )
            for item in outgoing.runs
        ]))
    if isinstance(outgoing, Acknowledge):
        return workers_pb2.NodeMessage(acks=workers_pb2.ResultAcks(acks=[
            workers_pb2.ResultAck(run_id=ref.run_id, lease_token=ref.lease_token) for ref in outgoing.results
        ]))
    assert isinstance(outgoing, Cancel)
    return workers_pb2.NodeMessage(cancel=workers_pb2.CancelRuns(
        runs=[workers_pb2.ResultAck(run_id=ref.run_id, lease_token=ref.lease_token) for ref in outgoing.attempts],
        reason=outgoing.reason,
    ))
