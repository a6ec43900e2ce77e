"""A fenced write on SQLite costs the same statements however many shards its batch spans.

Each statement is a round trip between the event loop and the connection's thread, and under load
every round trip waits for a turn of the loop. In ``fastlane bench fairness`` a flood's batch
spans all 64 shards; checked one fence per statement, that was 64 round trips per write where one
does, and the quiet tenant's runs were written after their instant in 5 of 8 runs. PostgreSQL
checks a batch's fences in one statement already (``unnest``); this holds SQLite to the same.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastlane.domain.models import DueJob, JobSpec, Schedule
from fastlane.domain.policies import plan_occurrence
from fastlane.storage import open_store

SHARDS = 64
TTL = timedelta(seconds=30)


async def statements_to_materialise(store, jobs, leases) -> list[str]:
    """The statements the writer runs to materialise one occurrence of each job, fenced by ``leases``."""
    now = await store.db_now()
    occurrences = [plan_occurrence(DueJob.of(job), now, now) for job in jobs]
    fences = [leases[shard] for shard in sorted({job.shard_id for job in jobs})]
    ran: list[str] = []
    writer = store.database._writer  # the store's one write connection, opened by the writes before this
    await writer.set_trace_callback(ran.append)
    try:
        written = await store.lane.materialise_runs(fences, occurrences)
    finally:
        await writer.set_trace_callback(None)
    assert len(written.runs) == len(jobs)
    return ran


async def test_a_batch_over_many_shards_runs_as_many_statements_as_one_over_a_single_shard(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/round-trips.db", shard_count=SHARDS)
    try:
        await store.migrate()
        leases = {lease.shard_id: lease for lease in await store.shards.acquire_shards("node-a", TTL, limit=SHARDS)}
        due = datetime.now(UTC) - timedelta(seconds=1)
        jobs = []
        for index in range(400):  # enough to land in most of the 64 shards
            job, _ = await store.jobs.create_job(JobSpec(name=f"j{index}", job_type="t", schedule=Schedule.at_instant(due)))
            jobs.append(job)
        by_shard: dict[int, list] = {}
        for job in jobs:
            by_shard.setdefault(job.shard_id, []).append(job)
        one_shard = max(by_shard.values(), key=len)
        others = [job for job in jobs if job.shard_id != one_shard[0].shard_id]
        assert len({job.shard_id for job in others}) >= 32

        single = await statements_to_materialise(store, one_shard, leases)
        many = await statements_to_materialise(store, others, leases)
        assert len(many) == len(single), f"one shard: {single}\nmany shards: {many}"
    finally:
        await store.close()
