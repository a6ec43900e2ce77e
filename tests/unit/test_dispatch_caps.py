"""The dispatcher's caps: a tenant's attempts in flight per node (--tenant-max-in-flight), and
concurrency keys, whose runs are held back while the store says their key is full."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from test_journal_split import ScriptedStore, drained, run_named, sent

from fastlane.domain.models import AttemptOutcome, Run
from fastlane.domain.records import CappedDispatches
from fastlane.engine.dispatch import Assign, Dispatcher
from fastlane.engine.dispatch.in_flight import InFlight
from fastlane.engine.dispatch.messages import WorkerSession
from fastlane.engine.dispatch.reserve import PriorityReserve
from fastlane.runtime.clock import SystemClock
from fastlane.runtime.metrics import Metrics
from fastlane.storage import AttemptResult, Dispatch
from fastlane.testing import until

WAIT = 5.0


class KeyedStore(ScriptedStore):
    """Starts a capped run while fewer than its limit of its key are started and not yet reported."""

    def __init__(self) -> None:
        super().__init__()
        self.active: dict[str, set[str]] = {}  # key -> run ids started and not reported
        self.capped_calls = 0

    async def record_capped_dispatches(self, dispatches: Sequence[Dispatch]) -> CappedDispatches:
        self.capped_calls += 1
        started, held = [], []
        for dispatch in dispatches:
            assert dispatch.cap is not None
            active = self.active.setdefault(dispatch.cap.key, set())
            if len(active) < dispatch.cap.limit:
                active.add(dispatch.run_id)
                started.append(dispatch)
            else:
                held.append(dispatch.run_id)
        self.dispatched += started
        return CappedDispatches([_attempt(d) for d in started], held)

    async def record_results(self, results: Sequence[AttemptResult], *, reporter_of: Any = None) -> list[Any]:
        for result in results:
            for active in self.active.values():
                active.discard(result.run_id)
        return await super().record_results(results, reporter_of=reporter_of)


def _attempt(dispatch: Dispatch) -> Any:
    class Started:
        run_id = dispatch.run_id
    return Started()


def keyed(name: str, key: str = "ledger", limit: int = 2) -> Run:
    return replace(run_named(name), concurrency_key=key, concurrency_limit=limit)


def of_tenant(name: str, tenant: str) -> Run:
    due = datetime.now(UTC) - timedelta(seconds=3)  # waiting for 3 s already
    return replace(run_named(name), tenant=tenant, scheduled_for=due, available_at=due)


def dispatcher(store: ScriptedStore, metrics: Metrics, **options: Any) -> Dispatcher:
    return Dispatcher(store, node_id="n", clock=SystemClock(), metrics=metrics,  # type: ignore[arg-type]
                      reschedule=lambda run: None, **options)


class Received:
    """What one worker session has been sent so far, read as it arrives."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.items: list[Any] = []

    def read(self) -> list[str]:
        self.items += [item for message in sent(self.session, Assign) for item in message.runs]
        return [item.run.run_id for item in self.items]

    def token_of(self, run_id: str) -> int:
        return next(item.lease_token for item in self.items if item.run.run_id == run_id)


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_a_tenant_at_its_cap_waits_while_others_take_the_free_credits():
    metrics = Metrics()
    node = dispatcher(ScriptedStore(), metrics, tenant_max_in_flight={"noisy": 2})
    journal = asyncio.create_task(node.run())
    try:
        worker = Received(node.connect("w", ["t"], 10, None))
        node.release([of_tenant(f"noisy-{i}", "noisy") for i in range(5)] + [of_tenant(f"quiet-{i}", "quiet") for i in range(2)])
        assert sorted(worker.read()) == ["noisy-0", "noisy-1", "quiet-0", "quiet-1"]
        assert sample(metrics, "fastlane_held_runs", job_type="t", tenant="noisy", cap="tenant_in_flight") == 3
        assert sample(metrics, "fastlane_in_flight_runs", job_type="t", tenant="noisy") == 2
        assert 3 <= sample(metrics, "fastlane_oldest_ready_age_seconds", job_type="t", tenant="noisy") < 3 + WAIT
        # Nor is a run of a tenant at its cap sent ahead of its instant.
        node._ahead._capable.add(worker.session)  # its clock is known (as after a probe)
        later = [of_tenant("noisy-later", "noisy"), of_tenant("quiet-later", "quiet")]
        assert [run.run_id for run in node.offer_ahead(later)] == ["noisy-later"]
        # One of its attempts ends: the next of its runs goes out on the credit still free.
        node.results(worker.session, [AttemptResult(run_id="noisy-0", lease_token=worker.token_of("noisy-0"),
                                                    outcome=AttemptOutcome.SUCCEEDED)])
        assert worker.read()[5:] == ["noisy-2"]
        assert sample(metrics, "fastlane_in_flight_runs", job_type="t", tenant="noisy") == 2
    finally:
        await drained(node, journal)


async def test_runs_of_a_full_key_are_held_and_go_out_in_order_as_places_free():
    metrics, store = Metrics(), KeyedStore()
    node = dispatcher(store, metrics)
    journal = asyncio.create_task(node.run())
    try:
        worker = Received(node.connect("w", ["t"], 10, None))
        node.release([keyed(f"k-{i}") for i in range(5)])
        await until(lambda: len(worker.read()) == 2 and len(node._gate) == 3, WAIT, "two start and three are held")
        assert worker.read() == ["k-0", "k-1"]
        assert sample(metrics, "fastlane_held_runs", job_type="t", tenant="default", cap="concurrency_key") == 3
        assert all(node.holds(f"k-{i}") for i in range(2, 5))  # never released twice meanwhile
        assert worker.session.credits == 8  # the held runs' credits came back
        # A new run of the key queues behind the held ones, without a try of its own.
        calls = store.capped_calls
        node.release([keyed("k-5")])
        assert store.capped_calls == calls and node.holds("k-5")
        node.results(worker.session, [AttemptResult(run_id="k-0", lease_token=worker.token_of("k-0"),
                                                    outcome=AttemptOutcome.SUCCEEDED)])
        await until(lambda: len(worker.read()) == 3, WAIT, "a freed place takes the oldest held run")
        assert worker.read()[2] == "k-2" and len(store.active["ledger"]) == 2
        # Cancelled while held: dropped.
        node.cancel([keyed("k-3")])
        assert not node.holds("k-3")
    finally:
        await drained(node, journal)


async def test_keyed_runs_are_never_sent_ahead_of_their_instant():
    node = dispatcher(KeyedStore(), Metrics(), send_ahead=timedelta(milliseconds=20))
    journal = asyncio.create_task(node.run())
    try:
        session = node.connect("w", ["t"], 10, None)
        node._ahead._capable.add(session)  # its clock is known (as after a probe)
        assert [run.run_id for run in node.offer_ahead([keyed("k-0"), run_named("plain")])] == ["k-0"]
    finally:
        await drained(node, journal)


def prioritised(name: str, priority: int) -> Run:
    return replace(run_named(name), priority=priority)


async def test_credits_kept_for_urgent_runs_go_to_nothing_else():
    node = dispatcher(ScriptedStore(), Metrics(), priority_reserve=PriorityReserve(100, 3),
                      send_ahead=timedelta(milliseconds=20))
    journal = asyncio.create_task(node.run())
    try:
        worker = Received(node.connect("w", ["t"], 5, None))
        node.release([prioritised(f"low-{i}", 0) for i in range(4)])
        assert worker.read() == ["low-0", "low-1"]  # 3 of 5 credits kept
        # An urgent run is sent ahead on a kept credit; an ordinary one is not.
        node._ahead._capable.add(worker.session)  # its clock is known (as after a probe)
        assert [run.run_id for run in node.offer_ahead([prioritised("low-later", 0), prioritised("urgent-later", 100)])] \
            == ["low-later"]
        node.release([prioritised("urgent-now", 100), prioritised("urgent-more", 1000)])
        assert worker.read()[2:] == ["urgent-later", "urgent-now", "urgent-more"]
        assert worker.session.credits == 0
        # A credit that frees while ordinary runs hold their share goes to the next urgent run.
        node.results(worker.session, [AttemptResult(run_id="urgent-now", lease_token=worker.token_of("urgent-now"),
                                                    outcome=AttemptOutcome.SUCCEEDED)])
        node.grant(worker.session, 1)
        assert worker.read()[5:] == []
        node.release([prioritised("urgent-2", 200)])
        assert worker.read()[5:] == ["urgent-2"]
        # An urgent attempt that ends frees a kept credit (the worker grants it after the result).
        node.results(worker.session, [AttemptResult(run_id="urgent-2", lease_token=worker.token_of("urgent-2"),
                                                    outcome=AttemptOutcome.SUCCEEDED)])
        node.grant(worker.session, 1)
        assert worker.read()[6:] == []
        # An ordinary one that ends leaves room for the next ordinary run.
        node.results(worker.session, [AttemptResult(run_id="low-0", lease_token=worker.token_of("low-0"),
                                                    outcome=AttemptOutcome.SUCCEEDED)])
        node.grant(worker.session, 1)
        assert worker.read()[6:] == ["low-2"]
    finally:
        await drained(node, journal)


async def test_a_worker_that_reconnects_busy_gets_its_ordinary_share_back_as_it_frees_credits():
    node = dispatcher(ScriptedStore(), Metrics(), priority_reserve=PriorityReserve(100, 2))
    journal = asyncio.create_task(node.run())
    try:
        # Concurrency 6, reconnecting with 5 runs still going: it declares 1 credit.
        worker = Received(node.connect("w", ["t"], 1, None))
        node.release([prioritised(f"low-{i}", 0) for i in range(6)])
        assert worker.read() == ["low-0"]  # one at least
        node.results(worker.session, [AttemptResult(run_id="low-0", lease_token=worker.token_of("low-0"),
                                                    outcome=AttemptOutcome.SUCCEEDED)])
        node.grant(worker.session, 6)  # its earlier runs ended: all 6 credits are free again
        assert worker.read()[1:] == ["low-1", "low-2", "low-3", "low-4"]  # 6 less the 2 kept
    finally:
        await drained(node, journal)


async def test_a_small_worker_keeps_one_credit_for_ordinary_runs():
    node = dispatcher(ScriptedStore(), Metrics(), priority_reserve=PriorityReserve(100, 10))
    journal = asyncio.create_task(node.run())
    try:
        worker = Received(node.connect("w", ["t"], 2, None))
        node.release([prioritised(f"low-{i}", 0) for i in range(3)] + [prioritised("urgent", 100)])
        assert worker.read() == ["low-0", "urgent"]
    finally:
        await drained(node, journal)


async def test_runs_of_a_job_type_no_worker_serves_are_counted_as_unserved():
    metrics = Metrics()
    node = dispatcher(ScriptedStore(), metrics)
    journal = asyncio.create_task(node.run())
    try:
        node.connect("other", ["u"], 10, None)  # serves another type only
        node.connect("elsewhere", ["t"], 10, "another-tenant")  # serves another tenant only
        node.release([run_named(f"r{i}") for i in range(3)])  # job type "t", tenant "default"
        assert sample(metrics, "fastlane_unserved_runs", job_type="t", tenant="default") == 3
        assert (sample(metrics, "fastlane_worker_streams", job_type="t"),
                sample(metrics, "fastlane_worker_streams", job_type="u")) == (1, 1)
        worker = Received(node.connect("w", ["t"], 10, None))
        assert len(worker.read()) == 3
        assert sample(metrics, "fastlane_unserved_runs", job_type="t", tenant="default") is None
    finally:
        await drained(node, journal)


async def test_the_backlog_counts_runs_a_worker_serves_per_queue_those_a_tenant_cap_holds_too():
    """What holds the write-ahead back (--max-backlog) is a queue behind the capacity it gets: a
    shortage of credits or its tenant's cap. Runs no worker serves do not count (a worker may
    connect any moment), and each queue counts apart, so a capped tenant holds back only its own."""
    node = dispatcher(ScriptedStore(), Metrics(), tenant_max_in_flight={"noisy": 1})
    journal = asyncio.create_task(node.run())
    try:
        node.connect("elsewhere", ["t"], 5, "another-tenant")
        node.release([of_tenant(f"noisy-{i}", "noisy") for i in range(4)])
        assert (node.ready_depth, node.backlogs()) == (4, {})  # no worker serves tenant noisy
        worker = Received(node.connect("w", ["t"], 1, None))
        assert worker.read() == ["noisy-0"]
        assert (node.ready_depth, node.backlogs()) == (3, {("t", "noisy"): 3})  # noisy waits for its cap
        node.release([of_tenant(f"quiet-{i}", "quiet") for i in range(2)])
        assert (node.ready_depth, node.backlogs()) == (5, {("t", "noisy"): 3, ("t", "quiet"): 2})
    finally:
        await drained(node, journal)


def test_every_assignment_adds_to_its_queue_s_running_total_which_never_drops() -> None:
    # The pace each queue's backlog limit follows (fastlane.engine.backlog) is read from these totals.
    in_flight = InFlight()
    session = WorkerSession(worker_id="w", job_types=frozenset({"t"}), tenant=None, credits=10)
    runs = [replace(run_named(f"r{index}"), tenant=tenant) for index, tenant in enumerate(["a", "a", "b"])]
    for index, run in enumerate(runs):
        in_flight.assign((run.run_id, index), session, run)
    in_flight.pop(("r0", 0))
    del in_flight[("r2", 2)]
    assert in_flight.assigned_totals() == {("t", "a"): 2, ("t", "b"): 1}
    assert in_flight.counts() == {("t", "a"): 1}  # in flight now: the totals count every assignment
