"""The service contract of a node, and the plans it starts and stops by (after River's
``startstop.Service``).

A :class:`Service` is a background loop: a name and ``run()``, which runs it once. The node runs
each under :func:`~fastlane.runtime.supervise.supervised` (restarted with backoff when it raises;
one that keeps failing stops the node, which says why). Most parts of a node need no class of
their own: :class:`Loop` adapts any coroutine function in one line.

The start plan is a list of :class:`Start` entries: which services run, in which order, from
which moment (:class:`Phase`), and how each ends (:class:`Ending`). The stop plan is a list of
named :class:`Step`\\ s, walked in order by :func:`walk`, each logged. Adding a background loop to a
node is one service and one line of :func:`fastlane.server.plans.start_plan`.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from fastlane.runtime.metrics import Metrics
from fastlane.runtime.supervise import LoopGaveUp, supervised

log = logging.getLogger("fastlane.node")


class Service(Protocol):
    """A node's background loop: ``run`` runs it once; returning means its work is done."""

    @property
    def name(self) -> str:
        """The loop's name in logs and in ``fastlane_loop_failures_total{loop}``."""
        ...

    async def run(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Loop:
    """A :class:`Service` of a name and a coroutine function: the one-line adapter."""

    name: str
    body: Callable[[], Awaitable[None]]

    async def run(self) -> None:
        await self.body()


class Phase(enum.Enum):
    """When a service starts."""

    START = "with the node"
    READY = "once the node is ready (or stopping before it was)"


class Ending(enum.Enum):
    """How a service ends when the node stops."""

    # Returns by itself: a step of the stop plan stops its part, or it watches the stop event.
    RETURNS = "returns"
    # Cancelled as the node begins to stop, before any step: it reports on a node going away.
    FIRST = "cancelled first"
    # Restarted while it has work even while stopping, until drained; the drain step abandons it.
    DRAINED = "drained"
    # Cancelled once the stop steps are done: it follows changes for what is still running.
    LAST = "cancelled last"


@dataclass(frozen=True, slots=True)
class Start:
    """One line of a start plan."""

    service: Service
    ending: Ending = Ending.RETURNS
    phase: Phase = Phase.START


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a stop plan: what it does, for the log, and the action (awaited if it is a coroutine)."""

    name: str
    action: Callable[[], Awaitable[None] | None]


async def walk(steps: Sequence[Step], *, node_id: str) -> None:
    """Take the steps in order, each once the one before has finished."""
    for number, step in enumerate(steps, 1):
        log.info("node %s stopping (%d/%d): %s", node_id, number, len(steps), step.name)
        done = step.action()
        if inspect.isawaitable(done):
            await done


class Supervisor:
    """Runs the services of a start plan in a task group, each supervised, and ends them as their
    :class:`Ending` says. A service that gives up stops the node: ``gave_up`` is told why."""

    def __init__(self, group: asyncio.TaskGroup, *, metrics: Metrics, stop: asyncio.Event,
                 gave_up: Callable[[LoopGaveUp], None]) -> None:
        self._group = group
        self._metrics = metrics
        self._stop = stop
        self._gave_up = gave_up
        self._drained = asyncio.Event()  # set when a drain is abandoned: no more restarts
        self._tasks: dict[Ending, list[asyncio.Task[None]]] = {ending: [] for ending in Ending}

    def start(self, plan: Iterable[Start], phase: Phase) -> None:
        """Start the services of ``plan`` that start in ``phase``, in plan order."""
        for entry in plan:
            if entry.phase is phase:
                until = self._drained if entry.ending is Ending.DRAINED else self._stop
                task = self._group.create_task(self._supervise(entry.service, until), name=entry.service.name)
                self._tasks[entry.ending].append(task)

    async def _supervise(self, service: Service, until: asyncio.Event) -> None:
        try:
            await supervised(service.name, service.run, metrics=self._metrics, stop=until)
        except LoopGaveUp as failure:
            self._gave_up(failure)

    def cancel(self, ending: Ending) -> None:
        for task in self._tasks[ending]:
            task.cancel()

    async def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the services that end drained; whether they did.
        Those still running then are abandoned (cancelled)."""
        draining = self._tasks[Ending.DRAINED]
        if draining:
            await asyncio.wait(draining, timeout=timeout)  # which cancels nothing
        if all(task.done() for task in draining):
            return True
        self._drained.set()
        self.cancel(Ending.DRAINED)
        return False
