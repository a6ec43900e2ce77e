"""The dispatcher hands queued runs to workers fairly across tenants and by priority within one
(the queue itself: test_ready_queue.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

from test_journal_split import NOW, ScriptedStore, dispatcher_on, drained, run_named, sent

from fastlane.domain.models import Run
from fastlane.engine.dispatch import Assign, Dispatcher
from fastlane.runtime.clock import SystemClock
from fastlane.runtime.metrics import Metrics


def run_of(name: str, tenant: str, *, priority: int = 0, due_s: float = 0.0) -> Run:
    at = NOW + timedelta(seconds=due_s)
    return replace(run_named(name), tenant=tenant, priority=priority, scheduled_for=at, available_at=at)


def assigned_names(session) -> list[str]:  # type: ignore[no-untyped-def]
    return [item.run.run_id for message in sent(session, Assign) for item in message.runs]


async def test_a_quiet_tenant_is_not_stuck_behind_a_noisy_tenants_backlog():
    metrics = Metrics()
    dispatcher = dispatcher_on(ScriptedStore(), metrics)
    journal = asyncio.create_task(dispatcher.run())
    try:
        session = dispatcher.connect("w", ["t"], 0, None)  # no credits: everything queues
        dispatcher.release([run_of(f"noisy-{i}", "noisy", due_s=i * 0.01) for i in range(500)])
        dispatcher.release([run_of(f"quiet-{i}", "quiet", due_s=10 + i) for i in range(3)])
        dispatcher.grant(session, 6)
        assert assigned_names(session) == ["noisy-0", "quiet-0", "noisy-1", "quiet-1", "noisy-2", "quiet-2"]
        assert dispatcher.ready_depth == 497
        # Who is waiting shows per tenant, as scraped.
        assert metrics.registry.get_sample_value("fastlane_ready_runs", {"job_type": "t", "tenant": "noisy"}) == 497
        assert metrics.registry.get_sample_value("fastlane_ready_runs", {"job_type": "t", "tenant": "quiet"}) is None
    finally:
        await drained(dispatcher, journal)


async def test_queued_runs_of_a_tenant_go_out_by_priority_and_a_tenants_worker_takes_only_its_own():
    dispatcher = dispatcher_on(ScriptedStore())
    journal = asyncio.create_task(dispatcher.run())
    try:
        shared = dispatcher.connect("shared", ["t"], 0, None)
        dispatcher.release([run_of("a-low", "a", priority=-5), run_of("a-high", "a", priority=50, due_s=1),
                            run_of("b-only", "b")])
        own = dispatcher.connect("b-worker", ["t"], 5, "b")
        assert assigned_names(own) == ["b-only"]
        dispatcher.grant(shared, 2)
        assert assigned_names(shared) == ["a-high", "a-low"]
        assert dispatcher.ready_depth == 0
    finally:
        await drained(dispatcher, journal)


async def test_a_tenant_weighing_more_takes_that_many_runs_a_turn():
    dispatcher = Dispatcher(ScriptedStore(), node_id="n", clock=SystemClock(), metrics=Metrics(),  # type: ignore[arg-type]
                            reschedule=lambda run: None, tenant_weights={"big": 3})
    journal = asyncio.create_task(dispatcher.run())
    try:
        session = dispatcher.connect("w", ["t"], 0, None)
        dispatcher.release([run_of(f"{tenant}-{i}", tenant, due_s=i) for i in range(6) for tenant in ("big", "small")])
        dispatcher.grant(session, 8)
        assert [name.split("-")[0] for name in assigned_names(session)] == ["big"] * 3 + ["small"] + ["big"] * 3 + ["small"]
    finally:
        await drained(dispatcher, journal)
