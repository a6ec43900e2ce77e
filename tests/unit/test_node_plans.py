"""A node starts and stops by its plans: the stop steps run in their declared order, each logged;
a service added to a start plan is supervised (restarted when it fails, the node told when it
gives up) and ends as its plan line says."""

from __future__ import annotations

import asyncio
import logging

import pytest

from fastlane.runtime.clock import SystemClock
from fastlane.runtime.metrics import Metrics
from fastlane.runtime.supervise import LoopGaveUp
from fastlane.server.assembly import build
from fastlane.server.plans import start_plan, stop_plan
from fastlane.server.services import Ending, Loop, Phase, Start, Step, Supervisor, walk
from fastlane.server.settings import Settings
from fastlane.storage import open_store
from fastlane.testing import until


@pytest.fixture(autouse=True)
def fast_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fastlane.runtime.supervise.GIVE_UP_AFTER", 3)
    monkeypatch.setattr("fastlane.runtime.supervise.Backoff.delay", lambda self, failures, rng=None: 0.001)


async def test_the_stop_plan_runs_its_steps_in_the_declared_order_each_logged(caplog: pytest.LogCaptureFixture) -> None:
    done: list[str] = []

    async def flush() -> None:
        await asyncio.sleep(0)  # gives the loop away: a later step still waits for it
        done.append("flush")

    steps = [Step("first", lambda: done.append("first")), Step("flush", flush), Step("last", lambda: done.append("last"))]
    with caplog.at_level(logging.INFO, logger="fastlane.node"):
        await walk(steps, node_id="node-a")
    assert done == ["first", "flush", "last"]
    assert [r.getMessage() for r in caplog.records] == [
        "node node-a stopping (1/3): first", "node node-a stopping (2/3): flush", "node node-a stopping (3/3): last"]


async def test_a_failing_step_stops_the_walk() -> None:
    done: list[str] = []

    def fails() -> None:
        raise RuntimeError("step failed (test)")

    with pytest.raises(RuntimeError):
        await walk([Step("fails", fails), Step("after", lambda: done.append("after"))], node_id="node-a")
    assert done == []


class Flaky:
    """A service that fails its first ``failures`` starts, then runs until ``stop``."""

    name = "flaky"

    def __init__(self, failures: int, stop: asyncio.Event) -> None:
        self.failures = failures
        self.starts = 0
        self._stop = stop

    async def run(self) -> None:
        self.starts += 1
        if self.starts <= self.failures:
            raise RuntimeError("a bug in the service (test)")
        await self._stop.wait()


async def test_a_service_added_to_the_plan_is_supervised_and_restarted() -> None:
    metrics, stop = Metrics(), asyncio.Event()
    service = Flaky(2, stop)
    gave_up: list[LoopGaveUp] = []
    async with asyncio.TaskGroup() as group:
        services = Supervisor(group, metrics=metrics, stop=stop, gave_up=gave_up.append)
        services.start([Start(service)], Phase.START)
        await until(lambda: service.starts >= 3, 5, "the service's third start")
        stop.set()
    assert gave_up == []
    assert metrics.loop_failures.labels(loop="flaky")._value.get() == 2


async def test_a_service_that_keeps_failing_tells_the_node_why() -> None:
    stop = asyncio.Event()
    gave_up: list[LoopGaveUp] = []
    async with asyncio.TaskGroup() as group:
        services = Supervisor(group, metrics=Metrics(), stop=stop, gave_up=gave_up.append)
        services.start([Start(Flaky(10, stop))], Phase.START)
    assert len(gave_up) == 1 and "'flaky' failed 3 times in a row" in str(gave_up[0])


async def test_services_start_in_their_phase_and_end_as_their_plan_line_says() -> None:
    stop = asyncio.Event()
    started: list[str] = []
    drained = asyncio.Event()

    def forever(name: str) -> Loop:
        async def body() -> None:
            started.append(name)
            await asyncio.Event().wait()
        return Loop(name, body)

    async def journal() -> None:
        started.append("journal")
        await drained.wait()

    plan = [Start(forever("probe"), Ending.FIRST), Start(Loop("journal", journal), Ending.DRAINED),
            Start(forever("listener"), Ending.LAST), Start(forever("health"), Ending.FIRST, Phase.READY)]
    async with asyncio.TaskGroup() as group:
        services = Supervisor(group, metrics=Metrics(), stop=stop, gave_up=lambda failure: None)
        services.start(plan, Phase.START)
        await until(lambda: len(started) == 3, 5, "the start-phase services")
        assert started == ["probe", "journal", "listener"]
        services.start(plan, Phase.READY)
        await until(lambda: len(started) == 4, 5, "the ready-phase service")
        assert started[-1] == "health"
        stop.set()
        services.cancel(Ending.FIRST)
        assert not await services.drain(0.01)  # the journal does not finish in time: abandoned
        services.cancel(Ending.LAST)


async def test_a_drain_that_finishes_in_time_is_not_abandoned() -> None:
    stop = asyncio.Event()

    running = asyncio.Event()

    async def journal() -> None:
        running.set()
        await stop.wait()

    async with asyncio.TaskGroup() as group:
        services = Supervisor(group, metrics=Metrics(), stop=stop, gave_up=lambda failure: None)
        services.start([Start(Loop("journal", journal), Ending.DRAINED)], Phase.START)
        await asyncio.wait_for(running.wait(), 5)
        stop.set()
        assert await services.drain(1.0)


async def test_a_node_s_plans_name_its_services_and_its_shutdown_order(tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(db_url=f"sqlite:///{tmp_path}/node.db", listen="127.0.0.1:0", node_id="node-a", auth=True)
    store = open_store(settings.db_url, shard_count=settings.shard_count)
    try:
        parts = build(settings, store, clock=SystemClock(), metrics=Metrics(), ready=asyncio.Event(),
                      stopping=asyncio.Event())
        assert [(entry.service.name, entry.ending, entry.phase) for entry in start_plan(parts)] == [
            ("shard-ownership", Ending.RETURNS, Phase.START),
            ("fast-lane", Ending.RETURNS, Phase.START),
            ("token-use", Ending.RETURNS, Phase.START),
            ("loop-probe", Ending.FIRST, Phase.START),
            ("dispatch-journal", Ending.DRAINED, Phase.START),
            ("change-listener", Ending.LAST, Phase.START),
            ("change-follower", Ending.LAST, Phase.START),
            ("workflows", Ending.LAST, Phase.START),
            ("history-trim", Ending.RETURNS, Phase.START),
            ("health", Ending.FIRST, Phase.READY),
        ]
        async with asyncio.TaskGroup() as group:
            services = Supervisor(group, metrics=Metrics(), stop=asyncio.Event(), gave_up=lambda failure: None)
            assert [step.name for step in stop_plan(parts, services)] == [
                "stop reporting health and probing the loop",
                "not ready",
                "stop firing",
                "stop assigning runs to workers",
                "make the dispatches durable",
                "release the shards",
                "stop the API server",
                "stop the dispatcher",
                "record the last results",
                "stop following changes",
            ]
        await parts.server.stop(0)
    finally:
        await store.close()
