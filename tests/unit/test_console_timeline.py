"""A workflow run's timeline (:mod:`fastlane.console.timeline`): each started step's span as a
share of the whole run, a running step up to now, a step not started left out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from fastlane.console.timeline import bars
from fastlane.domain.workflows import StepState, StepView

T0 = datetime(2027, 1, 1, tzinfo=UTC)


def run(started: float | None, finished: float | None) -> tuple[Any, list[Any]]:
    """A run (its finished_at) and its attempts (their started_at), seconds after T0."""
    finish = None if finished is None else T0 + timedelta(seconds=finished)
    attempts = [] if started is None else [SimpleNamespace(started_at=T0 + timedelta(seconds=started))]
    return SimpleNamespace(finished_at=finish), attempts


def test_each_started_step_spans_its_share_of_the_run_and_a_running_one_reaches_now() -> None:
    steps = [StepView(name="sum", state=StepState.SUCCEEDED, run_ids=("a",)),
             StepView(name="mail", state=StepState.ACTIVE, run_ids=("b", "c")),
             StepView(name="report", state=StepState.WAITING, run_ids=())]
    runs = {"a": run(0, 2), "b": run(2, 3), "c": run(2.5, None)}
    drawn = bars(steps, runs, now=T0 + timedelta(seconds=4))
    assert [bar.step for bar in drawn] == ["sum", "mail"]  # report has not started
    summed, mailed = drawn
    assert (summed.offset, summed.width, summed.took) == (0, 50, timedelta(seconds=2))
    assert mailed.offset == 50 and mailed.width == pytest.approx(50) and mailed.took == timedelta(seconds=2)


def test_nothing_started_draws_nothing_and_an_instant_step_is_still_seen() -> None:
    waiting = [StepView(name="sum", state=StepState.WAITING, run_ids=("a",))]
    assert bars(waiting, {"a": run(None, None)}, now=T0) == []
    [bar] = bars([StepView(name="sum", state=StepState.SUCCEEDED, run_ids=("a",))], {"a": run(1, 1)}, now=T0)
    assert bar.width == 0.5  # a sliver, not nothing
