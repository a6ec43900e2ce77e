"""The PostgreSQL store's fast lane: the due-job window, fenced materialisation, pending runs
and expired attempt leases."""

from __future__ import annotations

import random
from collections.abc import Collection, Container, Sequence
from datetime import datetime, timedelta

from fastlane.domain.models import DueJob, Run, ShardLease
from fastlane.domain.records import Occurrence
from fastlane.domain.transitions import OVERLAP_CANCELLED
from fastlane.errors import StaleFence
from fastlane.storage import codec, common
from fastlane.storage.postgres import queries
from fastlane.storage.postgres.connection import PoolConnection, PostgresConnections
from fastlane.storage.postgres.runs import apply_results
from fastlane.storage.results import Materialised


class PostgresLane(PostgresConnections):
    """Fast-lane methods of :class:`~fastlane.storage.postgres.PostgresStore`."""

    _rng: random.Random

    async def load_due_jobs(
        self,
        shard_ids: Collection[int],
        before: datetime,
        *,
        at_or_after: datetime | None = None,
        after_job: tuple[datetime, str] | None = None,
        limit: int = 100_000,
    ) -> list[DueJob]:
        after_time, after_id = after_job or (None, "")
        jobs: list[DueJob] = []
        async with self._transaction() as db:  # a cursor lives in a transaction
            cursor = await db.cursor(
                queries.LOAD_DUE_JOBS, list(shard_ids), before, at_or_after, limit, after_time, after_id
            )
            while rows := await cursor.fetch(common.DUE_JOBS_CHUNK):
                jobs += [codec.build_due_job(*row) for row in rows]
        return jobs

    async def materialise_runs(self, fences: Sequence[ShardLease], occurrences: Sequence[Occurrence]) -> Materialised:
        async with self._transaction() as db:
            await check_fences(db, fences)
            advanced = await db.fetch(
                queries.ADVANCE_JOBS,
                [o.job_id for o in occurrences],
                [o.expected_next_fire_at for o in occurrences],
                [o.next_fire_at for o in occurrences],
                [fence.shard_id for fence in fences],
            )
            overlap_of = {row["job_id"]: row["overlap"] for row in advanced}
            changed = [
                codec.build_job(row)
                for row in await db.fetch(
                    queries.JOBS_BY_IDS, [o.job_id for o in occurrences if o.job_id not in overlap_of]
                )
            ] if len(overlap_of) < len(occurrences) else []
            guarded = [job_id for job_id, policy in overlap_of.items() if policy != "allow"]
            active = []
            if guarded:
                active = await db.fetch(queries.ACTIVE_RUNS_OF_JOBS, guarded, list(common.ACTIVE_STATES))
            plan = common.plan_materialisation(
                occurrences, overlap_of, [(r["job_id"], r["run_id"], r["state"]) for r in active]
            )
            cancelling = await cancel_for_overlap(db, plan)
            if not plan.rows:
                return Materialised(runs=[], advanced=frozenset(overlap_of), cancelling=cancelling, changed=changed)
            rows = await db.fetch(
                queries.INSERT_RUNS,
                [r.run_id for r in plan.rows], [r.job_id for r in plan.rows], [r.scheduled_for for r in plan.rows],
                [r.state for r in plan.rows], [r.last_error for r in plan.rows],
            )
        runs = codec.build_runs(rows, job_ids=(o.job_id for o in occurrences))
        return Materialised(runs=common.scheduled_in_order(runs), advanced=frozenset(overlap_of),
                            cancelling=cancelling, changed=changed, skipped=common.skipped_by_policy(runs))

    async def pending_runs(
        self, shard_ids: Collection[int], before: datetime, *, skip: Container[str] = frozenset()
    ) -> list[Run]:
        async with self._connection() as db:
            ids = await db.fetch(queries.PENDING_RUN_IDS, list(shard_ids), before)
            wanted = [run_id for (run_id,) in ids if run_id not in skip]
            runs: list[Run] = []
            for chunk in common.chunks(wanted, common.PENDING_CHUNK):
                # Built chunk by chunk: the next query lets the event loop run between them.
                runs += codec.build_runs(await db.fetch(queries.PENDING_RUNS, chunk))
        return sorted(runs, key=lambda run: run.available_at)

    async def requeue_expired(self, fence: ShardLease) -> list[Run]:
        async with self._transaction() as db:
            await check_fences(db, [fence])
            rows = await db.fetch(queries.EXPIRED_RUNS, fence.shard_id)
            if not rows:
                return []
            now = await db.fetchval(queries.DB_NOW)
            expired = [codec.build_run(row) for row in rows]
            results = common.lease_expired_results(expired, now)
            outcomes = await apply_results(db, {run.run_id: run for run in expired}, results, now, self._rng)
        return common.rescheduled_runs(outcomes)

    async def shards_with_expired_leases(self, shard_ids: Collection[int]) -> list[int]:
        async with self._connection() as db:
            rows = await db.fetch(queries.SHARDS_WITH_EXPIRED_LEASES, list(shard_ids))
        return sorted(row["shard_id"] for row in rows)

    async def next_lease_expiry(self, shard_ids: Collection[int]) -> timedelta | None:
        async with self._connection() as db:
            remaining = await db.fetchval(queries.NEXT_LEASE_EXPIRY, list(shard_ids))
        return None if remaining is None else timedelta(microseconds=remaining)


async def check_fences(db: PoolConnection, fences: Sequence[ShardLease]) -> None:
    """Raise :class:`~fastlane.errors.StaleFence` unless every lease is still held (see ``FENCE``)."""
    held = {
        row["shard_id"]
        for row in await db.fetch(
            queries.FENCE, [f.shard_id for f in fences], [f.owner for f in fences], [f.token for f in fences]
        )
    }
    for fence in fences:
        if fence.shard_id not in held:
            raise StaleFence(fence.shard_id, fence.owner, fence.token)


async def cancel_for_overlap(db: PoolConnection, plan: common.MaterialisationPlan) -> list[Run]:
    rows = []
    if plan.cancel_now:
        rows += await db.fetch(queries.CANCEL_FOR_OVERLAP, plan.cancel_now, OVERLAP_CANCELLED)
    if plan.cancel_requested:
        rows += await db.fetch(queries.REQUEST_CANCEL_FOR_OVERLAP, plan.cancel_requested, OVERLAP_CANCELLED)
    return [codec.build_run(row) for row in rows]
