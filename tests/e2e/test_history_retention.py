"""A real node trims finished runs past --history-retention, and nothing else."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

from e2e_support import Daemon, Process

from fastlane.storage import open_store
from fastlane.storage.base import DEFAULT_SHARD_COUNT as SHARDS
from fastlane.testing.history import count_old_runs, seed_old_history

OLD = 500


async def test_a_node_deletes_the_runs_that_ended_before_its_retention(db_url: str, tmp_path: Path,
                                                                       processes: list[Process]) -> None:
    # Ended 40 days ago: past the 35 days the flag asks for.
    await seed_old_history(db_url, OLD, timedelta(days=40))  # and one run that just ended
    node = Daemon(db_url, tmp_path / "daemon.log", shards=SHARDS, extra_args=["--history-retention", "35"])
    node.start()
    processes.append(node)
    await node.wait_ready()
    deadline = time.monotonic() + 30
    while await count_old_runs(db_url):
        assert time.monotonic() < deadline, f"old runs left after 30 s:\n{node.log_tail()}"
        await asyncio.sleep(0.1)
    assert node.metrics()["fastlane_history_trimmed_total"] == OLD
    store = open_store(db_url, shard_count=SHARDS)
    try:
        recent = [run for run in (await store.runs.list_runs("default", limit=10)).items]
        assert len(recent) == 1 and recent[0].finished_at is not None  # ended now: kept
        assert len(await store.runs.list_attempts(recent[0].run_id)) == 1
    finally:
        await store.close()
