"""On SQLite, a statement costs a hop to its connection's thread and back (a wake-up of each), and
on a busy node a hop costs more than a small statement: a write transaction's BEGIN rides with its
first statement, a procedure of several statements is one hop, and a journal round of dispatches
and results is one transaction."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import aiosqlite
import pytest

from fastlane.domain.models import AttemptOutcome, DueJob, JobSpec, RunState, Schedule
from fastlane.domain.policies import plan_occurrence
from fastlane.storage import AttemptResult, Dispatch, Heartbeat, open_store
from fastlane.storage.sqlite.connection import in_thread

TTL = timedelta(seconds=30)


@pytest.fixture
async def store(tmp_path):  # type: ignore[no-untyped-def]
    store = open_store(f"sqlite:///{tmp_path}/hops.db", shard_count=4)
    await store.migrate()
    yield store
    await store.close()


def count_hops(connection: aiosqlite.Connection, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each function aiosqlite queues for the connection's thread from now on, by name."""
    hops: list[str] = []
    queue = connection._execute

    async def counted(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        hops.append(getattr(fn, "__name__", repr(fn)))
        return await queue(fn, *args, **kwargs)

    monkeypatch.setattr(connection, "_execute", counted)
    return hops


async def test_in_thread_runs_in_the_connections_own_thread(store) -> None:  # type: ignore[no-untyped-def]
    async with store.database.read():
        reader = store.database._reader
    assert reader is not None
    ident = await in_thread(reader, lambda connection: threading.get_ident())
    assert ident == reader._thread.ident != threading.get_ident()


async def test_a_journal_round_is_one_transaction_of_six_hops(store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    leases = {lease.shard_id: lease for lease in await store.shards.acquire_shards("node-a", TTL, limit=4)}
    now = await store.db_now()
    runs = []
    for name in ("a", "b"):
        job, _ = await store.jobs.create_job(JobSpec(name=name, job_type="t", schedule=Schedule.at_instant(now)))
        occurrence = plan_occurrence(DueJob.of(job), now, now)
        runs += (await store.lane.materialise_runs([leases[job.shard_id]], [occurrence])).runs
    first, second = runs
    # First the other run is sent and its heartbeat pending, as on a busy node.
    await store.attempts.record_dispatches([Dispatch(run_id=second.run_id, lease_token=2, worker_id="w", node_id="n",
                                                     lease_ttl=TTL, dispatched_at=datetime.now(UTC))])
    hops = count_hops(store.database._writer, monkeypatch)
    written = await store.attempts.record_round(
        [Dispatch(run_id=first.run_id, lease_token=1, worker_id="w", node_id="n", lease_ttl=TTL,
                  dispatched_at=datetime.now(UTC))],
        [Heartbeat(run_id=second.run_id, lease_token=2, started=True)],
        [AttemptResult(run_id=first.run_id, lease_token=1, outcome=AttemptOutcome.SUCCEEDED)])
    assert [attempt.run_id for attempt in written.attempts] == [first.run_id] and written.stale == []
    # BEGIN with the dispatch (runs and attempts), the heartbeat's lease, its start, the success
    # (runs and attempts), the overlap buffer's release, COMMIT: 15 as three transactions of a
    # hop a statement.
    assert len(hops) == 6, hops
    assert (await store.runs.get_run("default", first.run_id)).state is RunState.SUCCEEDED
    assert (await store.runs.get_run("default", second.run_id)).state is RunState.RUNNING


async def test_a_write_that_runs_nothing_commits_nothing_and_one_that_fails_first_rolls_back(store) -> None:  # type: ignore[no-untyped-def]
    async with store.database.write():
        pass
    with pytest.raises(Exception):  # noqa: B017, PT011  (the driver's own error, classified)
        async with store.database.write() as tx:
            await tx.execute("INSERT INTO no_such_table VALUES (1)")
    async with store.database.write() as tx:
        await tx.execute("CREATE TABLE t (x INTEGER)")
        await tx.execute("INSERT INTO t VALUES (1)")
    async with store.database.read() as tx:
        assert await tx.fetchval("SELECT count(*) FROM t") == 1
    assert not store.database._writer.in_transaction
