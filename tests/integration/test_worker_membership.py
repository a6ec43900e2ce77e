"""The worker follows the cluster's membership: fake nodes, each an in-process gRPC server.

Every fake node serves ``WorkerService.Connect`` (welcomes, records, acknowledges results) and
``AdminService.GetCluster``, answering with one membership the test edits: which nodes are listed and
which are live. An interceptor counts the GetCluster calls each node receives, so a test can wait for
the worker's next membership checks instead of sleeping. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import grpc
import orjson
import pytest

from fastlane._proto import admin_pb2, admin_pb2_grpc, common_pb2
from fastlane._proto import workers_pb2 as pb
from fastlane._proto import workers_pb2_grpc as pb_grpc
from fastlane.cli.main import main
from fastlane.errors import ConfigurationError
from fastlane.rpc.wire import timestamp
from fastlane.testing.wire import FakeStream, FakeWorkerService, assignment
from fastlane.worker import RunContext, Worker

WAIT = 5.0  # upper bound for anything the worker should do promptly
INTERVAL = 0.05  # the worker's discovery interval in these tests
GET_CLUSTER = "/fastlane.v1.AdminService/GetCluster"
T0 = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


# -- the fake cluster --------------------------------------------------------------------------


class FakeNode(FakeWorkerService, admin_pb2_grpc.AdminServiceServicer):
    """One node: its worker streams (the kit's), its place in the membership, and how GetCluster
    behaves. Every stream and message notifies the cluster's condition."""

    def __init__(self, cluster: FakeCluster, node_id: str, *, live: bool) -> None:
        super().__init__(node_id, changed=cluster.changed)
        self.cluster = cluster
        self.live = live
        self.listed = True  # absent from GetCluster answers when False
        self.heartbeat_age = timedelta(0)
        self.get_cluster_error: grpc.StatusCode | None = None
        self.get_cluster_calls = 0  # answered or not, counted by the interceptor
        self.advertised: str | None = None  # the address GetCluster gives, if not the real one
        self.server: grpc.aio.Server | None = None

    @property
    def acks(self) -> bool:
        """Acknowledges every result at once when True, none when False."""
        return self.auto_ack

    @acks.setter
    def acks(self, value: bool) -> None:
        self.auto_ack = value

    def open_streams(self) -> list[FakeStream]:
        return [stream for stream in self.streams if not stream.worker_closed]

    def welcomed_streams(self) -> list[FakeStream]:
        return [stream for stream in self.open_streams() if stream.received]

    def all_results(self) -> list[pb.RunResult]:
        return [result for stream in self.streams for result in stream.results()]

    async def GetCluster(self, request, context):
        if self.get_cluster_error is not None:
            await context.abort(self.get_cluster_error, "scripted failure")
        return admin_pb2.GetClusterResponse(database_time=timestamp(T0), nodes=self.cluster.membership(),
                                       shards=self.cluster.shards)


class CountGetCluster(grpc.aio.ServerInterceptor):
    """Counts GetCluster calls, including those to a node that does not implement the service."""

    def __init__(self, node: FakeNode) -> None:
        self.node = node

    async def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method == GET_CLUSTER:
            self.node.get_cluster_calls += 1
            await self.node.cluster.notify()
        return await continuation(handler_call_details)


class FakeCluster:
    def __init__(self) -> None:
        self.nodes: list[FakeNode] = []
        self.shards: list[admin_pb2.ShardStatus] = []
        self.changed = asyncio.Condition()

    async def start_node(self, node_id: str, *, live: bool = True, admin: bool = True) -> FakeNode:
        """A node serving on a free port; ``admin=False`` is an older daemon without GetCluster."""
        node = FakeNode(self, node_id, live=live)
        server = grpc.aio.server(interceptors=[CountGetCluster(node)])
        pb_grpc.add_WorkerServiceServicer_to_server(node, server)
        if admin:
            admin_pb2_grpc.add_AdminServiceServicer_to_server(node, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        node.address, node.server = f"127.0.0.1:{port}", server
        self.nodes.append(node)
        return node

    async def stop_node(self, node: FakeNode) -> None:
        """The node dies: its calls end and its port stops answering."""
        if node.server is not None:
            await asyncio.wait_for(node.server.stop(grace=None), WAIT)

    async def stop_all(self) -> None:
        for node in self.nodes:
            await self.stop_node(node)

    def membership(self) -> list[admin_pb2.NodeStatus]:
        return [
            admin_pb2.NodeStatus(node_id=node.node_id, address=node.advertised or node.address, live=node.live, eligible=True,
                                 heartbeat_at=timestamp(T0 - node.heartbeat_age))
            for node in self.nodes
            if node.listed
        ]

    async def notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = WAIT) -> None:
        async with asyncio.timeout(timeout):
            async with self.changed:
                await self.changed.wait_for(predicate)

    async def next_checks(self, node: FakeNode, count: int = 2) -> None:
        """Wait until ``node`` is asked for the membership ``count`` more times. Two means the
        worker acted on at least one whole answer given after this call began."""
        target = node.get_cluster_calls + count
        await self.wait_until(lambda: node.get_cluster_calls >= target)


@pytest.fixture
async def cluster() -> AsyncIterator[FakeCluster]:
    """The fake nodes of one test; every server is stopped after it."""
    fake = FakeCluster()
    try:
        yield fake
    finally:
        await fake.stop_all()


@dataclass(frozen=True)
class Running:
    """A running worker whose "block" handler sets ``started``, then waits for ``release``."""

    worker: Worker
    started: asyncio.Event
    release: asyncio.Event

    async def run_blocked(self, stream: FakeStream, run_id: str = "r1") -> None:
        """Assign ``run_id`` on ``stream`` and wait until its handler runs."""
        stream.assign(assignment(run_id, "block"))
        await asyncio.wait_for(self.started.wait(), WAIT)


@pytest.fixture
async def workers() -> AsyncIterator[Callable[..., Running]]:
    """Starts workers seeded with one address; releases their handlers and stops them after the test."""
    started: list[tuple[Running, asyncio.Task[None]]] = []

    def start(seed: str, **options) -> Running:
        worker = Worker(seed, discovery_interval=INTERVAL, **({"drain_timeout": 1.0} | options))
        running = Running(worker, asyncio.Event(), asyncio.Event())

        @worker.handler("block")
        async def block(ctx: RunContext) -> None:
            running.started.set()
            await running.release.wait()

        started.append((running, asyncio.create_task(worker.run(), name="test-worker-run")))
        return running

    try:
        yield start
    finally:
        for running, task in started:
            running.release.set()
            if not task.done():
                try:
                    await asyncio.wait_for(running.worker.stop(), 3 * WAIT)
                except TimeoutError:
                    task.cancel()
            await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), WAIT)
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()


async def both_connected(cluster: FakeCluster, a: FakeNode, b: FakeNode) -> None:
    await cluster.wait_until(lambda: len(a.welcomed_streams()) == 1 and len(b.welcomed_streams()) == 1)


# -- following the membership ------------------------------------------------------------------


async def test_worker_given_one_seed_connects_to_every_live_node_it_lists(cluster, workers):
    a, b = await cluster.start_node("a"), await cluster.start_node("b")
    resting = await cluster.start_node("c", live=False)

    running = workers(a.address)
    await both_connected(cluster, a, b)
    await cluster.next_checks(a)

    assert sorted(running.worker.node_addresses) == sorted([a.address, b.address])
    assert (len(a.streams), len(b.streams), resting.streams) == (1, 1, [])
    assert resting.get_cluster_calls == 0 and b.get_cluster_calls == 0  # the seed answered each time


@pytest.mark.parametrize("leaves", ["not live", "absent"])
async def test_stream_to_a_node_that_leaves_the_live_members_is_stopped(cluster, workers, leaves):
    a, b = await cluster.start_node("a"), await cluster.start_node("b")
    running = workers(a.address)
    await both_connected(cluster, a, b)

    if leaves == "not live":
        b.live = False
    else:
        b.listed = False
    await cluster.wait_until(lambda: b.streams[0].worker_closed)
    await cluster.next_checks(a)

    assert running.worker.node_addresses == (a.address,)
    assert len(b.streams) == 1  # not reconnected
    assert a.open_streams() == a.streams  # the stream to A goes on


async def test_worker_connects_to_a_node_that_joins_and_again_to_one_that_returns(cluster, workers):
    a = await cluster.start_node("a")
    running = workers(a.address)
    await cluster.wait_until(lambda: len(a.welcomed_streams()) == 1)
    await cluster.next_checks(a)

    c = await cluster.start_node("c")
    await cluster.wait_until(lambda: len(c.welcomed_streams()) == 1)
    c.live = False
    await cluster.wait_until(lambda: c.streams[0].worker_closed)
    c.live = True
    await cluster.wait_until(lambda: len(c.welcomed_streams()) == 1)

    assert sorted(running.worker.node_addresses) == sorted([a.address, c.address])
    assert (len(a.streams), len(c.streams)) == (1, 2)


@pytest.mark.parametrize("failure", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNIMPLEMENTED])
async def test_streams_stay_while_no_node_answers_get_cluster(cluster, workers, caplog, failure):
    a, b = await cluster.start_node("a"), await cluster.start_node("b")
    running = workers(a.address)
    await both_connected(cluster, a, b)

    caplog.set_level(logging.INFO, logger="fastlane.worker")
    a.get_cluster_error = b.get_cluster_error = failure
    await cluster.next_checks(b, 3)  # B is asked only after A failed: whole rounds went by

    assert sorted(running.worker.node_addresses) == sorted([a.address, b.address])
    assert (len(a.streams), len(b.streams), len(a.open_streams()), len(b.open_streams())) == (1, 1, 1, 1)
    reports = [r for r in caplog.records if "no node reports the cluster's membership" in r.getMessage()]
    assert len(reports) == 1 and reports[0].levelno == logging.INFO  # once, not once per check
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]

    a.get_cluster_error = None
    b.live = False  # the membership is known again, and followed again
    await cluster.wait_until(lambda: b.streams[0].worker_closed)


async def test_older_daemon_without_get_cluster_keeps_the_seed_stream_quietly(cluster, workers, caplog):
    caplog.set_level(logging.DEBUG, logger="fastlane.worker")
    old = await cluster.start_node("old", admin=False)
    running = workers(old.address)
    await cluster.wait_until(lambda: len(old.welcomed_streams()) == 1)
    await cluster.next_checks(old, 3)

    await running.run_blocked(old.streams[0])
    running.release.set()
    await cluster.wait_until(lambda: len(old.all_results()) == 1)

    assert running.worker.node_addresses == (old.address,) and len(old.streams) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([r for r in caplog.records if "UNIMPLEMENTED" in r.getMessage()]) == 1


async def test_seed_stream_stays_while_no_node_is_live_yet(cluster, workers):
    starting = await cluster.start_node("starting", live=False)  # has not heartbeaten yet
    running = workers(starting.address)
    await cluster.wait_until(lambda: len(starting.welcomed_streams()) == 1)
    await cluster.next_checks(starting, 3)

    assert running.worker.node_addresses == (starting.address,)
    assert len(starting.streams) == 1 and not starting.streams[0].worker_closed


async def test_known_nodes_are_asked_once_the_seed_is_gone(cluster, workers):
    a, b = await cluster.start_node("a"), await cluster.start_node("b")
    running = workers(a.address)
    await both_connected(cluster, a, b)

    await cluster.stop_node(a)
    a.live = False
    await cluster.next_checks(b)

    assert running.worker.node_addresses == (b.address,)
    assert b.open_streams() == b.streams


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_working_seed_stream_stays_until_a_stream_to_a_listed_address_works(cluster, workers):
    a = await cluster.start_node("a")
    a.advertised = f"127.0.0.1:{closed_port()}"  # what a node behind a proxy or NAT might advertise
    running = workers(a.address)
    await cluster.wait_until(lambda: len(a.welcomed_streams()) == 1)
    await cluster.next_checks(a, 3)

    assert running.worker.node_addresses == (a.address, a.advertised)
    assert a.open_streams() == a.streams  # the seed's stream still takes work

    a.advertised = None  # now listed under the seed's address: the unreachable one goes
    await cluster.next_checks(a, 3)
    assert running.worker.node_addresses == (a.address,)
    assert len(a.streams) == 1


async def test_fixed_server_list_never_asks_for_the_membership(cluster, workers):
    a, b = await cluster.start_node("a"), await cluster.start_node("b")
    running = workers(a.address, follow_cluster=False)
    await cluster.wait_until(lambda: len(a.welcomed_streams()) == 1)
    await running.run_blocked(a.streams[0])
    running.release.set()
    await cluster.wait_until(lambda: len(a.all_results()) == 1)

    assert (a.get_cluster_calls, b.get_cluster_calls, b.streams) == (0, 0, [])
    assert running.worker.node_addresses == (a.address,)


def test_discovery_interval_must_be_positive():
    with pytest.raises(ConfigurationError, match="discovery_interval"):
        Worker("127.0.0.1:7070", discovery_interval=0)


# -- work on a stream that goes ----------------------------------------------------------------


async def test_run_in_flight_on_a_node_that_leaves_but_answers_finishes_and_reports_there(cluster, workers):
    a, b = await cluster.start_node("a"), await cluster.start_node("b")
    running = workers(a.address, drain_timeout=30.0)
    await both_connected(cluster, a, b)
    stream = b.streams[0]
    await running.run_blocked(stream)

    b.live = False
    await cluster.next_checks(a)
    assert running.worker.node_addresses == (a.address,)
    assert not stream.worker_closed  # it waits for its run
    running.release.set()
    await cluster.wait_until(lambda: stream.worker_closed)

    assert [(r.run_id, r.outcome) for r in stream.results()] == [("r1", common_pb2.ATTEMPT_OUTCOME_SUCCEEDED)]
    assert stream.bodies("credit") == []  # a leaving stream asks for no more work
    assert a.all_results() == []


async def test_run_in_flight_on_a_node_that_dies_heartbeats_and_reports_through_a_live_node(cluster, workers):
    a, b = await cluster.start_node("a"), await cluster.start_node("b")
    running = workers(a.address, drain_timeout=30.0)  # an unacknowledged result would hold stop() up
    await both_connected(cluster, a, b)
    await running.run_blocked(b.streams[0])

    await cluster.stop_node(b)
    b.live = False  # as the cluster says once B's heartbeat is older than the lease TTL
    await cluster.wait_until(lambda: "r1" in a.streams[0].beaten_runs())  # its lease is renewed through A
    running.release.set()
    await cluster.wait_until(lambda: len(a.all_results()) == 1)
    await asyncio.wait_for(running.worker.stop(), WAIT)  # returns once every result is acknowledged

    (result,) = a.all_results()
    assert (result.run_id, result.lease_token, result.outcome) == ("r1", 7, common_pb2.ATTEMPT_OUTCOME_SUCCEEDED)
    assert a.streams[0].bodies("credit") == []  # A never granted that run: its end frees no credit there
    assert b.all_results() == []


async def test_unacknowledged_result_of_a_node_that_dies_is_resent_to_a_live_node(cluster, workers):
    a, b = await cluster.start_node("a"), await cluster.start_node("b")
    b.acks = False
    running = workers(a.address, drain_timeout=30.0)
    await both_connected(cluster, a, b)
    await running.run_blocked(b.streams[0])
    running.release.set()
    await cluster.wait_until(lambda: len(b.all_results()) == 1)

    await cluster.stop_node(b)  # it never acknowledged the result
    b.live = False
    await cluster.wait_until(lambda: len(a.all_results()) == 1)
    await asyncio.wait_for(running.worker.stop(), WAIT)

    assert [(r.run_id, r.outcome) for r in a.all_results()] == [("r1", common_pb2.ATTEMPT_OUTCOME_SUCCEEDED)]
    assert b.all_results() == a.all_results()


async def test_result_a_leaving_node_sits_on_moves_to_a_live_node(cluster, workers, monkeypatch):
    monkeypatch.setattr("fastlane.worker._stream._ACK_PATIENCE", 0.2)
    a, b = await cluster.start_node("a"), await cluster.start_node("b")
    b.acks = False  # connected, but not recording anything (its database is out of reach, say)
    running = workers(a.address, drain_timeout=30.0)
    await both_connected(cluster, a, b)
    await running.run_blocked(b.streams[0])
    b.live = False
    running.release.set()

    await cluster.wait_until(lambda: len(a.all_results()) == 1 and b.streams[0].worker_closed)
    await asyncio.wait_for(running.worker.stop(), WAIT)

    assert [(r.run_id, r.outcome) for r in b.all_results()] == [("r1", common_pb2.ATTEMPT_OUTCOME_SUCCEEDED)]
    assert [(r.run_id, r.outcome) for r in a.all_results()] == [("r1", common_pb2.ATTEMPT_OUTCOME_SUCCEEDED)]


# -- fastlane cluster --------------------------------------------------------------------------


async def test_cluster_command_shows_liveness_heartbeat_age_and_lease_time(cluster, capsys):
    a = await cluster.start_node("a")
    silent = await cluster.start_node("b", live=False)
    silent.heartbeat_age = timedelta(seconds=12)
    cluster.shards = [
        admin_pb2.ShardStatus(shard_id=0, owner="a", token=3, lease_expires_at=timestamp(T0 + timedelta(seconds=8))),
        admin_pb2.ShardStatus(shard_id=1, owner="b", token=2, lease_expires_at=timestamp(T0 - timedelta(seconds=2))),
    ]

    code = await asyncio.to_thread(main, ["cluster", "--json", "--server", a.address])
    view = orjson.loads(capsys.readouterr().out)
    table_code = await asyncio.to_thread(main, ["cluster", "--shards", "--server", a.address])
    table = capsys.readouterr().out.splitlines()
    summary_code = await asyncio.to_thread(main, ["cluster", "--server", a.address])
    summary = capsys.readouterr().out.splitlines()

    assert (code, table_code) == (0, 0)
    nodes = [(n["node_id"], n["address"], n["live"], n["eligible"], n["heartbeat_age_seconds"]) for n in view["nodes"]]
    assert nodes == [("a", a.address, True, True, 0.0), ("b", silent.address, False, True, 12.0)]
    assert {"shards_owned", "workers_connected", "clock_offset_ms", "note", "heartbeat_at"} <= view["nodes"][0].keys()
    assert [(s["shard_id"], s["owner"], s["token"], s["lease_expires_in_seconds"]) for s in view["shards"]] == [
        (0, "a", 3, 8.0), (1, "b", 2, -2.0),
    ]
    assert table[2].split() == [
        "NODE_ID", "ADDRESS", "LIVE", "ELIGIBLE", "READY", "SHARDS", "WORKERS", "CLOCK_OFFSET_MS", "HEARTBEAT_AGE_S",
        "NOTE",
    ]
    assert table[4].split()[:3] == ["b", silent.address, "no"] and table[4].split()[-2:] == ["12.0", "-"]
    assert table[-1].split() == ["1", "b", "2", "-2.0"]
    assert summary_code == 0 and summary[-1] == "shards: 2 ((lapsed): 1, a: 1) — --shards lists each"  # b's ran out
