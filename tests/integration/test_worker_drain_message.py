"""A stopping worker takes its credits back (Drain) from a node that reads it, at once and again
after a reconnect, and sends nothing an older node would not know (the fake node: fastlane.testing.wire)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from test_worker_sdk import WAIT, blocking_worker, node, running  # noqa: F401  (node: the fixture)

from fastlane._proto import common_pb2
from fastlane.testing.wire import FakeStream, assignment
from fastlane.testing.wire import FakeWorkerService as FakeNode


@asynccontextmanager
async def stopping_with_a_run(node: FakeNode) -> AsyncIterator[FakeStream]:  # noqa: F811
    """A worker told to stop while run r1 runs, on its first stream; r1 ends, and the worker has
    stopped, when the block exits."""
    release, started = asyncio.Event(), asyncio.Event()
    worker = blocking_worker(node, release, started, drain_timeout=10.0)
    async with running(worker):
        stream = await node.stream(0)
        stream.assign(assignment("r1", "block"))
        await asyncio.wait_for(started.wait(), WAIT)
        stopping = asyncio.create_task(worker.stop(), name="test-stop")
        yield stream
        release.set()
        await asyncio.wait_for(stopping, WAIT)


async def test_a_stopping_worker_says_drain_before_its_last_result(node):  # noqa: F811
    node.takes_drain = True
    async with stopping_with_a_run(node) as stream:
        await node.wait_until(lambda: "drain" in stream.kinds())
        assert stream.results() == []  # said while the run still runs: no more come to it meanwhile
    kinds = stream.kinds()
    assert kinds.count("drain") == 1 and kinds.index("drain") < kinds.index("results")
    assert [(r.run_id, r.outcome) for r in stream.results()] == [("r1", common_pb2.ATTEMPT_OUTCOME_SUCCEEDED)]


async def test_a_worker_reconnecting_while_it_stops_says_drain_again(node):  # noqa: F811
    node.takes_drain = True
    async with stopping_with_a_run(node) as first:
        await node.wait_until(lambda: "drain" in first.kinds())
        first.close()  # the node restarts, say: the worker comes back while still stopping
        second = await node.stream(1)
        await node.wait_until(lambda: "drain" in second.kinds())
        assert second.bodies("hello")[0].credits == 0
    assert [r.run_id for r in second.results()] == ["r1"]


async def test_an_older_node_is_sent_no_drain(node):  # noqa: F811
    async with stopping_with_a_run(node) as stream:
        pass
    assert "drain" not in stream.kinds() and None not in stream.kinds()
    assert [r.run_id for r in stream.results()] == ["r1"]
