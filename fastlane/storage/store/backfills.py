"""The store's backfills: runs of a job's past fire times, written now (:mod:`fastlane.domain.backfill`).

Each statement here is PostgreSQL's, said in the dialect's SQL by its ``translate``: a backfill
run's columns are the job's, computed once from the job as read, so no statement reads the
job's JSON policies (the one part of SQL the two dialects spell differently).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import orjson

from fastlane.domain.backfill import Occurrence
from fastlane.domain.errors import JobNotFound
from fastlane.domain.models import Job, RunState, new_id
from fastlane.domain.records import Change, ChangeKind
from fastlane.storage import codec
from fastlane.storage.backfills import BackfillWrite
from fastlane.storage.store.attempts import release_buffered
from fastlane.storage.store.database import StorePart

# The instants among $2 at which the job has a run that is not skipped: a fire time with one of
# those is not missed.
HAVE_RUN = """
    SELECT DISTINCT scheduled_for FROM runs
    WHERE job_id = $1 AND scheduled_for = ANY($2::timestamptz[]) AND state <> 'skipped'
"""
INSERT_BACKFILL_RUN = """
    INSERT INTO runs (run_id, job_id, tenant, job_type, shard_id, scheduled_for, available_at, state,
                      payload, priority, manual, delivery, lease_ttl_ms, timeout_ms, retry,
                      created_at, updated_at, concurrency_key, concurrency_limit, backfill_id)
    VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp(), $7, $8, $9, true, $10, $11, $12, $13::jsonb,
            clock_timestamp(), clock_timestamp(), $14, $15, $16)
"""
WRITTEN_SCHEDULED = "SELECT * FROM runs WHERE run_id = ANY($1::text[]) AND state = 'scheduled'"


class SQLBackfills(StorePart):
    """Backfill runs: written in the job's lock, so the job's schedule cannot write the same fire
    times meanwhile."""

    async def write_backfill(
        self, tenant: str, job_id: str, backfill_id: str, occurrences: Sequence[Occurrence], *,
        missed_only: bool, buffered: bool, dry_run: bool,
    ) -> BackfillWrite:
        translate = self._db.translate
        async with self._db.read() if dry_run else self._db.write() as tx:
            row = await tx.fetchrow(self._q.GET_JOB if dry_run else self._q.LOCK_JOB, job_id, tenant)
            if row is None:
                raise JobNotFound(job_id)
            job = codec.build_job(row)
            taken = [o for o in occurrences if job.next_fire_at is None or o.fire_time < job.next_fire_at]
            beyond = len(occurrences) - len(taken)
            already = 0
            if missed_only and taken:
                have = {r["scheduled_for"] for r in await tx.fetch(translate(HAVE_RUN), job_id,
                                                                     [o.instant for o in taken])}
                kept = [o for o in taken if o.instant not in have]
                already, taken = len(taken) - len(kept), kept
            if dry_run or not taken:
                return BackfillWrite(written=len(taken), already_run=already, beyond=beyond)
            run_ids = [new_id() for _ in taken]
            state = RunState.BUFFERED if buffered else RunState.SCHEDULED
            await tx.execute_each(translate(INSERT_BACKFILL_RUN), [
                (run_id, *_job_columns(job, occurrence.instant, state), backfill_id)
                for run_id, occurrence in zip(run_ids, taken, strict=True)
            ])
            if buffered:
                scheduled = await release_buffered(tx, self._q, [job_id])
            else:
                scheduled = [codec.build_run(r) for r in await tx.fetch(translate(WRITTEN_SCHEDULED), run_ids)]
            for run in scheduled:  # the owner of the job's shard may be another node
                await tx.notify(Change(ChangeKind.RUN, run.shard_id, run.tenant, run.run_id))
        return BackfillWrite(written=len(taken), already_run=already, beyond=beyond, scheduled=scheduled)


def _job_columns(job: Job, instant: datetime, state: RunState) -> tuple[object, ...]:
    """A backfill run's columns from ``job_id`` to ``concurrency_limit``, as a run of the job copies them."""
    spec = job.spec
    timeout_ms = None if spec.timeout is None else int(spec.timeout.total_seconds() * 1000)
    return (job.job_id, job.tenant, spec.job_type, job.shard_id, instant, state.value, spec.payload, spec.priority,
            spec.delivery.value, int(spec.lease_ttl.total_seconds() * 1000), timeout_ms,
            orjson.dumps(codec.retry_to_dict(spec.retry)).decode(), spec.concurrency_key, spec.key_limit)
