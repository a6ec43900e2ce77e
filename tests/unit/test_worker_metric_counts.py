"""A worker's metrics (:mod:`fastlane.worker._metrics`): an attempt observed is counted by its job
type and outcome and timed, and the handlers-running gauge comes back down whatever the attempt
did."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from fastlane.domain.models import AttemptOutcome
from fastlane.worker._metrics import WorkerMetrics


@dataclass
class Ended:
    outcome: AttemptOutcome


def sample(metrics: WorkerMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_an_attempt_is_counted_by_outcome_timed_and_running_only_while_it_runs() -> None:
    metrics = WorkerMetrics(credits_free=lambda: 3)
    entered = asyncio.Event()
    release = asyncio.Event()

    async def attempt(outcome: AttemptOutcome) -> Ended:
        entered.set()
        await release.wait()
        return Ended(outcome)

    running = asyncio.create_task(metrics.observed("ledger.close", attempt(AttemptOutcome.SUCCEEDED)))
    await entered.wait()
    assert sample(metrics, "fastlane_worker_handlers_running") == 1
    release.set()
    assert (await running).outcome is AttemptOutcome.SUCCEEDED
    await metrics.observed("ledger.close", attempt(AttemptOutcome.TIMED_OUT))
    assert sample(metrics, "fastlane_worker_handlers_running") == 0
    assert sample(metrics, "fastlane_worker_attempts_total", job_type="ledger.close", outcome="succeeded") == 1
    assert sample(metrics, "fastlane_worker_attempts_total", job_type="ledger.close", outcome="timed_out") == 1
    assert sample(metrics, "fastlane_worker_handler_seconds_count", job_type="ledger.close") == 2
    assert sample(metrics, "fastlane_worker_credits_free") == 3


async def test_an_attempt_that_raises_leaves_the_running_gauge_as_it_was_and_counts_nothing() -> None:
    metrics = WorkerMetrics()

    async def broken() -> Ended:
        raise asyncio.CancelledError  # the worker stopping under it

    with pytest.raises(asyncio.CancelledError):
        await metrics.observed("t", broken())
    assert sample(metrics, "fastlane_worker_handlers_running") == 0
    assert sample(metrics, "fastlane_worker_handler_seconds_count", job_type="t") is None
