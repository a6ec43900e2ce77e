"""Sending runs ahead of their instant: the real fast lane and dispatcher on a manual clock, and
the worker stream's clock probes through the real servicer.

The lane's timer sleeps, in real time, for what the manual clock says is left, so the instants
here are a few hundred milliseconds after the clock's start: a test moves the clock and waits for
the lane to notice. No journal runs, so fast dispatches stay pending and nothing is written.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from fastlane._proto import workers_pb2 as pb
from fastlane._proto import workers_pb2_grpc as pb_grpc
from fastlane.domain.models import Delivery, Run, RunState
from fastlane.engine.dispatch import Assign, AttemptRef, Cancel, Dispatcher, Outgoing, WorkerSession
from fastlane.engine.dispatch.messages import ClockEcho
from fastlane.engine.dispatch.send_ahead import ClockProbe
from fastlane.engine.lane import FastLane
from fastlane.engine.operations import Operations
from fastlane.engine.release import GATHER_SHARE
from fastlane.rpc import wire
from fastlane.runtime.metrics import Metrics
from fastlane.server.servicers.workers import WorkerServicer
from fastlane.server.settings import Settings
from fastlane.storage import Store, open_store
from fastlane.testing import ManualClock

START = datetime(2027, 3, 1, 12, 0, tzinfo=UTC)
LEAD = timedelta(milliseconds=100)
INSTANT = START + timedelta(milliseconds=300)
MS = timedelta(milliseconds=1)
QUIET = 0.4  # seconds "nothing is sent" is watched for: longer than any sleep of the lane here
WAIT = 3.0


class OwnedShards:
    """Every shard is owned (fenced); the load and expiry loops have nothing to scan."""

    def fence(self, shard_id: int) -> object:
        return True

    def owned(self) -> list[int]:
        return []


@dataclass
class Engine:
    store: Store
    clock: ManualClock
    metrics: Metrics
    dispatcher: Dispatcher
    lane: FastLane

    def connect(self, worker_id: str, credits: int = 5, job_types: tuple[str, ...] = ("t",)) -> WorkerSession:
        return self.dispatcher.connect(worker_id, job_types, credits, None)

    def probe(self, session: WorkerSession, uncertainty: timedelta | None) -> ClockEcho:
        """Report a clock estimate for ``session`` and return the node's echo."""
        offset = None if uncertainty is None else 3 * MS
        self.dispatcher.clock_probed(session, ClockProbe(probe_id=1, sent_at_ns=None, uncertainty=uncertainty,
                                                         offset=offset))
        echo = session.outbox.get_nowait()
        assert isinstance(echo, ClockEcho)
        return echo

    def sample(self, name: str) -> float:
        return self.metrics.registry.get_sample_value(name) or 0.0


@pytest.fixture
async def engine(sqlite_url: str) -> AsyncIterator[Engine]:
    store = open_store(sqlite_url, shard_count=4)  # never opened: no journal runs
    clock, metrics = ManualClock(START), Metrics()
    dispatcher = Dispatcher(store, node_id="node-a", clock=clock, metrics=metrics, reschedule=lambda run: None,
                            send_ahead=LEAD)
    settings = Settings(db_url=sqlite_url, shard_count=4, send_ahead=LEAD)
    lane = FastLane(store, settings=settings, clock=clock, metrics=metrics, shards=OwnedShards(),
                    on_stale=lambda *args: None, dispatch=dispatcher)
    task = asyncio.create_task(lane.run(), name="test-lane")
    try:
        yield Engine(store, clock, metrics, dispatcher, lane)
    finally:
        lane.stop()
        await asyncio.wait_for(task, WAIT)


def make_run(run_id: str, *, job_id: str = "job-1", delivery: Delivery = Delivery.AT_LEAST_ONCE) -> Run:
    return Run(run_id=run_id, job_id=job_id, tenant="default", job_type="t", shard_id=0, scheduled_for=INSTANT,
               available_at=INSTANT, state=RunState.SCHEDULED, attempts=0, payload=b"{}", priority=0, manual=False,
               delivery=delivery, lease_ttl=timedelta(seconds=30), created_at=START, updated_at=START)


async def next_message(session: WorkerSession) -> Outgoing:
    return await asyncio.wait_for(session.outbox.get(), WAIT)


async def quiet(*sessions: WorkerSession) -> None:
    await asyncio.sleep(QUIET)
    for session in sessions:
        assert session.outbox.empty(), f"{session.worker_id} was sent {session.outbox.get_nowait()}"


async def test_a_run_is_sent_the_lead_before_its_instant_to_a_worker_whose_clock_is_known_within_it(
    engine: Engine,
) -> None:
    session = engine.connect("w")
    engine.probe(session, 5 * MS)
    engine.lane.schedule_run(make_run("r1"))
    later = dataclasses.replace(make_run("r2", job_id="job-2"), available_at=INSTANT + 20 * MS)
    engine.lane.schedule_run(later)
    await quiet(session)  # 300 ms before its instant: too early even to be sent ahead
    engine.clock.set(INSTANT - LEAD + 10 * MS)
    await quiet(session)  # inside the lead, but runs are gathered until a quarter of it has passed

    offered_at = INSTANT - LEAD * (1 - GATHER_SHARE)
    engine.clock.set(offered_at)  # the clock never reaches the instant in this test
    message = await next_message(session)

    assert isinstance(message, Assign)  # both runs within the lead, in one message
    assert [(item.run.run_id, item.start_at, item.released_at) for item in message.runs] == [
        ("r1", INSTANT, offered_at), ("r2", INSTANT + 20 * MS, offered_at)]
    assert session.credits == 3
    assert engine.lane.size == 0 and engine.dispatcher.holds("r1") and engine.dispatcher.holds("r2")
    assert engine.sample("fastlane_runs_sent_ahead_total") == 2
    # Observed as on time when sent: the worker starts it on the instant.
    assert engine.sample("fastlane_trigger_lag_seconds_count") == 2
    assert engine.sample("fastlane_trigger_lag_seconds_sum") == 0


@pytest.mark.parametrize(
    ("estimates", "bystander"),
    [
        pytest.param((), False, id="never-probed"),
        pytest.param((None,), True, id="no-estimate-yet"),
        pytest.param((LEAD + MS,), True, id="looser-than-the-lead"),
        pytest.param((5 * MS, LEAD + MS), True, id="within-then-looser"),
    ],
)
async def test_a_worker_without_a_clock_estimate_within_the_lead_gets_the_run_on_its_instant(
    engine: Engine, estimates: tuple[timedelta | None, ...], bystander: bool
) -> None:
    others = []
    if bystander:
        # A worker of another job type that could hold runs: the run is offered ahead, and declined.
        others.append(engine.connect("other", job_types=("other",)))
        engine.probe(others[0], MS)
    session = engine.connect("w")
    for uncertainty in estimates:
        engine.probe(session, uncertainty)
    assert session.clock_uncertainty == (estimates[-1] if estimates else None)
    engine.lane.schedule_run(make_run("r1"))

    engine.clock.set(INSTANT - LEAD / 2)
    await quiet(session, *others)
    assert engine.lane.size == 1  # still in the lane, for its instant

    engine.clock.set(INSTANT)
    message = await next_message(session)
    assert isinstance(message, Assign)
    [item] = message.runs
    assert (item.run.run_id, item.start_at, item.released_at) == ("r1", None, INSTANT)
    assert engine.sample("fastlane_runs_sent_ahead_total") == 0
    await quiet(*others)


async def test_a_run_is_not_sent_ahead_without_a_free_credit_but_on_its_instant(engine: Engine) -> None:
    session = engine.connect("w", credits=0)
    engine.probe(session, 5 * MS)
    engine.lane.schedule_run(make_run("r1"))

    engine.clock.set(INSTANT - LEAD / 2)
    await quiet(session)
    engine.dispatcher.grant(session, 1)  # a credit before the instant: the run still waits for it
    await quiet(session)

    engine.clock.set(INSTANT)
    message = await next_message(session)
    assert isinstance(message, Assign)
    [item] = message.runs
    assert (item.run.run_id, item.start_at, item.released_at) == ("r1", None, INSTANT)
    assert engine.sample("fastlane_runs_sent_ahead_total") == 0


async def test_runs_confirmed_first_are_not_sent_ahead(engine: Engine) -> None:
    session = engine.connect("w")
    engine.probe(session, 5 * MS)
    engine.lane.schedule_run(make_run("once", delivery=Delivery.AT_MOST_ONCE))
    engine.lane.schedule_run(make_run("recovered"), recovered=True)

    engine.clock.set(INSTANT - LEAD / 2)
    await quiet(session)
    assert engine.lane.size == 2  # both wait in the lane to be confirmed and sent on their instant
    assert engine.sample("fastlane_runs_sent_ahead_total") == 0


async def test_attempts_held_for_their_instant_are_withdrawn_when_their_job_is_deleted(engine: Engine) -> None:
    session = engine.connect("w")
    engine.probe(session, 5 * MS)
    for run_id, job_id in (("r1", "job-1"), ("r2", "job-2"), ("r3", "job-3")):
        engine.lane.schedule_run(make_run(run_id, job_id=job_id))
    engine.clock.set(INSTANT - LEAD / 2)
    tokens: dict[str, int] = {}
    while len(tokens) < 3:
        message = await next_message(session)
        assert isinstance(message, Assign)
        tokens.update((item.run.run_id, item.lease_token) for item in message.runs)
    operations = Operations(engine.store, lane=engine.lane, dispatcher=engine.dispatcher)

    operations.job_deleted("job-1")
    withdrawal = session.outbox.get_nowait()
    assert isinstance(withdrawal, Cancel)
    assert withdrawal.unstarted_only and withdrawal.attempts == [AttemptRef("r1", tokens["r1"])]

    operations.run_cancelled(make_run("r2", job_id="job-2"))  # a cancel stops the attempt, held or not
    cancel = session.outbox.get_nowait()
    assert isinstance(cancel, Cancel)
    assert not cancel.unstarted_only and cancel.attempts == [AttemptRef("r2", tokens["r2"])]

    engine.clock.set(INSTANT + MS)  # r3 has started: deleting its job leaves it running, as any sent run
    operations.job_deleted("job-3")
    assert session.outbox.empty()


# -- the worker stream ---------------------------------------------------------------------------


@dataclass
class Stream:
    dispatcher: Dispatcher
    metrics: Metrics
    call: grpc.aio.StreamStreamCall[pb.ConnectRequest, pb.ConnectResponse]

    async def read(self) -> pb.ConnectResponse:
        message = await asyncio.wait_for(self.call.read(), WAIT)
        assert message is not grpc.aio.EOF
        return message  # type: ignore[return-value]


@pytest.fixture
async def stream(sqlite_url: str) -> AsyncIterator[Stream]:
    """A worker stream, past its hello, to the real servicer over a dispatcher on a manual clock."""
    store, metrics = open_store(sqlite_url, shard_count=4), Metrics()
    dispatcher = Dispatcher(store, node_id="node-a", clock=ManualClock(START), metrics=metrics,
                            reschedule=lambda run: None, send_ahead=LEAD)
    server = grpc.aio.server()
    pb_grpc.add_WorkerServiceServicer_to_server(
        WorkerServicer(dispatcher, node_id="node-a", heartbeat_interval=timedelta(seconds=30)), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        call = pb_grpc.WorkerServiceStub(channel).Connect()
        await call.write(pb.ConnectRequest(hello=pb.Hello(worker_id="w", job_types=["t"], credits=5)))
        opened = Stream(dispatcher, metrics, call)
        assert (await opened.read()).WhichOneof("body") == "welcome"
        yield opened
    finally:
        await channel.close()
        await server.stop(0)


async def test_a_clock_probe_is_echoed_at_once_with_the_node_time(stream: Stream) -> None:
    sent_at = Timestamp(seconds=1_800_000_000, nanos=123_456_789)  # echoed to the nanosecond
    await stream.call.write(pb.ConnectRequest(clock_probe=pb.ClockProbe(
        probe_id=2**64 - 1, sent_at=sent_at, uncertainty=Duration(nanos=2_000_000),
        offset=Duration(seconds=-1, nanos=-500_000_000))))

    echo = await stream.read()
    assert echo.WhichOneof("body") == "clock_echo"
    assert echo.clock_echo.probe_id == 2**64 - 1
    assert echo.clock_echo.probe_sent_at == sent_at
    assert echo.clock_echo.node_time == wire.timestamp(START)
    registry = stream.metrics.registry
    assert registry.get_sample_value("fastlane_worker_clock_uncertainty_seconds_sum") == pytest.approx(0.002)
    assert registry.get_sample_value("fastlane_worker_clock_offset_seconds_sum") == pytest.approx(1.5)  # absolute
    assert stream.dispatcher.ahead_lead == LEAD  # the worker may now hold runs

    # A run sent ahead carries its instant on the wire.
    assert stream.dispatcher.offer_ahead([make_run("r1")]) == []
    assignment = (await stream.read()).assignments.assignments[0]
    assert assignment.run_id == "r1" and assignment.HasField("start_at")
    assert wire.epoch_plus(assignment.start_at) == INSTANT

    # A probe without an estimate yet is echoed too, and takes the worker off sending ahead.
    await stream.call.write(pb.ConnectRequest(clock_probe=pb.ClockProbe(probe_id=3)))
    echo = await stream.read()
    assert echo.clock_echo.probe_id == 3 and not echo.clock_echo.HasField("probe_sent_at")
    assert stream.dispatcher.ahead_lead == timedelta(0)
    assert registry.get_sample_value("fastlane_worker_clock_uncertainty_seconds_count") == 1


@pytest.mark.parametrize(
    ("probe", "field"),
    [
        (pb.ClockProbe(uncertainty=Duration(seconds=60, nanos=1_000)), "clock_probe.uncertainty"),
        (pb.ClockProbe(uncertainty=Duration(nanos=-1_000)), "clock_probe.uncertainty"),
        (pb.ClockProbe(offset=Duration(seconds=86_400, nanos=1_000)), "clock_probe.offset"),
        (pb.ClockProbe(offset=Duration(seconds=1, nanos=-1)), "clock_probe.offset"),
        (pb.ClockProbe(sent_at=Timestamp(seconds=-1)), "clock_probe.sent_at"),
    ],
)
async def test_a_clock_probe_out_of_bounds_ends_the_stream_naming_the_field(
    stream: Stream, probe: pb.ClockProbe, field: str
) -> None:
    await stream.call.write(pb.ConnectRequest(clock_probe=probe))
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await stream.read()
    assert ended.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert field in (ended.value.details() or "")
    assert stream.dispatcher.ahead_lead == timedelta(0)
