"""The store's attempts: dispatches (capped or not), heartbeats and results, late reports of
attempts the database never heard of, and the runs a finished one releases from the overlap
buffer. What a result does to its run is decided in Python (``common.decide_results``), once."""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from datetime import datetime

from fastlane.domain.models import Attempt, Run, RunState
from fastlane.domain.records import AttemptResult, CappedDispatches, Change, ChangeKind, Dispatch, Heartbeat
from fastlane.storage import codec, common, late_reports
from fastlane.storage.attempts import RoundWritten
from fastlane.storage.late_reports import ReporterOf
from fastlane.storage.results import ResultOutcome
from fastlane.storage.store.database import Batch, StorePart, Tx
from fastlane.storage.store.statements import Statements


class SQLAttempts(StorePart):
    async def record_dispatches(self, dispatches: Sequence[Dispatch]) -> list[Attempt]:
        if not dispatches:
            return []
        async with self._db.write(one_statement=True) as tx:
            return await _dispatch(tx, dispatches)

    async def record_capped_dispatches(self, dispatches: Sequence[Dispatch]) -> CappedDispatches:
        if not dispatches:
            return CappedDispatches([], [])
        keys = common.capped_keys(dispatches)
        async with self._db.write() as tx:
            await tx.lock_concurrency_keys(keys)
            scheduled = {row["run_id"] for row in await tx.fetch(self._q.SCHEDULED_AMONG, [d.run_id for d in dispatches])}
            rows = await tx.fetch(self._q.COUNT_ACTIVE_BY_KEY, Batch(keys, 2))
            active = {(row["tenant"], row["concurrency_key"]): row["active"] for row in rows}
            admitted, blocked = common.admit_under_caps(dispatches, scheduled, active)
            attempts = await _dispatch(tx, admitted) if admitted else []
        return CappedDispatches(attempts, blocked)

    async def record_heartbeats(self, heartbeats: Sequence[Heartbeat]) -> list[str]:
        if not heartbeats:
            return []
        async with self._db.write() as tx:
            return await self._beat(tx, heartbeats)

    async def record_results(
        self, results: Sequence[AttemptResult], *, reporter_of: ReporterOf | None = None
    ) -> list[ResultOutcome]:
        if not results:
            return []
        async with self._db.write() as tx:
            return await self._settle(tx, results, reporter_of)

    async def record_round(
        self, dispatches: Sequence[Dispatch], heartbeats: Sequence[Heartbeat], results: Sequence[AttemptResult], *,
        reporter_of: ReporterOf | None = None,
    ) -> RoundWritten:
        # One commit where there were up to three: on a busy node each round carries dispatches
        # and results, and a commit (a WAL append, on PostgreSQL a flush) costs more than either.
        async with self._db.write() as tx:
            attempts = await _dispatch(tx, dispatches) if dispatches else []
            stale = await self._beat(tx, heartbeats) if heartbeats else []
            outcomes = await self._settle(tx, results, reporter_of) if results else []
        return RoundWritten(attempts, stale, outcomes)

    async def _beat(self, tx: Tx, heartbeats: Sequence[Heartbeat]) -> list[str]:
        live = await tx.extend_leases(heartbeats)
        if started := [(h.run_id, h.lease_token, h.started_at) for h in live if h.started]:
            await tx.execute(self._q.MARK_ATTEMPTS_STARTED, Batch(started, 3))
        current = {h.run_id for h in live}
        return [h.run_id for h in heartbeats if h.run_id not in current]

    async def _settle(self, tx: Tx, results: Sequence[AttemptResult], reporter_of: ReporterOf | None) -> list[ResultOutcome]:
        successes, others = common.successes_first(results)
        q = self._q
        # Successes of current attempts set-wise (see common.successes_first); the rest are
        # decided against their runs as read here.
        succeeded = await tx.succeed(successes) if successes else []
        current = {(row["run_id"], row["attempt_token"]) for row in succeeded}
        if outputs := [(r.run_id, r.output) for r in successes if r.output and (r.run_id, r.lease_token) in current]:
            await tx.execute_each(q.SET_OUTPUT, outputs)
        outcomes = [ResultOutcome(row=row, accepted=True) for row in succeeded]
        released = await release_buffered(tx, q, {row["job_id"] for row in succeeded})
        await _notify_runs(tx, released)
        outcomes += [ResultOutcome(run=run, accepted=True, released=True) for run in released]
        rest = [r for r in successes if (r.run_id, r.lease_token) not in current] + others
        if rest:
            rows = await tx.fetch(q.RESULT_RUNS, list({r.run_id for r in rest}))
            now = await tx.now()
            runs = {row["run_id"]: codec.build_run(row) for row in rows}
            if reporter_of is not None:
                rest = await _record_late_reports(tx, q, runs, rest, reporter_of, now, outcomes)
            outcomes += await apply_results(tx, q, runs, rest, now, self._rng)
        return outcomes


async def _dispatch(tx: Tx, dispatches: Sequence[Dispatch]) -> list[Attempt]:
    return [codec.build_attempt(row) for row in await tx.dispatch(dispatches)]


async def _record_late_reports(
    tx: Tx,
    q: Statements,
    runs: dict[str, Run],
    results: list[AttemptResult],
    reporter_of: ReporterOf,
    now: datetime,
    outcomes: list[ResultOutcome],
) -> list[AttemptResult]:
    """Record the results whose attempt has no row (:mod:`fastlane.storage.late_reports`); returns
    the results left for :func:`apply_results` (see :func:`~fastlane.storage.late_reports.settle_plan`)."""
    known = {(row["run_id"], row["lease_token"]) for row in await tx.fetch(q.ATTEMPT_KEYS, list({r.run_id for r in results}))}
    late = late_reports.unrecorded(results, known)
    if not late:
        return results
    plan = late_reports.plan_late_reports(runs, late, reporter_of, now)
    for row in plan.rows:
        await tx.execute(q.INSERT_LATE_ATTEMPT, row.run_id, row.attempt, row.lease_token, row.worker_id,
                         row.node_id, row.outcome.value, row.dispatched_at, row.started_at, row.finished_at,
                         row.error_code, row.error_message, row.error_traceback)
        await tx.execute(q.COUNT_LATE_ATTEMPT, row.attempt, row.dispatched_at, row.run_id)
    for run_id, attempt, since in plan.redeliveries:
        await tx.execute(q.MARK_REDELIVERIES, run_id, attempt, since)
    # Its shard's owner holds an adopted run as waiting: it must hear it was run.
    await _notify_runs(tx, plan.adopted.values())
    return late_reports.settle_plan(plan, runs, results, outcomes)


async def apply_results(
    tx: Tx,
    q: Statements,
    runs: dict[str, Run],
    results: Sequence[AttemptResult],
    now: datetime,
    rng: random.Random,
) -> list[ResultOutcome]:
    """Write what :func:`fastlane.storage.common.decide_results` made of these results."""
    decided = common.decide_results(runs, results, now, rng)
    if decided.runs:
        await tx.execute(q.APPLY_RUN_RESULTS, Batch(
            ((run.run_id, run.state.value, run.available_at, run.finished_at, run.last_error) for run in decided.runs),
            5,
        ))
    if decided.attempts:
        await tx.execute(q.APPLY_ATTEMPT_RESULTS, Batch(
            ((u.result.run_id, u.result.lease_token, u.outcome.value, u.result.error_code, u.result.error_message,
              u.result.started_at, u.finished_at, u.result.error_traceback) for u in decided.attempts),
            8,
        ))
    released = await release_buffered(tx, q, decided.finished_jobs)
    # A worker may report to any node: the owner of each run's shard must hear of a retry or
    # a run released from the overlap buffer at once, not at its next full scan.
    await _notify_runs(tx, [*released, *(run for run in decided.runs if run.state is RunState.SCHEDULED)])
    return decided.outcomes + [ResultOutcome(run=run, accepted=True, released=True) for run in released]


async def release_buffered(tx: Tx, q: Statements, job_ids: Collection[str]) -> list[Run]:
    """Schedule the oldest buffered run of each job that has no other active run left."""
    if not job_ids:
        return []
    return [codec.build_run(row) for row in await tx.fetch(q.RELEASE_BUFFERED, list(job_ids))]


async def _notify_runs(tx: Tx, runs: Collection[Run]) -> None:
    for run in runs:
        await tx.notify(Change(ChangeKind.RUN, run.shard_id, run.tenant, run.run_id))
