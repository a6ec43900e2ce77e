"""The dispatcher's journal against a scripted store: one bad record, an unavailable database, a stop.

Also: lease tokens cannot be guessed from one another.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from fastlane.domain.errors import StorageError, StorageUnavailable
from fastlane.domain.models import AttemptOutcome, Delivery, Run, RunState
from fastlane.engine.dispatch import JOURNAL_STOP_GRACE, MAX_LEASE_TOKEN, Acknowledge, Assign, Cancel, Dispatcher
from fastlane.runtime.clock import SystemClock
from fastlane.runtime.metrics import Metrics
from fastlane.storage import AttemptResult, Dispatch, Heartbeat
from fastlane.storage.attempts import RoundWritten

NOW = datetime(2030, 1, 1, tzinfo=UTC)
WAIT = 5.0


class ScriptedStore:
    """Records what lands; refuses any batch holding a run whose id starts with ``poison``;
    raises StorageUnavailable while ``down`` (a count of calls, or math.inf)."""

    @property
    def attempts(self) -> ScriptedStore:  # the part of a store this fake plays
        return self

    @property
    def runs(self) -> ScriptedStore:  # the part of a store this fake plays
        return self

    def __init__(self, *, down: float = 0) -> None:
        self.down = down
        self.calls: Counter[str] = Counter()
        self.dispatched: list[Dispatch] = []
        self.beats: list[Heartbeat] = []
        self.recorded: list[AttemptResult] = []

    def _weather(self, kind: str, run_ids: Sequence[str]) -> None:
        self.calls[kind] += 1
        if self.down > 0:
            self.down -= 1
            raise StorageUnavailable("database down (test)")
        if any(run_id.startswith("poison") for run_id in run_ids):
            raise StorageError("invalid byte sequence for encoding UTF8: 0x00 (test)")

    async def record_dispatches(self, dispatches: Sequence[Dispatch]) -> list[Any]:
        self._weather("dispatches", [d.run_id for d in dispatches])
        self.dispatched += dispatches
        return [SimpleNamespace(run_id=d.run_id) for d in dispatches]

    async def record_heartbeats(self, beats: Sequence[Heartbeat]) -> list[str]:
        self._weather("heartbeats", [b.run_id for b in beats])
        self.beats += beats
        return []

    async def record_results(self, results: Sequence[AttemptResult], *, reporter_of: Any = None) -> list[Any]:
        self._weather("results", [r.run_id for r in results])
        self.recorded += results
        return []

    async def record_round(self, dispatches: Sequence[Dispatch], beats: Sequence[Heartbeat],
                           results: Sequence[AttemptResult], *, reporter_of: Any = None) -> RoundWritten:
        """The three in one transaction: all land, or (on any error) none do."""
        self.calls["rounds"] += 1
        kept = (list(self.dispatched), list(self.beats), list(self.recorded))
        try:
            return RoundWritten(await self.record_dispatches(dispatches) if dispatches else [],
                                await self.record_heartbeats(beats) if beats else [],
                                await self.record_results(results, reporter_of=reporter_of) if results else [])
        except BaseException:
            self.dispatched, self.beats, self.recorded = kept
            raise

    async def list_attempts(self, run_id: str) -> list[Any]:
        # Every attempt asked about was sent to worker "w" with token 7.
        self._weather("attempts", [])
        return [SimpleNamespace(run_id=run_id, lease_token=7, worker_id="w")]


def run_named(run_id: str) -> Run:
    return Run(run_id=run_id, job_id="job", tenant="default", job_type="t", shard_id=0, scheduled_for=NOW,
               available_at=NOW, state=RunState.SCHEDULED, attempts=0, payload=b"", priority=0, manual=False,
               delivery=Delivery.AT_LEAST_ONCE, lease_ttl=timedelta(seconds=30), created_at=NOW, updated_at=NOW)


def result_for(run_id: str, token: int = 7) -> AttemptResult:
    return AttemptResult(run_id=run_id, lease_token=token, outcome=AttemptOutcome.SUCCEEDED)


def dispatcher_on(store: ScriptedStore, metrics: Metrics | None = None) -> Dispatcher:
    return Dispatcher(store, node_id="n", clock=SystemClock(), metrics=metrics or Metrics(),  # type: ignore[arg-type]
                      reschedule=lambda run: None)


def sent(session: Any, kind: type) -> list[Any]:
    messages = []
    while not session.outbox.empty():
        message = session.outbox.get_nowait()
        if isinstance(message, kind):
            messages.append(message)
    return messages


def set_aside(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value("fastlane_set_aside_total", {"kind": "journal_record"}) or 0.0


async def drained(dispatcher: Dispatcher, journal: asyncio.Task[None]) -> None:
    dispatcher.stop()
    await asyncio.wait_for(journal, WAIT)


# -- lease tokens ------------------------------------------------------------------------------


async def test_lease_tokens_are_random_positive_int64_and_not_sequential():
    dispatcher = dispatcher_on(ScriptedStore())
    session = dispatcher.connect("w", ["t"], 500, None)
    dispatcher.release([run_named(f"r{i}") for i in range(500)])
    tokens = [item.lease_token for message in sent(session, Assign) for item in message.runs]
    assert len(tokens) == len(set(tokens)) == 500
    assert all(0 < token <= MAX_LEASE_TOKEN for token in tokens)
    steps = [b - a for a, b in zip(tokens, tokens[1:], strict=False)]
    assert not any(abs(step) < 1 << 20 for step in steps), "a token is close to the one before it"
    assert max(tokens) - min(tokens) > 1 << 60  # spread over the whole 63-bit range


# -- one bad record ----------------------------------------------------------------------------


async def test_a_poisoned_result_is_set_aside_and_the_rest_are_recorded_and_acknowledged():
    store, metrics = ScriptedStore(), Metrics()
    dispatcher = dispatcher_on(store, metrics)
    session = dispatcher.connect("w", ["t"], 0, None)
    journal = asyncio.create_task(dispatcher.run())
    names = [f"r{i}" for i in range(40)]
    names[23] = "poison-23"
    dispatcher.results(session, [result_for(name) for name in names])
    await dispatcher.flush(WAIT)
    assert sorted(r.run_id for r in store.recorded) == sorted(set(names) - {"poison-23"})
    acked = {ref.run_id for message in sent(session, Acknowledge) for ref in message.results}
    assert acked == set(names) - {"poison-23"}  # never acknowledged: it is not durable
    assert set_aside(metrics) == 1
    assert store.calls["results"] <= 2 * math.ceil(math.log2(40)) + 1  # found by halving, not one by one
    await drained(dispatcher, journal)


async def test_a_poisoned_dispatch_is_withdrawn_and_the_other_dispatches_and_results_land():
    store, metrics = ScriptedStore(), Metrics()
    dispatcher = dispatcher_on(store, metrics)
    session = dispatcher.connect("w", ["t"], 10, None)
    journal = asyncio.create_task(dispatcher.run())
    dispatcher.release([run_named(name) for name in ("a", "poison-b", "c")])
    await dispatcher.flush(WAIT)
    assert [d.run_id for d in store.dispatched] == ["a", "c"]
    [cancel] = sent(session, Cancel)
    assert [ref.run_id for ref in cancel.attempts] == ["poison-b"]
    assert not dispatcher.holds("poison-b")  # the lane's full scan may deliver it again
    assert set_aside(metrics) == 1
    await drained(dispatcher, journal)


async def test_an_unavailable_database_is_retried_until_it_returns_and_nothing_is_set_aside():
    store, metrics = ScriptedStore(down=3), Metrics()
    dispatcher = dispatcher_on(store, metrics)
    session = dispatcher.connect("w", ["t"], 0, None)
    journal = asyncio.create_task(dispatcher.run())
    dispatcher.results(session, [result_for(f"r{i}") for i in range(5)])
    await dispatcher.flush(WAIT)
    assert len(store.recorded) == 5
    # Three failures while checking whose attempts these are, a check per run, one write.
    assert store.calls == {"attempts": 3 + 5, "results": 1}
    assert set_aside(metrics) == 0
    await drained(dispatcher, journal)


async def test_the_journal_stops_while_the_database_stays_unavailable():
    store = ScriptedStore(down=math.inf)
    dispatcher = dispatcher_on(store)
    session = dispatcher.connect("w", ["t"], 0, None)
    journal = asyncio.create_task(dispatcher.run())
    dispatcher.results(session, [result_for("r1")])
    await asyncio.sleep(0.3)  # failing and backing off
    dispatcher.stop()
    await asyncio.wait_for(journal, JOURNAL_STOP_GRACE.total_seconds() + 2)
    assert store.recorded == []


# -- whose attempt -----------------------------------------------------------------------------


async def test_reports_for_attempts_sent_to_another_worker_are_refused_in_memory_and_by_the_database():
    store = ScriptedStore()
    dispatcher = dispatcher_on(store)
    owner = dispatcher.connect("w", ["t"], 1, None)
    intruder = dispatcher.connect("x", ["t"], 0, None)
    journal = asyncio.create_task(dispatcher.run())
    dispatcher.release([run_named("mine")])
    [item] = sent(owner, Assign)[0].runs
    dispatcher.results(intruder, [result_for("mine", item.lease_token)])  # known here: sent to "w"
    dispatcher.heartbeats(intruder, [Heartbeat(run_id="other", lease_token=7, progress=0.5)])  # the database says "w"
    dispatcher.results(intruder, [result_for("other")])
    await dispatcher.flush(WAIT)
    assert store.recorded == [] and store.beats == []
    assert sent(intruder, Acknowledge) == []
    dispatcher.results(owner, [result_for("mine", item.lease_token), result_for("other")])
    await dispatcher.flush(WAIT)
    assert sorted(r.run_id for r in store.recorded) == ["mine", "other"]
    await drained(dispatcher, journal)


@pytest.mark.parametrize("down", [1, 2])
async def test_reports_checked_against_the_database_survive_an_outage_during_the_check(down):
    store = ScriptedStore(down=down)
    dispatcher = dispatcher_on(store)
    session = dispatcher.connect("w", ["t"], 0, None)
    journal = asyncio.create_task(dispatcher.run())
    dispatcher.results(session, [result_for("r1")])
    await dispatcher.flush(WAIT)
    assert [r.run_id for r in store.recorded] == ["r1"]
    assert store.calls["attempts"] == down + 1
    await drained(dispatcher, journal)


# -- written so far ----------------------------------------------------------------------------


class GatedStore(ScriptedStore):
    """Each write waits for ``gate`` (set by the test) before it lands."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def record_dispatches(self, dispatches: Sequence[Dispatch]) -> list[Any]:
        await self.gate.wait()
        return await super().record_dispatches(dispatches)


async def test_written_waits_for_what_was_journalled_before_it_not_after_and_rides_out_an_outage():
    store = GatedStore()
    store.down = 1  # the first write fails: its batch is pending again
    dispatcher = dispatcher_on(store)
    session = dispatcher.connect("w", ["t"], 1_000, None)
    journal = asyncio.create_task(dispatcher.run())
    try:
        dispatcher.release([run_named(f"before-{i}") for i in range(5)])
        await asyncio.sleep(0)  # the writer takes them and waits at the gate
        waiting = asyncio.create_task(dispatcher.journal_written(WAIT))
        dispatcher.release([run_named(f"after-{i}") for i in range(5)])
        await asyncio.sleep(0.05)
        assert not waiting.done()  # nothing has landed yet

        store.gate.set()  # the outage's failed write, its retry, then the rest
        await asyncio.wait_for(waiting, WAIT)
        landed = {dispatch.run_id for dispatch in store.dispatched}
        assert {f"before-{i}" for i in range(5)} <= landed
        assert store.calls["dispatches"] >= 2  # it waited through the failed round

        # Under steady load the journal is never empty; what came before still lands in time.
        store.gate.clear()
        dispatcher.release([run_named("busy-1")])
        await asyncio.sleep(0)
        waiting = asyncio.create_task(dispatcher.journal_written(WAIT))
        dispatcher.release([run_named("busy-2")])
        store.gate.set()
        await asyncio.wait_for(waiting, WAIT)
        assert "busy-1" in {dispatch.run_id for dispatch in store.dispatched}
        assert len(sent(session, Assign)) >= 1
    finally:
        await drained(dispatcher, journal)
