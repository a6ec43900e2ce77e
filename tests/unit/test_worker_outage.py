"""A worker that cannot reach its node says so, at growing intervals, with what to check."""

from __future__ import annotations

import asyncio
import logging

import pytest

from fastlane import Worker
from fastlane.testing.processes import free_port
from fastlane.worker._outage import Outage


def test_an_outage_is_warned_of_at_10_30_60_120_and_300_s_then_every_300_s() -> None:
    clock = [0.0]
    outage = Outage(now=lambda: clock[0])
    warned_at = []
    for second in range(0, 1_501):  # an attempt every second for 25 minutes
        clock[0] = float(second)
        if outage.warning_due() is not None:
            warned_at.append(second)
    assert warned_at == [10, 30, 60, 120, 300, 600, 900, 1200, 1500]
    clock[0] = 1_530.0
    assert outage.ended() == 1_530.0  # back: how long it lasted
    assert outage.ended() is None  # and the next outage starts afresh
    clock[0] = 2_000.0
    assert outage.warning_due() is None


def test_a_short_outage_is_not_warned_of_nor_its_end_reported() -> None:
    clock = [0.0]
    outage = Outage(now=lambda: clock[0])
    for second in range(5):
        clock[0] = float(second)
        assert outage.warning_due() is None
    assert outage.ended() is None


async def test_a_worker_says_what_it_serves_and_where_when_it_starts(caplog: pytest.LogCaptureFixture) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens: the worker keeps trying
    worker = Worker(servers=[address], concurrency=7, follow_cluster=False)

    @worker.handler("billing.close")
    async def close(ctx) -> None:  # type: ignore[no-untyped-def]
        return None

    caplog.set_level(logging.INFO, logger="fastlane.worker")
    task = asyncio.create_task(worker.run())
    async with asyncio.timeout(10):
        while not any("serving billing.close, 7 at once, on " + address in r.getMessage() for r in caplog.records):
            await asyncio.sleep(0.02)
    await asyncio.wait_for(worker.stop(), 10)
    await asyncio.wait_for(task, 10)
