"""The worker stream against a real dispatcher and store: what one worker sends cannot harm the rest.

An in-process gRPC server runs the real WorkerServicer over a real Dispatcher on SQLite and on
PostgreSQL; the tests speak the raw protocol, so they can send what the SDK never would.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta

import grpc
import pytest

from fastlane._proto import common_pb2
from fastlane._proto import workers_pb2 as pb
from fastlane._proto import workers_pb2_grpc as pb_grpc
from fastlane.domain.limits import MAX_CHECKPOINT_BYTES, MAX_ERROR_TEXT
from fastlane.domain.models import JobSpec, Run, RunState, Schedule
from fastlane.engine.dispatch import Dispatcher
from fastlane.runtime.clock import SystemClock
from fastlane.runtime.metrics import Metrics
from fastlane.server.servicers.workers import WorkerServicer
from fastlane.storage import open_store

WAIT = 10.0
QUIET = 0.5  # how long "nothing arrives" is watched for
SHARDS = 4


@dataclass
class Node:
    dispatcher: Dispatcher
    store: object
    address: str


@pytest.fixture
async def store(db_url):  # type: ignore[no-untyped-def]
    store = open_store(db_url, shard_count=SHARDS)
    await store.migrate()
    yield store
    await store.close()


@pytest.fixture
async def node(store) -> AsyncIterator[Node]:  # type: ignore[no-untyped-def]
    dispatcher = Dispatcher(store, node_id="node-a", clock=SystemClock(), metrics=Metrics(), reschedule=lambda run: None)
    journal = asyncio.create_task(dispatcher.run(), name="test-journal")
    server = grpc.aio.server()
    servicer = WorkerServicer(dispatcher, node_id="node-a", heartbeat_interval=timedelta(seconds=30))
    pb_grpc.add_WorkerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield Node(dispatcher, store, f"127.0.0.1:{port}")
    finally:
        dispatcher.stop_assigning()
        await server.stop(0)
        dispatcher.stop()
        await asyncio.wait_for(journal, WAIT)


class RawWorker:
    """One worker stream spoken by hand. A reader task keeps what the node sends (cancelling a
    read would cancel the whole call)."""

    def __init__(self, address: str, worker_id: str, *, credits: int = 10, job_types: tuple[str, ...] = ("t",)) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.call = pb_grpc.WorkerServiceStub(self.channel).Connect()
        self.hello = pb.Hello(worker_id=worker_id, job_types=list(job_types), credits=credits)
        self.received: asyncio.Queue[pb.ConnectResponse] = asyncio.Queue()
        self.reader = asyncio.create_task(self._read(), name="raw-worker-read")

    async def _read(self) -> None:
        while (message := await self.call.read()) is not grpc.aio.EOF:
            self.received.put_nowait(message)

    async def open(self) -> pb.Welcome:
        await self.call.write(pb.ConnectRequest(hello=self.hello))
        return (await self.next("welcome")).welcome

    async def next(self, kind: str, timeout: float = WAIT) -> pb.ConnectResponse:
        async with asyncio.timeout(timeout):
            while True:
                message = await self.received.get()
                if message.WhichOneof("body") == kind:
                    return message

    async def assignments(self, count: int) -> list[pb.Assignment]:
        received: list[pb.Assignment] = []
        while len(received) < count:
            received += (await self.next("assignments")).assignments.assignments
        return received

    async def report(self, *results: pb.RunResult) -> None:
        await self.call.write(pb.ConnectRequest(results=pb.Results(results=results)))

    async def beat(self, *beats: pb.RunHeartbeat) -> None:
        await self.call.write(pb.ConnectRequest(heartbeats=pb.Heartbeats(beats=beats)))

    async def status(self) -> grpc.aio.AioRpcError:
        """The error the node ended the stream with."""
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await asyncio.wait_for(self.reader, WAIT)
        return ended.value

    async def close(self) -> None:
        self.call.cancel()
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)
        await self.channel.close()


def succeeded(assignment: pb.Assignment, **fields: object) -> pb.RunResult:
    return pb.RunResult(run_id=assignment.run_id, lease_token=assignment.lease_token, outcome=common_pb2.ATTEMPT_OUTCOME_SUCCEEDED, **fields)


async def scheduled_runs(store, count: int, job_type: str = "t") -> list[Run]:  # type: ignore[no-untyped-def]
    job, _ = await store.jobs.create_job(JobSpec(name=f"job-{job_type}", job_type=job_type,
                                            schedule=Schedule.interval(timedelta(hours=1))))
    return [await store.runs.create_manual_run("default", job.job_id) for _ in range(count)]


async def state_of(store, run_id: str) -> RunState:  # type: ignore[no-untyped-def]
    return (await store.runs.get_run("default", run_id)).state


# -- the Hello ---------------------------------------------------------------------------------


@pytest.mark.parametrize("worker_id", ["bad\x00id", "w" * 201, "line\nbreak", "tab\there", ""],
                         ids=["nul", "too-long", "newline", "tab", "empty"])
async def test_a_hello_with_a_bad_worker_id_is_refused_and_other_workers_results_are_recorded(node, worker_id):
    bad = RawWorker(node.address, worker_id)
    await bad.call.write(pb.ConnectRequest(hello=bad.hello))
    ended = await bad.status()
    assert ended.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "hello.worker_id" in ended.details()
    await bad.close()

    good = RawWorker(node.address, "good-worker")
    await good.open()
    runs = await scheduled_runs(node.store, 3)
    node.dispatcher.release(runs)
    assignments = await good.assignments(3)
    await good.report(*map(succeeded, assignments))
    acked = (await good.next("acks")).acks.acks
    assert {ack.run_id for ack in acked} == {run.run_id for run in runs}
    assert [await state_of(node.store, run.run_id) for run in runs] == [RunState.SUCCEEDED] * 3
    await good.close()


@pytest.mark.parametrize(("hello", "field"), [
    (pb.Hello(worker_id="w", job_types=[], credits=1), "hello.job_types"),
    (pb.Hello(worker_id="w", job_types=["t"] * 1001, credits=1), "hello.job_types"),
    (pb.Hello(worker_id="w", job_types=["bad type"], credits=1), "hello.job_types[0]"),
    (pb.Hello(worker_id="w", job_types=["t", "x\x00"], credits=1), "hello.job_types[1]"),
    (pb.Hello(worker_id="w", job_types=["t"], credits=-1), "hello.credits"),
    (pb.Hello(worker_id="w", job_types=["t"], credits=2**31 - 1), "hello.credits"),
    (pb.Hello(worker_id="w", job_types=["t"], credits=1, tenant="a\x00b"), "hello.tenant"),
], ids=["no-types", "too-many-types", "bad-type", "nul-type", "negative-credits", "huge-credits", "bad-tenant"])
async def test_every_field_of_the_hello_is_bounded(node, hello, field):
    worker = RawWorker(node.address, "w")
    await worker.call.write(pb.ConnectRequest(hello=hello))
    ended = await worker.status()
    assert ended.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert ended.details().startswith(field)
    assert node.dispatcher.workers_connected == 0
    await worker.close()


# -- later messages ----------------------------------------------------------------------------


BAD_LATER_MESSAGES = {
    "nan-progress": (pb.ConnectRequest(heartbeats=pb.Heartbeats(beats=[
        pb.RunHeartbeat(run_id="r", lease_token=1, progress=math.nan)])), "heartbeats.beats[0].progress"),
    "progress-above-one": (pb.ConnectRequest(heartbeats=pb.Heartbeats(beats=[
        pb.RunHeartbeat(run_id="r", lease_token=1), pb.RunHeartbeat(run_id="r2", lease_token=1, progress=1.5)])),
        "heartbeats.beats[1].progress"),
    "big-checkpoint": (pb.ConnectRequest(heartbeats=pb.Heartbeats(beats=[
        pb.RunHeartbeat(run_id="r", lease_token=1, checkpoint=b"x" * (MAX_CHECKPOINT_BYTES + 1))])),
        "heartbeats.beats[0].checkpoint"),
    "nul-run-id": (pb.ConnectRequest(results=pb.Results(results=[
        pb.RunResult(run_id="r\x00", lease_token=1, outcome=common_pb2.ATTEMPT_OUTCOME_SUCCEEDED)])), "results.results[0].run_id"),
    "zero-token": (pb.ConnectRequest(results=pb.Results(results=[
        pb.RunResult(run_id="r", lease_token=0, outcome=common_pb2.ATTEMPT_OUTCOME_SUCCEEDED)])), "results.results[0].lease_token"),
    "timestamp-out-of-range": (pb.ConnectRequest(results=pb.Results(results=[
        pb.RunResult(run_id="r", lease_token=1, outcome=common_pb2.ATTEMPT_OUTCOME_SUCCEEDED, finished_at={"seconds": 2**62})])),
        "results.results[0].finished_at"),
    "negative-credit": (pb.ConnectRequest(credit=pb.CreditGrant(credits=-5)), "credit.credits"),
    "negative-credit-with-results": (pb.ConnectRequest(results=pb.Results(
        results=[pb.RunResult(run_id="r", lease_token=1, outcome=common_pb2.ATTEMPT_OUTCOME_SUCCEEDED)], credits=-1)), "results.credits"),
}


@pytest.mark.parametrize(("message", "field"), BAD_LATER_MESSAGES.values(), ids=BAD_LATER_MESSAGES.keys())
async def test_a_bad_later_message_ends_the_stream_naming_the_field(node, message, field):
    worker = RawWorker(node.address, "w")
    await worker.open()
    await worker.call.write(message)
    ended = await worker.status()
    assert ended.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert ended.details().startswith(field), ended.details()
    await worker.close()
    async with asyncio.timeout(WAIT):
        while node.dispatcher.workers_connected:
            await asyncio.sleep(0.01)


async def test_an_over_long_error_message_with_control_characters_is_cut_and_recorded(node):
    worker = RawWorker(node.address, "w")
    await worker.open()
    [run] = await scheduled_runs(node.store, 1)
    node.dispatcher.release([run])
    [assignment] = await worker.assignments(1)
    await worker.report(pb.RunResult(run_id=run.run_id, lease_token=assignment.lease_token, outcome=common_pb2.ATTEMPT_OUTCOME_PERMANENT_FAILURE,
                                     error_code="E\x00", error_message="boom\x00" * 5_000))
    await worker.next("acks")
    [attempt] = await node.store.runs.list_attempts(run.run_id)
    assert attempt.error_code == "E "
    assert attempt.error_message is not None and len(attempt.error_message) == MAX_ERROR_TEXT
    assert "\x00" not in attempt.error_message
    await worker.close()


async def test_credits_sent_with_results_free_the_slot_for_the_next_run(node):
    """One credit: the second run goes out only once the first one's result hands it back, inside
    the Results message (the Welcome says the node takes them there)."""
    worker = RawWorker(node.address, "w", credits=1)
    welcome = await worker.open()
    assert welcome.takes_credits_with_results
    first, second = await scheduled_runs(node.store, 2)
    node.dispatcher.release([first, second])
    [assignment] = await worker.assignments(1)
    with pytest.raises(TimeoutError):  # no credit left: the second run waits
        await worker.next("assignments", timeout=QUIET)
    await worker.call.write(pb.ConnectRequest(results=pb.Results(results=[
        pb.RunResult(run_id=assignment.run_id, lease_token=assignment.lease_token, outcome=common_pb2.ATTEMPT_OUTCOME_SUCCEEDED)], credits=1)))
    [following] = await worker.assignments(1)
    assert {assignment.run_id, following.run_id} == {first.run_id, second.run_id}
    await worker.close()


# -- whose attempt -----------------------------------------------------------------------------


async def test_a_result_or_heartbeat_for_an_attempt_sent_to_another_worker_is_refused(node):
    owner = RawWorker(node.address, "owner", credits=1)
    await owner.open()
    intruder = RawWorker(node.address, "intruder", credits=0)
    await intruder.open()
    [run] = await scheduled_runs(node.store, 1)
    node.dispatcher.release([run])
    [assignment] = await owner.assignments(1)
    await node.dispatcher.flush(WAIT)

    # Refused while this node knows whom it sent the attempt to...
    await intruder.beat(pb.RunHeartbeat(run_id=run.run_id, lease_token=assignment.lease_token, progress=0.9))
    await intruder.report(succeeded(assignment))
    with pytest.raises(TimeoutError):
        await intruder.next("acks", timeout=QUIET)
    await node.dispatcher.flush(WAIT)
    stored = await node.store.runs.get_run("default", run.run_id)
    assert stored.state is RunState.DISPATCHED and stored.progress == 0.0

    # ...and, judged by the attempts table, once the owner's stream is gone.
    await owner.close()
    async with asyncio.timeout(WAIT):
        while node.dispatcher.workers_connected > 1:
            await asyncio.sleep(0.01)
    await intruder.report(succeeded(assignment))
    with pytest.raises(TimeoutError):
        await intruder.next("acks", timeout=QUIET)
    await node.dispatcher.flush(WAIT)
    assert await state_of(node.store, run.run_id) is RunState.DISPATCHED

    # The owner reconnects and resends its result: recorded and acknowledged.
    again = RawWorker(node.address, "owner", credits=0)
    await again.open()
    await again.beat(pb.RunHeartbeat(run_id=run.run_id, lease_token=assignment.lease_token, progress=0.5))
    async with asyncio.timeout(WAIT):
        while (await node.store.runs.get_run("default", run.run_id)).progress != pytest.approx(0.5):
            await asyncio.sleep(0.02)
    await again.report(succeeded(assignment))
    [ack] = (await again.next("acks")).acks.acks
    assert (ack.run_id, ack.lease_token) == (run.run_id, assignment.lease_token)
    assert await state_of(node.store, run.run_id) is RunState.SUCCEEDED
    await again.close()
    await intruder.close()


# -- the journal -------------------------------------------------------------------------------


async def test_a_dispatch_the_database_refuses_does_not_hold_up_the_others(node):
    """On PostgreSQL a worker id with a NUL cannot be stored. Connected past the servicer's check
    (as if validation had a gap), its dispatch is set aside and everyone else's work is recorded."""
    bad = node.dispatcher.connect("bad\x00worker", ["t"], 1, None)
    good = RawWorker(node.address, "good", credits=5)
    await good.open()
    runs = await scheduled_runs(node.store, 4)
    node.dispatcher.release(runs)
    assignments = await good.assignments(3)
    await good.report(*map(succeeded, assignments))
    await good.next("acks")
    for assignment in assignments:
        assert await state_of(node.store, assignment.run_id) is RunState.SUCCEEDED
    node.dispatcher.disconnect(bad)
    await good.close()
