"""The scenarios ``fastlane bench`` runs, by name.

Each measures with a :class:`~fastlane.bench.harness.Bench` and returns one result per system measured;
its ``budget`` is the hard deadline in seconds, generous enough that only a hung run reaches it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastlane.bench.harness import Bench
from fastlane.bench.scenarios import (
    concurrency,
    console,
    cron,
    failover,
    fairness,
    floor,
    oneshot,
    priority,
    retention,
    scale,
    soak,
    sustained,
    workflow,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    measure: Callable[[Bench], Awaitable[list[dict[str, object]]]]
    budget: Callable[[Bench], float]


SCENARIOS: dict[str, Scenario] = {
    "spread": Scenario(measure=oneshot.spread, budget=oneshot.spread_budget),
    "burst": Scenario(measure=oneshot.burst, budget=oneshot.burst_budget),
    "sustained": Scenario(measure=sustained.sustained, budget=sustained.budget),
    "cron": Scenario(measure=cron.cron, budget=cron.budget),
    "scale": Scenario(measure=scale.scale, budget=scale.budget),
    "failover": Scenario(measure=failover.failover, budget=failover.budget),
    "fairness": Scenario(measure=fairness.fairness, budget=fairness.budget),
    "priority": Scenario(measure=priority.priority, budget=priority.budget),
    "concurrency": Scenario(measure=concurrency.concurrency, budget=concurrency.budget),
    "retention": Scenario(measure=retention.retention, budget=retention.budget),
    "workflow": Scenario(measure=workflow.workflow, budget=workflow.budget),
    "console": Scenario(measure=console.console, budget=console.budget),
    "floor": Scenario(measure=floor.floor, budget=floor.budget),
    "soak": Scenario(measure=soak.soak, budget=soak.budget),
}
# The scenarios that take --floor (a floor measured first, their runs/s as a ratio to it) and
# --profile (py-spy on node-1 over the measured interval).
WITH_FLOOR = ("sustained", "burst")
