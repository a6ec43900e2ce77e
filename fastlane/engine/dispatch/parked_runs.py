"""Released runs left in the database because their job type's ready queue was full.

A node keeps at most ``--max-ready-per-type`` runs (and ``--max-ready-bytes-per-type`` bytes) of a type in memory; beyond that a released
run is *parked*: only its id, shard and due time stay here, oldest first. Once the queue is down
to half, parked runs are read back from the database in batches, as runs of the database
(``confirm_first``): one another attempt took meanwhile is not sent twice, one no longer
``scheduled`` (cancelled) is not read at all.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from fastlane.domain.errors import StorageError
from fastlane.domain.models import Run
from fastlane.storage import Store

log = logging.getLogger("fastlane.dispatch")

RELOAD_BATCH = 1_000  # parked runs read back per query


@dataclass(frozen=True, slots=True)
class Parked:
    shard_id: int
    available_at: datetime


class _AllBut:
    """A ``skip`` for :meth:`Store.lane.pending_runs` that skips every run but the wanted ones."""

    def __init__(self, wanted: Iterable[str]) -> None:
        self._wanted = set(wanted)

    def __contains__(self, run_id: object) -> bool:
        return run_id not in self._wanted


class ReadyQueues(Protocol):
    """The dispatcher's ready queues, which runs are parked out of and read back into."""

    @property
    def assigning(self) -> bool:
        """Whether runs are still assigned (not once the node stops assigning: parked runs stay in the database)."""
        ...

    def room(self, job_type: str) -> int:
        """Runs the ready queue of ``job_type`` can take now (0: full, by count or bytes)."""
        ...

    def half_empty(self, job_type: str) -> bool:
        """Whether the ready queue of ``job_type`` is down to half (by count and bytes)."""
        ...

    def read_back(self, runs: list[Run]) -> None:
        """Parked runs read back from the database: released again, confirmed first."""
        ...


class ParkedRuns:
    def __init__(self, store: Store, *, ready: ReadyQueues) -> None:
        self._store = store
        self._ready = ready
        self._by_type: dict[str, dict[str, Parked]] = {}  # insertion order: oldest first
        self._ids: set[str] = set()
        self._reloading: set[str] = set()  # job types whose parked runs are being read back
        self._tasks: set[asyncio.Task[None]] = set()

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def any_of(self, job_type: str) -> bool:
        return bool(self._by_type.get(job_type))

    def park(self, run: Run, queued: int) -> None:
        parked = self._by_type.get(run.job_type)
        if not parked:
            log.warning("ready queue of job type %r is full (%d runs): further runs wait in the database "
                        "until workers take these", run.job_type, queued)
            parked = self._by_type[run.job_type] = {}
        parked[run.run_id] = Parked(run.shard_id, run.available_at)
        self._ids.add(run.run_id)

    def unpark(self, matches: Callable[[str, Parked], bool]) -> None:
        for job_type, parked in list(self._by_type.items()):
            for run_id in [run_id for run_id, entry in parked.items() if matches(run_id, entry)]:
                del parked[run_id]
                self._ids.discard(run_id)
            if not parked:
                del self._by_type[job_type]

    def refill(self, job_type: str) -> None:
        """Read parked runs of this type back once its queue is down to half (one task per type)."""
        if job_type in self._reloading or not self._by_type.get(job_type) or not self._ready.half_empty(job_type):
            return
        self._reloading.add(job_type)
        task = asyncio.create_task(self._reload(job_type), name=f"dispatch-reload:{job_type}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reload(self, job_type: str) -> None:
        """Fill the queue of ``job_type`` from its parked runs, oldest first, while it has room."""
        try:
            while self._ready.assigning and (room := self._ready.room(job_type)) > 0:
                parked = self._by_type.get(job_type)
                if not parked:
                    return
                wanted = dict(itertools.islice(parked.items(), min(room, RELOAD_BATCH)))
                try:
                    runs = await self._store.lane.pending_runs(
                        {entry.shard_id for entry in wanted.values()},
                        max(entry.available_at for entry in wanted.values()) + timedelta(microseconds=1),
                        skip=_AllBut(wanted),
                    )
                except StorageError as error:
                    # Still parked: the next credit granted for this type tries again.
                    log.warning("could not read back %d parked runs of job type %r: %s", len(wanted), job_type, error)
                    return
                # Dropped meanwhile (a lost shard, a cancel) are not released; runs not found are
                # no longer scheduled, or changed: the lane's full scan finds those still pending.
                still_parked = [run for run in runs if run.run_id in self._ids]
                self.unpark(lambda run_id, _, wanted=wanted: run_id in wanted)  # type: ignore[misc]
                self._ready.read_back(still_parked)
                if any(run.run_id in self._ids for run in still_parked):
                    return  # the queue is full by bytes: parked again, read back when it drains
        finally:
            self._reloading.discard(job_type)
