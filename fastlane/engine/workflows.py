"""The workflow coordinator: starts workflow runs on their time and moves them on as steps end.

A workflow's schedule is an ordinary job (job type ``fastlane.workflow``): the lane fires it like
any other, and the dispatcher hands its due runs here instead of to a worker
(:meth:`WorkflowInbox.take_starts`). A step run that ends is reported here by the journal once its
result is durable (:meth:`WorkflowInbox.ended`).
Both are done by the store in its own transactions (:mod:`fastlane.storage.workflows`), batched,
off the fire path; the runs they schedule or cancel go back to the lane and the dispatcher
through the same steps as a trigger or a cancel (:class:`RunEvents`).

Nothing here is needed for correctness after a crash: a due trigger run is still ``scheduled`` and
is released again by whichever node owns its shard next, and a step run that ended while no node
advanced its workflow run is found by the periodic sweep (:data:`SWEEP_EVERY`) of the owned shards.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Protocol

from fastlane.domain.errors import StorageError, new_error_id
from fastlane.domain.models import Run
from fastlane.domain.workflows import WORKFLOW_JOB_TYPE
from fastlane.storage import Store
from fastlane.storage.workflows import ADVANCE_BATCH, WorkflowChanges

log = logging.getLogger("fastlane.workflows")

SWEEP_EVERY = 1.0  # seconds between looks for workflow runs a crashed node left unadvanced
RETRY_PAUSES = (0.05, 0.2, 1.0, 2.0)  # after a storage error, before the work is tried again


class RunEvents(Protocol):
    """Where the runs a workflow write scheduled or cancelled go (:class:`~fastlane.engine.operations.Operations`)."""

    def workflow_changes(self, changes: WorkflowChanges, *, released_here: Collection[int] = ()) -> None: ...


class WorkflowInbox:
    """What dispatch hands the coordinator (its ``WorkflowHooks``): due runs of workflow jobs, and
    the workflow runs whose step runs ended. Made before the dispatcher, which it is given to; the
    coordinator, made once the operations it acts through exist, works through it."""

    def __init__(self) -> None:
        self.starts: dict[str, Run] = {}
        self.advances: set[str] = set()
        self.wake = asyncio.Event()

    def take_starts(self, runs: Iterable[Run]) -> Iterable[Run]:
        """Of runs the lane released, start the workflow runs of those of workflow jobs (no worker
        takes them); return the others, for workers. One look at each run's type on the fire path."""
        runs = list(runs)
        if not any(run.job_type == WORKFLOW_JOB_TYPE for run in runs):
            return runs
        for run in runs:
            if run.job_type == WORKFLOW_JOB_TYPE:
                self.starts[run.run_id] = run
        self.wake.set()
        return [run for run in runs if run.job_type != WORKFLOW_JOB_TYPE]

    def ended(self, workflow_run_ids: Iterable[str]) -> None:
        """Step runs of these workflow runs ended: decide what comes next."""
        self.advances.update(workflow_run_ids)
        self.wake.set()


class WorkflowCoordinator:
    """Works off its inbox: ``events`` is where the runs it schedules or cancels go, ``owned`` says
    which shards this node owns (for the sweep, and to release step runs here)."""

    def __init__(self, store: Store, inbox: WorkflowInbox, *, events: RunEvents, owned: Callable[[], Sequence[int]],
                 sweep_every: float = SWEEP_EVERY) -> None:
        self._store = store
        self._events = events
        self._owned = owned
        self._sweep_every = sweep_every
        self._starts = inbox.starts
        self._advances = inbox.advances
        self._set_aside: dict[str, str] = {}  # workflow run id -> why (an error id in the log)
        self._wake = inbox.wake

    def apply(self, changes: WorkflowChanges, released_here: Collection[int]) -> None:
        self._events.workflow_changes(changes, released_here=released_here)

    async def run(self) -> None:
        next_sweep = time.monotonic() + self._sweep_every
        failures = 0
        while True:
            try:
                async with asyncio.timeout(max(next_sweep - time.monotonic(), 0)):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + self._sweep_every
                    found = await self._store.workflows.workflow_runs_to_advance(self._owned())
                    self._advances.update(run_id for run_id in found if run_id not in self._set_aside)
                await self._work()
                failures = 0
            except StorageError as error:
                # Left queued: tried again after a pause that grows while the database stays away.
                pause = RETRY_PAUSES[min(failures, len(RETRY_PAUSES) - 1)]
                failures += 1
                log.warning("workflow work waits %.2f s for the database: %s", pause, error)
                await asyncio.sleep(pause)
                self._wake.set()

    async def _work(self) -> None:
        """Start and advance what is queued, a batch (one transaction) at a time, each batch's
        runs released as soon as it commits. The step runs of shards this node owns it releases
        itself, at once (the store tells no other node of them); see :class:`RunEvents`."""
        while self._starts or self._advances:
            here = frozenset(self._owned())
            if starts := list(self._starts.values())[:ADVANCE_BATCH]:
                try:
                    changes = await self._store.workflows.start_workflow_runs(starts, released_here=here)
                except StorageError:
                    raise
                except Exception:
                    changes = await self._one_at_a_time(starts, set(), here)
                else:
                    for run in starts:
                        self._starts.pop(run.run_id, None)
                self.apply(changes, here)
            if advances := set(sorted(self._advances)[:ADVANCE_BATCH]):
                try:
                    changes = await self._store.workflows.advance_workflow_runs(advances, released_here=here)
                except StorageError:
                    raise
                except Exception:
                    changes = await self._one_at_a_time([], advances, here)
                else:
                    self._advances.difference_update(advances)  # in place: the inbox shares it
                self.apply(changes, here)

    async def _one_at_a_time(self, starts: list[Run], advances: set[str], here: frozenset[int]) -> WorkflowChanges:
        changes = WorkflowChanges()
        for run in starts:
            self._starts.pop(run.run_id, None)
            try:
                changes.add(await self._store.workflows.start_workflow_runs([run], released_here=here))
            except StorageError:
                self._starts[run.run_id] = run
                raise
            except Exception:
                # One workflow run this code cannot handle must not stop the others: set aside
                # with its reason (its error id in the log), the rest goes on.
                self._put_aside(run.run_id, "starting")
        for workflow_run_id in sorted(advances):
            self._advances.discard(workflow_run_id)
            try:
                changes.add(await self._store.workflows.advance_workflow_runs([workflow_run_id], released_here=here))
            except StorageError:
                self._advances.add(workflow_run_id)
                raise
            except Exception:
                self._put_aside(workflow_run_id, "advancing")
        return changes

    def _put_aside(self, workflow_run_id: str, doing: str) -> None:
        error_id = new_error_id()
        log.exception("%s workflow run %s failed (error id %s); set aside until the node restarts",
                      doing, workflow_run_id, error_id)
        self._set_aside[workflow_run_id] = error_id
