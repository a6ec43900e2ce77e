"""The SQLite store's history retention: finished runs deleted oldest first, in small batches.

SQLite has one writer: a batch holds it while it deletes, and the fire path's writes wait. The
trimmer keeps batches small (see :mod:`fastlane.engine.retention`) so that wait stays short.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from datetime import datetime

from fastlane.clock import to_micros
from fastlane.storage import common
from fastlane.storage.results import TrimmedHistory
from fastlane.storage.sqlite.connection import SQLiteConnections, fetch_all, json_array

DOOMED_RUNS = f"""
SELECT run_id FROM runs
WHERE finished_at < ? AND shard_id IN (SELECT value FROM json_each(?)) AND state IN ({common.FINAL_STATES_SQL})
ORDER BY finished_at
LIMIT ?
"""
DELETE_ATTEMPTS = "DELETE FROM attempts WHERE run_id IN (SELECT value FROM json_each(?))"
DELETE_RUNS = "DELETE FROM runs WHERE run_id IN (SELECT value FROM json_each(?))"


class SQLiteHistory(SQLiteConnections):
    """History retention of :class:`~fastlane.storage.sqlite.SQLiteStore`."""

    async def trim_history(self, shard_ids: Collection[int], finished_before: datetime, limit: int) -> TrimmedHistory:
        common.trim_limit(limit)
        if not shard_ids:
            return TrimmedHistory(runs=0, busy_seconds=0.0)
        async with self._transaction() as db:
            started = time.perf_counter()  # the writer's turn is ours from here to the commit
            rows = await fetch_all(db, DOOMED_RUNS, (to_micros(finished_before), json_array(shard_ids), limit))
            doomed = json_array(row["run_id"] for row in rows)
            await db.execute(DELETE_ATTEMPTS, (doomed,))
            await db.execute(DELETE_RUNS, (doomed,))
        return TrimmedHistory(runs=len(rows), busy_seconds=time.perf_counter() - started)
