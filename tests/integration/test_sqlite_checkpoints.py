"""SQLite's write-ahead log is copied into the database file off the writer.

SQLite would run that copy (a checkpoint) itself, on the writer, inside the commit that takes the
log past 1,000 pages; that commit and every write queued behind it then wait for it. The store
turns that off and checkpoints on its read connection instead, at most once a
``CHECKPOINT_EVERY`` and only after writes.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from fastlane.domain.models import JobSpec, Schedule
from fastlane.storage.sqlite import connection as sqlite_connection
from fastlane.storage.sqlite import SQLiteStore

JOBS = 600  # each its own transaction, a few pages each: well past the 1,000 pages of SQLite's own checkpoint


async def create_jobs(store: SQLiteStore, prefix: str, count: int) -> None:
    for index in range(count):
        await store.create_job(JobSpec(name=f"{prefix}-{index}", job_type="t",
                                       schedule=Schedule.interval(timedelta(hours=1))))


async def test_the_writer_never_checkpoints_and_the_reader_does_after_writes(tmp_path, monkeypatch):
    database = tmp_path / "fastlane.db"
    log_file = tmp_path / "fastlane.db-wal"
    monkeypatch.setattr(sqlite_connection, "CHECKPOINT_EVERY", 3_600.0)
    store = SQLiteStore(f"sqlite:///{database}", shard_count=4)
    try:
        await store.migrate()
        size_before = database.stat().st_size
        await create_jobs(store, "held", JOBS)
        # Everything written is in the log: the writer copied none of it back.
        assert log_file.stat().st_size > 1_000 * 4_096
        assert database.stat().st_size == size_before

        monkeypatch.setattr(sqlite_connection, "CHECKPOINT_EVERY", 0.0)
        await create_jobs(store, "next", 1)  # a write: the checkpoint starts in the background
        async with asyncio.timeout(30):
            while database.stat().st_size == size_before:
                await asyncio.sleep(0.05)
        page = await store.list_jobs("default", limit=1_000)
        assert len(page.items) == JOBS + 1
    finally:
        await store.close()
