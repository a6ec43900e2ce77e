"""Runs with a concurrency key, *blocked* while their key is at its limit.

**Where the cap is checked, and why there.** The runs of one key belong to jobs in any shard,
owned by any node, so no node sees them all; the database does. A keyed run is sent only once its
dispatch is durable (as an at-most-once run is), and that dispatch is written by
:meth:`~fastlane.storage.Store.attempts.record_capped_dispatches`, which under a lock per key counts the
key's ``dispatched`` and ``running`` runs and starts the run only while they are fewer than its
limit. A place frees when a run leaves those states (it ends, waits for its retry, or its lease
runs out and it is queued again), so a node that crashes keeps nothing that must be given back.
Routing every run of a key to the node owning a "key shard" would check the cap in memory, but
would add a hop between nodes to every keyed run and a second ownership to fail over.

**Blocked runs.** A run the database left ``scheduled`` because its key was full waits here, oldest
first per key, and is offered again: as soon as a result of a keyed attempt sent by this node is
written, and every :data:`BLOCKED_RETRY_INTERVAL` for places freed on other nodes. Each try offers at
most a key's limit of its blocked runs (no more could start). A new run of a key that has runs
blocked joins them at the back rather than overtaking them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Collection
from typing import Protocol

from fastlane.domain.models import Run
from fastlane.engine.dispatch.messages import AttemptKey

BLOCKED_RETRY_INTERVAL = 0.2  # seconds between tries of blocked runs when nothing of this node ended
KEYED_PRUNE_AT = 10_000  # keyed attempts remembered before those no longer in flight are dropped

Key = tuple[str, str]  # (tenant, concurrency key)


def key_of(run: Run) -> Key | None:
    return None if run.concurrency_key is None else (run.tenant, run.concurrency_key)


class GateDispatcher(Protocol):
    """What the key gate needs of the dispatcher: where blocked runs are offered again, and its journal."""

    def offer_blocked(self, runs: list[Run]) -> None:
        """Take these runs again, as runs read from the database (confirmed first), ahead of those still blocked."""
        ...

    async def journal_written(self, timeout: float) -> None:
        """Wait until what was journalled before this call is written (or the timeout passes)."""
        ...


class KeyGate:
    """The runs blocked by their concurrency key, and the task that offers them again."""

    def __init__(self, dispatcher: GateDispatcher) -> None:
        self._dispatcher = dispatcher
        self._blocked: dict[Key, dict[str, Run]] = {}  # insertion order: oldest first
        self._blocked_ids: set[str] = set()
        self._keyed: set[AttemptKey] = set()  # keyed attempts this node started
        self._freed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._blocked_ids

    def __len__(self) -> int:
        return len(self._blocked_ids)

    def has_blocked(self, run: Run) -> bool:
        """Whether runs of ``run``'s key are blocked here (so ``run`` must queue behind them)."""
        key = key_of(run)
        return key is not None and key in self._blocked

    def block(self, runs: Collection[Run]) -> None:
        """Keep these runs until their key has room (the database left them ``scheduled``)."""
        for run in runs:
            key = key_of(run)
            if key is None or run.run_id in self._blocked_ids:
                continue
            self._blocked.setdefault(key, {})[run.run_id] = run
            self._blocked_ids.add(run.run_id)
        if self._blocked and self._task is None:
            self._task = asyncio.create_task(self._retry(), name="dispatch-blocked-by-key")

    def started(self, keys: Collection[AttemptKey]) -> None:
        """Attempts of keyed runs this node sent: their results free places."""
        self._keyed.update(keys)

    def ended(self, key: AttemptKey) -> None:
        """A worker reported the end of this attempt (its result is being written)."""
        if key in self._keyed:
            self._keyed.discard(key)
            if self._blocked:
                self._freed.set()

    def prune(self, in_flight: Collection[AttemptKey]) -> None:
        """Forget keyed attempts no longer in flight (their worker left; their lease will run out)."""
        if len(self._keyed) > KEYED_PRUNE_AT:
            self._keyed = {key for key in self._keyed if key in in_flight}

    def remove_if(self, matches: Callable[[Run], bool]) -> None:
        for key, runs in list(self._blocked.items()):
            for run_id in [run_id for run_id, run in runs.items() if matches(run)]:
                del runs[run_id]
                self._blocked_ids.discard(run_id)
            if not runs:
                del self._blocked[key]

    def depths(self) -> dict[tuple[str, str], int]:
        """Blocked runs by (job type, tenant); read by the metrics thread."""
        counts: Counter[tuple[str, str]] = Counter()
        for runs in list(self._blocked.values()):
            for run in list(runs.values()):
                counts[(run.job_type, run.tenant)] += 1
        return dict(counts)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _take_offers(self) -> list[Run]:
        offers: list[Run] = []
        for key, runs in list(self._blocked.items()):
            for run_id in list(runs)[: max(next(iter(runs.values())).concurrency_limit or 1, 1)]:
                offers.append(runs.pop(run_id))
                self._blocked_ids.discard(run_id)
            if not runs:
                del self._blocked[key]
        return offers

    async def _retry(self) -> None:
        try:
            while self._blocked:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._freed.wait(), BLOCKED_RETRY_INTERVAL)
                if self._freed.is_set():
                    self._freed.clear()
                    await self._dispatcher.journal_written(1.0)  # the result that freed a place is in the database
                self._dispatcher.offer_blocked(self._take_offers())
        finally:
            self._task = None
