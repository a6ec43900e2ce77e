"""The PostgreSQL store's history retention: finished runs deleted oldest first, in batches.

Why batches of deletes and not time partitions of run history (dropping a partition is cheaper
still): a run is found by its id on every result, heartbeat and ``runs get``, and a partition key
would have to join that key; and a partition old enough to drop may still hold a run that is not
finished (retrying for days, or held by a paused job), which must be kept. The deletes walk the
``runs_finished`` index from its old end, skip rows another trimmer holds, and take one small
transaction per batch, so the fire path's writes never wait long behind them (measured by
``fastlane bench retention``). Deleting a run costs about what writing it did; at the rates where
that matters (10,000 runs a second, every second) partitions would pay, with runs that outlive
their partition moved out before it is dropped.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from datetime import datetime

from fastlane.storage import common
from fastlane.storage.postgres.connection import PostgresConnections
from fastlane.storage.results import TrimmedHistory

TRIM_HISTORY = f"""
WITH doomed AS (
    SELECT run_id FROM runs
    WHERE finished_at < $1 AND shard_id = ANY($2::integer[]) AND state IN ({common.FINAL_STATES_SQL})
    ORDER BY finished_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), attempts_gone AS (
    DELETE FROM attempts a USING doomed d WHERE a.run_id = d.run_id
), runs_gone AS (
    DELETE FROM runs r USING doomed d WHERE r.run_id = d.run_id RETURNING 1
)
SELECT count(*) FROM runs_gone
"""


class PostgresHistory(PostgresConnections):
    """History retention of :class:`~fastlane.storage.postgres.PostgresStore`."""

    async def trim_history(self, shard_ids: Collection[int], finished_before: datetime, limit: int) -> TrimmedHistory:
        common.trim_limit(limit)
        if not shard_ids:
            return TrimmedHistory(runs=0, busy_seconds=0.0)
        async with self._transaction() as db:
            started = time.perf_counter()
            runs = int(await db.fetchval(TRIM_HISTORY, finished_before, list(shard_ids), limit))
        return TrimmedHistory(runs=runs, busy_seconds=time.perf_counter() - started)
