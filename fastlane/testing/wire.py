"""The worker stream as a node speaks it, scripted by a test: the wire-level fake node.

:class:`FakeWorkerService` is a real ``WorkerService`` (``proto/fastlane/v1/workers.proto``)
served by an in-process gRPC server on 127.0.0.1, so a real :class:`~fastlane.Worker` connects to
it as to a daemon, through its real channel, stream, heartbeats and acknowledgements. It welcomes
every Hello, records every message the worker sends (one :class:`FakeStream` per Connect call),
acknowledges results while ``auto_ack`` is on, sends what a test queues, and ends a stream when
the test closes it or the worker closes its sending side.

This module speaks protobuf: it is what the SDK's own tests script the protocol with, message by
message. A user testing handlers wants :class:`fastlane.testing.FakeNode`, built on it, whose
values are the domain's. Every wait here is bounded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from fastlane._proto import workers_pb2 as pb
from fastlane._proto import workers_pb2_grpc as pb_grpc
from fastlane.rpc.wire import duration, timestamp

WAIT = 5.0  # the default bound of a wait for something the worker should do promptly
SCHEDULED_FOR = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)  # of an assignment that does not say
LEASE_TOKEN = 7  # of an assignment that does not say


def assignment(run_id: str, job_type: str = "echo", **fields: Any) -> pb.Assignment:
    """An Assignment of ``run_id``, with every field a test leaves out filled in (tenant ``acme``,
    attempt 1, lease token 7, job ``job-<run_id>``, key ``key-<run_id>``)."""
    defaults: dict[str, Any] = dict(
        job_id=f"job-{run_id}", tenant="acme", attempt=1, idempotency_key=f"key-{run_id}",
        lease_token=LEASE_TOKEN, scheduled_for=timestamp(SCHEDULED_FOR),
    )
    return pb.Assignment(run_id=run_id, job_type=job_type, **(defaults | fields))


def ns_stamp(ns: int) -> Timestamp:
    """A Timestamp of ``ns`` nanoseconds since the epoch."""
    stamp = Timestamp()
    stamp.FromNanoseconds(ns)
    return stamp


class FakeStream:
    """One Connect call as the node sees it: what the worker sent, and what to send it next."""

    def __init__(self) -> None:
        self.received: list[pb.ConnectRequest] = []
        self.outbound: asyncio.Queue[pb.ConnectResponse | None] = asyncio.Queue()
        self.worker_closed = False  # the worker closed its sending side

    def bodies(self, kind: str) -> list[Any]:
        """The bodies of the messages received of one kind ("hello", "heartbeats", "results"...)."""
        return [getattr(m, kind) for m in self.received if m.WhichOneof("body") == kind]

    def kinds(self) -> list[str | None]:
        return [m.WhichOneof("body") for m in self.received]

    def results(self) -> list[pb.RunResult]:
        return [r for body in self.bodies("results") for r in body.results]

    def credits_granted(self) -> int:
        """Granted in CreditGrant messages and inside Results (to a node that takes them there)."""
        granted = sum(m.credit.credits for m in self.received if m.WhichOneof("body") == "credit")
        return granted + sum(m.results.credits for m in self.received if m.WhichOneof("body") == "results")

    def beats_of(self, run_id: str) -> list[pb.RunHeartbeat]:
        return [beat for body in self.bodies("heartbeats") for beat in body.beats if beat.run_id == run_id]

    def beaten_runs(self) -> set[str]:
        return {beat.run_id for body in self.bodies("heartbeats") for beat in body.beats}

    def assign(self, *assignments: pb.Assignment) -> None:
        self.outbound.put_nowait(pb.ConnectResponse(assignments=pb.Assignments(assignments=assignments)))

    def cancel(self, run_id: str, lease_token: int, reason: str) -> None:
        ref = pb.ResultAck(run_id=run_id, lease_token=lease_token)
        self.outbound.put_nowait(pb.ConnectResponse(cancel=pb.CancelRuns(runs=[ref], reason=reason)))

    def withdraw(self, runs: list[tuple[str, int]], reason: str) -> None:
        """Cancel only those of ``runs`` (run id, lease token) whose handler has not started."""
        refs = [pb.ResultAck(run_id=run_id, lease_token=lease_token) for run_id, lease_token in runs]
        cancel = pb.CancelRuns(runs=refs, reason=reason, unstarted_only=True)
        self.outbound.put_nowait(pb.ConnectResponse(cancel=cancel))

    def ack(self, *results: pb.RunResult) -> None:
        acks = [pb.ResultAck(run_id=r.run_id, lease_token=r.lease_token) for r in results]
        self.outbound.put_nowait(pb.ConnectResponse(acks=pb.ResultAcks(acks=acks)))

    def close(self) -> None:
        """End the call from the node's side (after what is queued)."""
        self.outbound.put_nowait(None)


class FakeWorkerService(pb_grpc.WorkerServiceServicer):
    """The node's side of every worker stream, with the knobs a test turns.

    With ``clock_ahead_ns`` set, the node echoes clock probes with a clock that much ahead of the
    machine's; without, it ignores them, as a node from before clock probes does. Its Welcome says
    it takes credits inside Results only with ``credits_with_results`` (an older node's does not),
    and asks for prompt results only with ``prompt_results``; it reads Drain only with
    ``takes_drain``. ``changed`` is notified on every
    stream and message; several services may share one (a fake cluster's).
    """

    def __init__(self, node_id: str = "fake-node", *, heartbeat_interval: timedelta = timedelta(seconds=30),
                 auto_ack: bool = True, changed: asyncio.Condition | None = None) -> None:
        self.node_id = node_id
        self.heartbeat_interval = heartbeat_interval
        self.auto_ack = auto_ack
        self.clock_ahead_ns: int | None = None
        self.credits_with_results = False
        self.prompt_results = False
        self.takes_drain = False
        self.streams: list[FakeStream] = []
        self.changed = changed if changed is not None else asyncio.Condition()
        self.address = ""  # set by start_server

    async def notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def wait_until(self, predicate: Callable[[], object], timeout: float = WAIT) -> None:
        """Wait (at most ``timeout`` seconds, else TimeoutError) until ``predicate()`` is truthy,
        checked whenever the worker sends something."""
        async with asyncio.timeout(timeout):
            async with self.changed:
                await self.changed.wait_for(predicate)

    async def stream(self, index: int) -> FakeStream:
        """The index-th stream, once its Hello has arrived (so the Welcome is ahead of anything sent)."""
        await self.wait_until(lambda: len(self.streams) > index and bool(self.streams[index].received))
        return self.streams[index]

    def welcome(self) -> pb.Welcome:
        return pb.Welcome(node_id=self.node_id, heartbeat_interval=duration(self.heartbeat_interval),
                          takes_credits_with_results=self.credits_with_results, prompt_results=self.prompt_results,
                          takes_drain=self.takes_drain)

    async def Connect(self, request_iterator: AsyncIterable[pb.ConnectRequest],
                      context: grpc.aio.ServicerContext[pb.ConnectRequest, pb.ConnectResponse]) -> AsyncIterator[pb.ConnectResponse]:
        stream = FakeStream()
        self.streams.append(stream)
        await self.notify()
        receiving = asyncio.create_task(self._receive(request_iterator, stream), name="fake-node-receive")
        try:
            while (message := await stream.outbound.get()) is not None:
                yield message
        finally:
            receiving.cancel()

    async def _receive(self, request_iterator: AsyncIterable[pb.ConnectRequest], stream: FakeStream) -> None:
        async for message in request_iterator:
            body = message.WhichOneof("body")
            if body == "hello":
                stream.outbound.put_nowait(pb.ConnectResponse(welcome=self.welcome()))
            elif body == "results" and self.auto_ack:
                stream.ack(*message.results.results)
            elif body == "clock_probe" and self.clock_ahead_ns is not None:
                probe = message.clock_probe
                echo = pb.ClockEcho(probe_id=probe.probe_id, probe_sent_at=probe.sent_at,
                                    node_time=ns_stamp(time.time_ns() + self.clock_ahead_ns))
                stream.outbound.put_nowait(pb.ConnectResponse(clock_echo=echo))
            stream.received.append(message)
            await self.notify()
        stream.worker_closed = True
        await self.notify()
        stream.close()  # as a node does when the worker says goodbye


async def start_server(service: FakeWorkerService, address: str = "127.0.0.1:0") -> grpc.aio.Server:
    """Serve ``service`` on ``address`` (a free port by default) and set its ``address``. Stop it
    with ``await asyncio.wait_for(server.stop(grace=None), WAIT)``.

    Raises:
        RuntimeError: The address could not be bound.
    """
    server = grpc.aio.server()
    pb_grpc.add_WorkerServiceServicer_to_server(service, server)
    port = server.add_insecure_port(address)
    await server.start()
    service.address = f"127.0.0.1:{port}"
    return server
