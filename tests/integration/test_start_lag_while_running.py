"""A run's start lag while its handler still runs is the handler's own, on both backends: the
worker's heartbeat says when the handler began (its clock, corrected by the node), so ``runs
list`` does not show when the node heard of the start instead — a heartbeat that comes late
(here, a handler that holds the worker's loop first) does not make the run look late."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import pytest

from fastlane.client import Client
from fastlane.domain.models import Run, RunState, Schedule
from fastlane.server.node import Node
from fastlane.server.settings import Settings
from fastlane.testing import until
from fastlane.testing.processes import free_port
from fastlane.worker import RunContext, Worker

WAIT = 30.0
HELD = 0.4  # seconds the handler holds its loop before its first heartbeat can go out


@pytest.fixture
async def address(db_url: str) -> AsyncIterator[str]:
    listen = f"127.0.0.1:{free_port()}"
    node = Node(Settings(db_url=db_url, listen=listen, node_id="lag-node", shard_count=4))
    task = asyncio.create_task(node.run(), name="lag-node")
    try:
        ready = asyncio.create_task(node.ready.wait())
        await asyncio.wait({ready, task}, timeout=WAIT, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            await task  # it stopped before it was ready: its error is the test's
        assert ready.done(), "the node was not ready in time"
        yield listen
    finally:
        node.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)


async def test_a_running_runs_start_is_when_its_handler_began_not_when_the_node_heard(address: str) -> None:
    began: list[datetime] = []
    release = asyncio.Event()
    worker = Worker(address, worker_id="slow", concurrency=1, follow_cluster=False)

    @worker.handler("slow")
    async def slow(ctx: RunContext) -> None:
        began.append(ctx.started_at)
        time.sleep(HELD)  # nothing on this loop (its heartbeats) runs meanwhile
        await release.wait()

    task = asyncio.create_task(worker.run())
    try:
        async with Client(address) as client:
            job = await client.create("long", "slow", Schedule.interval(timedelta(hours=1)),
                                      lease_ttl=timedelta(seconds=3))
            run = await client.trigger_job(job.job_id)

            async def running() -> Run | None:
                [listed] = [r for r in (await client.list_runs(job_id=job.job_id)).items if r.run_id == run.run_id]
                return listed if listed.state is RunState.RUNNING and listed.first_started_at else None

            listed = await until(running, WAIT, "the run to be running with its start recorded")
            assert listed.first_started_at is not None and began
            # The worker's own start, within a few milliseconds (one clock, an estimated offset),
            # not the heartbeat's arrival, at least HELD later.
            assert abs((listed.first_started_at - began[0]).total_seconds()) < HELD / 4
            release.set()

            async def succeeded() -> Run | None:
                seen, _ = await client.get_run(run.run_id)
                return seen if seen.state is RunState.SUCCEEDED else None

            finished = await until(succeeded, WAIT, "the run to succeed")
            assert finished.first_started_at is not None
            assert abs((finished.first_started_at - began[0]).total_seconds()) < HELD / 4
    finally:
        release.set()
        await asyncio.wait_for(worker.stop(), WAIT)
        await asyncio.wait_for(task, WAIT)
