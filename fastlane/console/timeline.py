"""A workflow run's steps on a timeline: each step's span, from its first run's handler entered to
its last run's end (or now, while it runs), as a share of the whole run, for the console's bars."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from fastlane.domain.models import Attempt, Run
from fastlane.domain.workflows import StepView


@dataclass(frozen=True, slots=True)
class Bar:
    step: str
    state: str
    offset: float  # where it begins, 0..100 % of the run's span
    width: float  # how long it lasts, in % of the run's span (at least a sliver, to be seen)
    took: timedelta


def bars(steps: Sequence[StepView], runs: Mapping[str, tuple[Run, Sequence[Attempt]]], now: datetime) -> list[Bar]:
    """A bar for each step whose runs have started, in the steps' order."""
    spans: list[tuple[StepView, datetime, datetime]] = []
    for step in steps:
        starts = [attempt.started_at for run_id in step.run_ids if run_id in runs
                  for attempt in runs[run_id][1] if attempt.started_at is not None]
        if not starts:
            continue
        ends = [runs[run_id][0].finished_at or now for run_id in step.run_ids if run_id in runs]
        spans.append((step, min(starts), max([*ends, min(starts)])))
    if not spans:
        return []
    begin, end = min(span[1] for span in spans), max(span[2] for span in spans)
    whole = max((end - begin).total_seconds(), 1e-6)
    return [Bar(step.name, step.state.value, offset=100 * (started - begin).total_seconds() / whole,
                width=max(100 * (ended - started).total_seconds() / whole, 0.5), took=ended - started)
            for step, started, ended in spans]
