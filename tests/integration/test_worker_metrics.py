"""A worker's own metrics (``Worker(metrics="HOST:PORT")``, ``fastlane worker --metrics``), scraped
over HTTP from a real worker running real runs of a real node, on both backends: attempts by job
type and outcome, handler durations, handlers running, credits free, and reconnects."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from fastlane import PermanentError
from fastlane.client import Client
from fastlane.domain.models import RetryPolicy, RunState, Schedule
from fastlane.server.node import Node
from fastlane.server.settings import Settings
from fastlane.testing import until
from fastlane.testing.processes import free_port
from fastlane.worker import RunContext, Worker

WAIT = 20.0
HOURLY = Schedule.interval(timedelta(hours=1))


@pytest.fixture
async def node_address(db_url: str) -> AsyncIterator[str]:
    address = f"127.0.0.1:{free_port()}"
    node = Node(Settings(db_url=db_url, listen=address, node_id="metrics-node", shard_count=4))
    task = asyncio.create_task(node.run())
    try:
        async with asyncio.timeout(30):
            await node.ready.wait()
        yield address
    finally:
        node.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)


def scrape(listen: str) -> dict[str, float]:
    """Every sample of the worker's /metrics, by its name and labels as the text format spells them
    (none while the worker has not started serving them)."""
    try:
        with urllib.request.urlopen(f"http://{listen}/metrics", timeout=5) as answer:  # noqa: S310 - a test's own URL
            text = answer.read().decode()
    except urllib.error.URLError:
        return {}
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


async def test_a_worker_counts_and_times_its_attempts_by_job_type_and_outcome(node_address: str) -> None:
    listen = f"127.0.0.1:{free_port()}"
    worker = Worker(node_address, worker_id="metered", concurrency=4, follow_cluster=False, metrics=listen)

    @worker.handler("ledger.close")
    async def close(ctx: RunContext) -> None:
        if (ctx.json() or {}).get("fail"):
            raise PermanentError("the ledger is locked")

    task = asyncio.create_task(worker.run())
    try:
        async with Client(node_address) as client:
            good = await client.create("good", "ledger.close", HOURLY)
            bad = await client.create("bad", "ledger.close", HOURLY, payload={"fail": True},
                                      retry=RetryPolicy(max_attempts=1))
            runs = [await client.trigger_job(good.job_id), await client.trigger_job(good.job_id),
                    await client.trigger_job(bad.job_id)]

            async def all_ended() -> bool:
                states = [(await client.get_run(run.run_id))[0].state for run in runs]
                return set(states) <= {RunState.SUCCEEDED, RunState.DEAD}

            await until(all_ended, WAIT, "the three runs to end")
            # The node's clock as the worker measures it (one host: nothing between them), once probed.
            await until(lambda: bool(worker.clock_estimates()), WAIT, "the worker to measure the node's clock")
        samples = await asyncio.to_thread(scrape, listen)
    finally:
        await asyncio.wait_for(worker.stop(), WAIT)
        await asyncio.wait_for(task, WAIT)
    assert samples['fastlane_worker_attempts_total{job_type="ledger.close",outcome="succeeded"}'] == 2
    assert samples['fastlane_worker_attempts_total{job_type="ledger.close",outcome="permanent_failure"}'] == 1
    assert samples['fastlane_worker_handler_seconds_count{job_type="ledger.close"}'] == 3
    assert samples["fastlane_worker_handlers_running"] == 0
    assert samples["fastlane_worker_credits_free"] == 4  # connected to one node, nothing in flight
    offset = samples[f'fastlane_worker_clock_offset_seconds{{node="{node_address}"}}']
    uncertainty = samples[f'fastlane_worker_clock_uncertainty_seconds{{node="{node_address}"}}']
    assert abs(offset) <= uncertainty + 0.005 and 0 <= uncertainty < 1
    assert not [name for name in samples if "_created" in name]
    assert await asyncio.to_thread(scrape, listen) == {}  # the worker stopped: so did its listener


async def test_a_worker_that_cannot_reach_its_node_counts_its_reconnects() -> None:
    listen, nowhere = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    worker = Worker(nowhere, worker_id="lost", follow_cluster=False, metrics=listen)

    @worker.handler("t")
    async def handle(ctx: RunContext) -> None:
        return None

    task = asyncio.create_task(worker.run())
    try:
        async def reconnected() -> bool:
            samples = await asyncio.to_thread(scrape, listen)
            return samples.get(f'fastlane_worker_reconnects_total{{node="{nowhere}"}}', 0) >= 2

        await until(reconnected, WAIT, "two reconnects to be counted")
        assert (await asyncio.to_thread(scrape, listen))["fastlane_worker_credits_free"] == 0  # no node: none
    finally:
        await asyncio.wait_for(worker.stop(), WAIT)
        await asyncio.wait_for(task, WAIT)


def test_a_metrics_address_that_is_not_host_and_port_is_refused() -> None:
    from fastlane.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="metrics must be HOST:PORT"):
        Worker("127.0.0.1:7070", metrics="9464")
