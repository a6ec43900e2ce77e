"""A supervised loop survives database weather and its own failures, with bounded backoff."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from fastlane.domain.errors import StorageError, StorageUnavailable
from fastlane.runtime.metrics import Metrics
from fastlane.runtime.supervise import Backoff, LoopGaveUp, is_weather, supervised

FAST = Backoff(first=0.001, cap=0.004)


class ScriptedLoop:
    """A loop that raises each of ``failures`` in turn, one per start, then returns."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.starts = 0

    async def __call__(self) -> None:
        self.starts += 1
        await asyncio.sleep(0)
        if self.failures:
            raise self.failures.pop(0)


def failures_counted(metrics: Metrics, loop: str) -> float:
    return metrics.loop_failures.labels(loop=loop)._value.get()


async def test_database_weather_restarts_the_loop_without_counting_a_failure() -> None:
    metrics = Metrics()
    loop = ScriptedLoop(StorageUnavailable("down"), ExceptionGroup("lane", [StorageUnavailable("down")]))
    await supervised("lane", loop, metrics=metrics, stop=asyncio.Event(), backoff=FAST)
    assert loop.starts == 3
    assert failures_counted(metrics, "lane") == 0


async def test_an_unexpected_exception_is_logged_counted_and_the_loop_restarted(caplog) -> None:
    metrics = Metrics()
    loop = ScriptedLoop(RuntimeError("bug"), StorageError("no such table"))
    with caplog.at_level(logging.ERROR, logger="fastlane.supervise"):
        await supervised("follower", loop, metrics=metrics, stop=asyncio.Event(), backoff=FAST)
    assert loop.starts == 3
    assert failures_counted(metrics, "follower") == 2
    logged = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert len(logged) == 2 and logged[0].exc_info is not None and "follower" in logged[0].getMessage()


async def test_a_loop_that_keeps_failing_gives_up_and_says_why() -> None:
    loop = ScriptedLoop(*(KeyError(f"bug {n}") for n in range(10)))
    with pytest.raises(LoopGaveUp, match="'journal' failed 3 times in a row, last with KeyError"):
        await supervised("journal", loop, metrics=Metrics(), stop=asyncio.Event(), backoff=FAST, give_up_after=3)
    assert loop.starts == 3


async def test_weather_never_makes_a_loop_give_up() -> None:
    loop = ScriptedLoop(*(StorageUnavailable("down") for _ in range(6)))
    await supervised("ownership", loop, metrics=Metrics(), stop=asyncio.Event(), backoff=FAST, give_up_after=2)
    assert loop.starts == 7


async def test_a_loop_failing_while_the_node_stops_is_not_restarted() -> None:
    stop = asyncio.Event()
    stop.set()
    loop = ScriptedLoop(RuntimeError("bug"), RuntimeError("bug"))
    await supervised("lane", loop, metrics=Metrics(), stop=stop, backoff=FAST, give_up_after=1)
    assert loop.starts == 1


async def test_stopping_ends_the_backoff_at_once() -> None:
    stop = asyncio.Event()
    loop = ScriptedLoop(StorageUnavailable("down"))
    slow = Backoff(first=60, cap=60)
    supervisor = asyncio.create_task(supervised("lane", loop, metrics=Metrics(), stop=stop, backoff=slow))
    await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(supervisor, 1)
    assert loop.starts == 1


async def test_cancellation_is_not_a_failure() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    metrics = Metrics()
    supervisor = asyncio.create_task(supervised("health", forever, metrics=metrics, stop=asyncio.Event()))
    await asyncio.sleep(0.01)
    supervisor.cancel()
    with pytest.raises(asyncio.CancelledError):
        await supervisor
    assert failures_counted(metrics, "health") == 0


def test_backoff_grows_exponentially_with_jitter_up_to_its_cap() -> None:
    backoff = Backoff(first=0.1, cap=5.0)
    rng = random.Random(7)
    for failures, step in [(1, 0.1), (2, 0.2), (3, 0.4), (6, 3.2), (7, 5.0), (1000, 5.0)]:
        delays = {backoff.delay(failures, rng) for _ in range(50)}
        assert all(step / 2 <= delay <= step for delay in delays), (failures, sorted(delays)[:3])
        assert len(delays) > 1  # jittered


def test_only_storage_unavailable_is_weather() -> None:
    assert is_weather(StorageUnavailable("down"))
    assert is_weather(ExceptionGroup("loops", [StorageUnavailable("a"), ExceptionGroup("b", [StorageUnavailable("c")])]))
    assert not is_weather(ExceptionGroup("loops", [StorageUnavailable("a"), RuntimeError("bug")]))
    assert not is_weather(StorageError("no such table"))
