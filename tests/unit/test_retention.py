"""The history trimmer's loop: batches while old history is left, idles once caught up, and a
failure of any kind never ends it."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from datetime import UTC, datetime, timedelta

import pytest

from fastlane.domain.errors import StorageUnavailable
from fastlane.engine.retention import LOOP_NAME, HistoryTrimmer
from fastlane.runtime.metrics import Metrics
from fastlane.storage.results import TrimmedHistory

DB_NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
RETENTION = timedelta(days=30)


class OldHistory:
    """A store holding ``old`` finished runs past the retention; ``failures`` are raised first, one per call."""

    @property
    def history(self) -> OldHistory:  # the part of a store this fake plays
        return self

    def __init__(self, old: int, failures: list[Exception] | None = None) -> None:
        self.old = old
        self.failures = list(failures or [])
        self.calls: list[tuple[list[int], datetime, int]] = []
        self.drained = asyncio.Event()

    async def db_now(self) -> datetime:
        return DB_NOW

    async def trim_history(self, shard_ids: Collection[int], finished_before: datetime, limit: int) -> TrimmedHistory:
        self.calls.append((sorted(shard_ids), finished_before, limit))
        if self.failures:
            raise self.failures.pop(0)
        trimmed = min(limit, self.old)
        self.old -= trimmed
        if self.old == 0:
            self.drained.set()
        return TrimmedHistory(runs=trimmed, busy_seconds=0.001)


async def trim_until_drained(store: OldHistory, owned: Collection[int] = (0, 1)) -> Metrics:
    metrics, stopping = Metrics(), asyncio.Event()
    trimmer = HistoryTrimmer(store, retention=RETENTION, owned_shards=lambda: owned,  # type: ignore[arg-type]
                             metrics=metrics, stopping=stopping, batch_size=100, idle_interval=0.01)
    task = asyncio.create_task(trimmer.run())
    try:
        await asyncio.wait_for(store.drained.wait(), 10)
        calls = len(store.calls)
        await asyncio.sleep(0.05)
        assert len(store.calls) > calls, "the trimmer stopped looking once caught up"
    finally:
        stopping.set()
        await asyncio.wait_for(task, 2)  # returns promptly once the node stops
    return metrics


async def test_old_history_goes_in_batches_of_the_owned_shards_before_the_cutoff():
    store = OldHistory(old=250)
    metrics = await trim_until_drained(store)
    assert [limit for _, _, limit in store.calls[:3]] == [100, 100, 100]
    assert all(shards == [0, 1] and cutoff == DB_NOW - RETENTION for shards, cutoff, _ in store.calls)
    assert metrics.history_trimmed._value.get() == 250


async def test_the_database_out_of_reach_or_a_failing_trim_does_not_end_the_loop():
    store = OldHistory(old=100, failures=[StorageUnavailable("down (test)"), RuntimeError("bug (test)")])
    metrics = await trim_until_drained(store)
    assert metrics.history_trimmed._value.get() == 100
    assert metrics.loop_failures.labels(loop=LOOP_NAME)._value.get() == 1  # the bug counted, the weather not


async def test_a_node_without_shards_trims_nothing():
    store = OldHistory(old=100)
    metrics, stopping = Metrics(), asyncio.Event()
    trimmer = HistoryTrimmer(store, retention=RETENTION, owned_shards=lambda: [],  # type: ignore[arg-type]
                             metrics=metrics, stopping=stopping, batch_size=100)
    assert await trimmer.trim_batch() is None
    assert store.calls == [] and store.old == 100


async def test_a_node_that_owns_no_shard_yet_looks_again_soon(monkeypatch):
    monkeypatch.setattr("fastlane.engine.retention.NO_SHARDS_RETRY", 0.01)
    store = OldHistory(old=100)
    answers = [[], [], [3]]  # starting up: the shards come a moment later

    def owned() -> list[int]:
        return answers.pop(0) if len(answers) > 1 else answers[0]

    metrics, stopping = Metrics(), asyncio.Event()
    trimmer = HistoryTrimmer(store, retention=RETENTION, owned_shards=owned,  # type: ignore[arg-type]
                             metrics=metrics, stopping=stopping, batch_size=100, idle_interval=60)
    task = asyncio.create_task(trimmer.run())
    try:
        await asyncio.wait_for(store.drained.wait(), 5)  # not after the 60 s idle interval
        assert store.calls[0][0] == [3]
    finally:
        stopping.set()
        await asyncio.wait_for(task, 2)


async def test_a_full_batch_is_followed_by_nine_times_the_time_it_kept_the_database_busy(monkeypatch):
    store = OldHistory(old=300)
    pauses: list[float] = []
    stopping = asyncio.Event()

    async def recorded(_: asyncio.Event, seconds: float) -> None:
        pauses.append(seconds)
        if store.old == 0:
            stopping.set()

    monkeypatch.setattr("fastlane.engine.retention.pause", recorded)
    trimmer = HistoryTrimmer(store, retention=RETENTION, owned_shards=lambda: [0],  # type: ignore[arg-type]
                             metrics=Metrics(), stopping=stopping, batch_size=100, idle_interval=60)
    await asyncio.wait_for(trimmer.run(), 5)
    # Each batch reports 1 ms busy (the fake's), so each full one is followed by 9 ms (above the
    # 5 ms floor); the third empties the store and stops the loop.
    assert pauses == pytest.approx([0.009, 0.009, 0.009])
