"""History retention: each node deletes its shards' finished runs once they are older than
``--history-retention``, a small batch at a time, off the fire path.

A per-second job writes 86,400 runs a day; without this the tables only grow. Trimming follows
shard ownership, so a cluster shares the work and a node taking shards over takes their trimming
too (two nodes briefly trimming one shard during a hand-over delete different rows or the same
ones once: nothing to fence).

Pacing: each batch is followed by a pause :data:`PAUSE_PER_BATCH_TIME` times as long as its
transaction kept the database busy (the store measures it, leaving out waits for a connection or
for SQLite's writer, which say how busy the fire path is, not what trimming costs), so trimming
takes at most a tenth of the database's time (per node) however large the backlog (say
1,000,000 old runs when retention is first turned on), and the fire path's writes never wait
behind more than one small batch. With nothing old left it looks again every
:data:`IDLE_INTERVAL` seconds. Why a tenth: where node, database and workers share a few cores,
the database's time spent trimming is CPU taken from the workers that start runs, so a larger
share shows in the fire path's start lag (``fastlane bench retention`` compares the two); a tenth
of PostgreSQL's time still deletes old runs far faster than they finish. SQLite's one writer
makes each delete wait its turn behind the fire path's writes, so there the same tenth deletes
far fewer a second.

A trim that fails is never the node's failure: the database being out of reach is waited out with
backoff; anything else is logged with its traceback, counted in
``fastlane_loop_failures_total{loop="history-trim"}`` and tried again after the idle interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from datetime import timedelta

from fastlane.domain.errors import StorageUnavailable
from fastlane.engine.waits import pause
from fastlane.runtime.metrics import Metrics
from fastlane.runtime.supervise import Backoff
from fastlane.storage import Store
from fastlane.storage.results import TrimmedHistory

log = logging.getLogger("fastlane.retention")

PAUSE_PER_BATCH_TIME = 9.0
MIN_PAUSE = 0.005  # seconds between full batches, however fast they were
IDLE_INTERVAL = 60.0  # seconds between looks once nothing is old enough
NO_SHARDS_RETRY = 1.0  # seconds between looks while the node owns no shard (at start-up)
UNAVAILABLE_BACKOFF = Backoff(first=1.0, cap=60.0)
LOOP_NAME = "history-trim"
DEFAULT_RETENTION = timedelta(days=30)  # --history-retention


class HistoryTrimmer:
    """Deletes finished runs older than ``retention`` from the shards this node owns."""

    def __init__(
        self,
        store: Store,
        *,
        retention: timedelta,
        owned_shards: Callable[[], Collection[int]],
        metrics: Metrics,
        stopping: asyncio.Event,
        batch_size: int,
        idle_interval: float = IDLE_INTERVAL,
    ) -> None:
        self._store = store
        self._retention = retention
        self._owned_shards = owned_shards
        self._metrics = metrics
        self._stopping = stopping
        self._batch_size = batch_size
        self._idle_interval = idle_interval

    async def run(self) -> None:
        """Trim until the node stops; returns then."""
        unavailable = 0  # failures in a row with the database out of reach: sets the backoff
        while not self._stopping.is_set():
            try:
                trimmed = await self.trim_batch()
            except StorageUnavailable as error:
                unavailable += 1
                delay = UNAVAILABLE_BACKOFF.delay(unavailable)
                log.warning("history trim: the database is unavailable (%s); trying again in %.0f s", error, delay)
                await pause(self._stopping, delay)
                continue
            except Exception:
                self._metrics.loop_failures.labels(loop=LOOP_NAME).inc()
                log.exception("history trim failed; trying again in %.0f s", self._idle_interval)
                await pause(self._stopping, self._idle_interval)
                continue
            unavailable = 0
            if trimmed is None:
                await pause(self._stopping, NO_SHARDS_RETRY)  # starting, or every shard lost: soon again
            elif trimmed.runs < self._batch_size:
                # Caught up (or, on PostgreSQL, the rest locked by another node's trimmer a moment).
                await pause(self._stopping, self._idle_interval)
            else:
                await pause(self._stopping, max(MIN_PAUSE, PAUSE_PER_BATCH_TIME * trimmed.busy_seconds))

    async def trim_batch(self) -> TrimmedHistory | None:
        """Delete one batch of finished runs older than the retention (None: this node owns no
        shard now)."""
        owned = self._owned_shards()
        if not owned:
            return None
        cutoff = await self._store.db_now() - self._retention
        trimmed = await self._store.history.trim_history(owned, cutoff, self._batch_size)
        if trimmed.runs:
            self._metrics.history_trimmed.inc(trimmed.runs)
        return trimmed
