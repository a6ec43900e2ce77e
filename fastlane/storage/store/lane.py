"""The store's fast lane: the due-job window, fenced materialisation, pending runs and expired
attempt leases."""

from __future__ import annotations

from collections.abc import Collection, Container, Sequence
from datetime import datetime, timedelta

from fastlane.domain.errors import StaleFence
from fastlane.domain.models import DueJob, Run, ShardLease
from fastlane.domain.records import Occurrence
from fastlane.domain.transitions import OVERLAP_CANCELLED
from fastlane.storage import codec, common
from fastlane.storage.results import Materialised
from fastlane.storage.store.attempts import apply_results
from fastlane.storage.store.database import Batch, StorePart, Tx
from fastlane.storage.store.statements import Statements


class SQLLane(StorePart):
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
        async with self._db.read() as tx:
            chunks = tx.stream(self._q.LOAD_DUE_JOBS, list(shard_ids), before, at_or_after, limit, after_time,
                               after_id, chunk=common.DUE_JOBS_CHUNK)
            async for rows in chunks:
                jobs += [codec.build_due_job(*row) for row in rows]
        return jobs

    async def materialise_runs(self, fences: Sequence[ShardLease], occurrences: Sequence[Occurrence]) -> Materialised:
        q = self._q
        async with self._db.write() as tx:
            await check_fences(tx, q, fences)
            advanced = await tx.fetch(
                q.ADVANCE_JOBS,
                Batch(((o.job_id, o.expected_next_fire_at, o.next_fire_at) for o in occurrences), 3),
                [fence.shard_id for fence in fences],
            )
            overlap_of = {row["job_id"]: row["overlap"] for row in advanced}
            changed = [
                codec.build_job(row)
                for row in await tx.fetch(q.JOBS_BY_IDS, [o.job_id for o in occurrences if o.job_id not in overlap_of])
            ] if len(overlap_of) < len(occurrences) else []
            guarded = [job_id for job_id, policy in overlap_of.items() if policy != "allow"]
            active = await tx.fetch(q.ACTIVE_RUNS_OF_JOBS, guarded) if guarded else []
            plan = common.plan_materialisation(
                occurrences, overlap_of, [(r["job_id"], r["run_id"], r["state"]) for r in active]
            )
            cancelling = await _cancel_for_overlap(tx, q, plan)
            if not plan.rows:
                return Materialised(runs=[], advanced=frozenset(overlap_of), cancelling=cancelling, changed=changed)
            rows = await tx.fetch(
                q.INSERT_RUNS, Batch(((r.run_id, r.job_id, r.scheduled_for, r.state, r.last_error) for r in plan.rows), 5)
            )
        runs = codec.build_runs(rows, job_ids=(o.job_id for o in occurrences))
        return Materialised(runs=common.scheduled_in_order(runs), advanced=frozenset(overlap_of),
                            cancelling=cancelling, changed=changed, skipped=common.skipped_by_policy(runs))

    async def pending_runs(
        self, shard_ids: Collection[int], before: datetime, *, skip: Container[str] = frozenset()
    ) -> list[Run]:
        async with self._db.read() as tx:
            ids = await tx.fetch(self._q.PENDING_RUN_IDS, list(shard_ids), before)
            wanted = [row["run_id"] for row in ids if row["run_id"] not in skip]
            runs: list[Run] = []
            for chunk in common.chunks(wanted, common.PENDING_CHUNK):
                # Built chunk by chunk: the next query lets the event loop run between them.
                runs += codec.build_runs(await tx.fetch(self._q.PENDING_RUNS, list(chunk)))
        return sorted(runs, key=lambda run: run.available_at)

    async def requeue_expired(self, fence: ShardLease) -> list[Run]:
        async with self._db.write() as tx:
            await check_fences(tx, self._q, [fence])
            rows = await tx.fetch(self._q.EXPIRED_RUNS, fence.shard_id)
            if not rows:
                return []
            now = await tx.now()
            expired = [codec.build_run(row) for row in rows]
            results = common.lease_expired_results(expired, now)
            outcomes = await apply_results(tx, self._q, {run.run_id: run for run in expired}, results, now, self._rng)
        return common.rescheduled_runs(outcomes)

    async def shards_with_expired_leases(self, shard_ids: Collection[int]) -> list[int]:
        async with self._db.read() as tx:
            rows = await tx.fetch(self._q.SHARDS_WITH_EXPIRED_LEASES, list(shard_ids))
        return sorted(row["shard_id"] for row in rows)

    async def next_lease_expiry(self, shard_ids: Collection[int]) -> timedelta | None:
        async with self._db.read() as tx:
            remaining = await tx.fetchval(self._q.NEXT_LEASE_EXPIRY, list(shard_ids))
        return None if remaining is None else timedelta(microseconds=remaining)


async def check_fences(tx: Tx, q: Statements, fences: Sequence[ShardLease]) -> None:
    """Raise :class:`~fastlane.domain.errors.StaleFence` unless every lease is still owned (see ``FENCE``)."""
    rows = await tx.fetch(q.FENCE, Batch(((f.shard_id, f.owner, f.token) for f in fences), 3))
    owned = {row["shard_id"] for row in rows}
    for fence in fences:
        if fence.shard_id not in owned:
            raise StaleFence(fence.shard_id, fence.owner, fence.token)


async def _cancel_for_overlap(tx: Tx, q: Statements, plan: common.MaterialisationPlan) -> list[Run]:
    rows = []
    if plan.cancel_now:
        rows += await tx.fetch(q.CANCEL_FOR_OVERLAP, plan.cancel_now, OVERLAP_CANCELLED)
    if plan.cancel_requested:
        rows += await tx.fetch(q.REQUEST_CANCEL_FOR_OVERLAP, plan.cancel_requested, OVERLAP_CANCELLED)
    return [codec.build_run(row) for row in rows]
