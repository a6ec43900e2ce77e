"""The SQLite store's fast lane: the due-job window, fenced materialisation, pending runs and
expired attempt leases."""

from __future__ import annotations

import random
from collections.abc import Collection, Container, Sequence
from datetime import datetime, timedelta

import aiosqlite

from fastlane.clock import from_micros, to_micros
from fastlane.domain.models import DueJob, Run, ShardLease
from fastlane.domain.records import Occurrence
from fastlane.domain.transitions import OVERLAP_CANCELLED
from fastlane.errors import StaleFence
from fastlane.storage import codec, common
from fastlane.storage.results import Materialised
from fastlane.storage.sqlite import queries
from fastlane.storage.sqlite.connection import (
    SQLiteConnections,
    fetch_all,
    fetch_value,
    instant,
    json_array,
)
from fastlane.storage.sqlite.runs import apply_results


class SQLiteLane(SQLiteConnections):
    """Fast-lane methods of :class:`~fastlane.storage.sqlite.SQLiteStore`."""

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
        lower = instant(at_or_after)
        after_time, after_id = (to_micros(after_job[0]), after_job[1]) if after_job else (None, "")
        params = (json_array(shard_ids), to_micros(before), lower, lower, after_time, after_time, after_id, limit)
        jobs: list[DueJob] = []
        async with self._read() as db, db.execute(queries.LOAD_DUE_JOBS, params) as cursor:
            while rows := await cursor.fetchmany(common.DUE_JOBS_CHUNK):
                jobs += [codec.build_due_job(job_id, shard_id, from_micros(fire_at), schedule, misfire, job_type, tenant,
                                             priority)
                         for job_id, shard_id, fire_at, schedule, misfire, job_type, tenant, priority in rows]
        return jobs

    async def materialise_runs(self, fences: Sequence[ShardLease], occurrences: Sequence[Occurrence]) -> Materialised:
        async with self._transaction() as db:
            await check_fences(db, fences)
            advanced = await fetch_all(
                db,
                queries.ADVANCE_JOBS,
                (
                    json_array((o.job_id, to_micros(o.expected_next_fire_at), instant(o.next_fire_at))
                               for o in occurrences),
                    json_array(fence.shard_id for fence in fences),
                ),
            )
            overlap_of = {row["job_id"]: row["overlap"] for row in advanced}
            changed = [
                codec.build_job(row)
                for row in await fetch_all(
                    db, queries.JOBS_BY_IDS, (json_array(o.job_id for o in occurrences if o.job_id not in overlap_of),)
                )
            ] if len(overlap_of) < len(occurrences) else []
            guarded = [job_id for job_id, policy in overlap_of.items() if policy != "allow"]
            active = []
            if guarded:
                active = await fetch_all(
                    db, queries.ACTIVE_RUNS_OF_JOBS, (json_array(guarded), json_array(common.ACTIVE_STATES))
                )
            plan = common.plan_materialisation(
                occurrences, overlap_of, [(r["job_id"], r["run_id"], r["state"]) for r in active]
            )
            cancelling = await cancel_for_overlap(db, plan)
            if not plan.rows:
                return Materialised(runs=[], advanced=frozenset(overlap_of), cancelling=cancelling, changed=changed)
            rows = await fetch_all(
                db,
                queries.INSERT_RUNS,
                (json_array((r.run_id, r.job_id, to_micros(r.scheduled_for), r.state, r.last_error)
                            for r in plan.rows),),
            )
        runs = codec.build_runs(rows, job_ids=(o.job_id for o in occurrences))
        return Materialised(runs=common.scheduled_in_order(runs), advanced=frozenset(overlap_of),
                            cancelling=cancelling, changed=changed, skipped=common.skipped_by_policy(runs))

    async def pending_runs(
        self, shard_ids: Collection[int], before: datetime, *, skip: Container[str] = frozenset()
    ) -> list[Run]:
        async with self._read() as db:
            async with db.execute(queries.PENDING_RUN_IDS, (json_array(shard_ids), to_micros(before))) as cursor:
                wanted = [run_id for (run_id,) in await cursor.fetchall() if run_id not in skip]
            runs: list[Run] = []
            for chunk in common.chunks(wanted, common.PENDING_CHUNK):
                # Built chunk by chunk: the next query lets the event loop run between them.
                runs += codec.build_runs(await fetch_all(db, queries.PENDING_RUNS, (json_array(chunk),)))
        return sorted(runs, key=lambda run: run.available_at)

    async def requeue_expired(self, fence: ShardLease) -> list[Run]:
        async with self._transaction() as db:
            await check_fences(db, [fence])
            rows = await fetch_all(db, queries.EXPIRED_RUNS, (fence.shard_id,))
            if not rows:
                return []
            now = from_micros(await fetch_value(db, queries.DB_NOW))
            expired = [codec.build_run(row) for row in rows]
            results = common.lease_expired_results(expired, now)
            outcomes = await apply_results(db, {run.run_id: run for run in expired}, results, now, self._rng)
        return common.rescheduled_runs(outcomes)

    async def shards_with_expired_leases(self, shard_ids: Collection[int]) -> list[int]:
        async with self._read() as db:
            rows = await fetch_all(db, queries.SHARDS_WITH_EXPIRED_LEASES, (json_array(shard_ids),))
        return sorted(row["shard_id"] for row in rows)

    async def next_lease_expiry(self, shard_ids: Collection[int]) -> timedelta | None:
        async with self._read() as db:
            rows = await fetch_all(db, queries.NEXT_LEASE_EXPIRY, (json_array(shard_ids),))
        remaining = rows[0]["remaining"] if rows else None
        return None if remaining is None else timedelta(microseconds=remaining)


async def check_fences(db: aiosqlite.Connection, fences: Sequence[ShardLease]) -> None:
    """Raise :class:`~fastlane.errors.StaleFence` unless every lease is still held (see ``FENCES``)."""
    rows = await fetch_all(db, queries.FENCES, (json_array((f.shard_id, f.owner, f.token) for f in fences),))
    held = {row["shard_id"] for row in rows}
    for fence in fences:
        if fence.shard_id not in held:
            raise StaleFence(fence.shard_id, fence.owner, fence.token)


async def cancel_for_overlap(db: aiosqlite.Connection, plan: common.MaterialisationPlan) -> list[Run]:
    rows = []
    if plan.cancel_now:
        rows += await fetch_all(db, queries.CANCEL_FOR_OVERLAP, (OVERLAP_CANCELLED, json_array(plan.cancel_now)))
    if plan.cancel_requested:
        rows += await fetch_all(
            db, queries.REQUEST_CANCEL_FOR_OVERLAP, (OVERLAP_CANCELLED, json_array(plan.cancel_requested))
        )
    return [codec.build_run(row) for row in rows]
