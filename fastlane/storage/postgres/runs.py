"""The PostgreSQL store's runs and attempts: manual runs, cancel and retry, dispatches,
heartbeats, results, and the reads of run history."""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime

from fastlane.clock import from_micros
from fastlane.domain.models import Attempt, Job, Run, RunState, new_id
from fastlane.domain.records import AttemptResult, CappedDispatches, Change, ChangeKind, Dispatch, Heartbeat, Page
from fastlane.domain.transitions import CANCELLED_BY_REQUEST
from fastlane.errors import InvalidState, JobNotFound, RunNotFound
from fastlane.storage import codec, common, late_reports
from fastlane.storage.late_reports import ReporterOf
from fastlane.storage.postgres import queries
from fastlane.storage.postgres.changes import notify
from fastlane.storage.postgres.connection import PoolConnection, PostgresConnections
from fastlane.storage.results import Cancellation, ResultOutcome


class PostgresRuns(PostgresConnections):
    """Run and attempt methods of :class:`~fastlane.storage.postgres.PostgresStore`."""

    _rng: random.Random

    async def create_manual_run(self, tenant: str, job_id: str) -> Run:
        async with self._transaction() as db:
            job_row = await db.fetchrow(queries.JOB_OF_TENANT, job_id, tenant)
            if job_row is None:
                raise JobNotFound(job_id)
            row = await db.fetchrow(queries.INSERT_MANUAL_RUN, new_id(), job_id)
            if row is None:
                # JOB_OF_TENANT takes no lock: the job was deleted meanwhile. To the caller it is
                # simply not found (NOT_FOUND), as on SQLite, where one statement does both.
                raise JobNotFound(job_id)
            run = codec.build_run(row)
            await notify(db, Change(ChangeKind.RUN, run.shard_id, run.tenant, run.run_id))
        return run

    async def cancel_run(self, tenant: str, run_id: str) -> Cancellation:
        async with self._transaction() as db:
            row = await db.fetchrow(queries.LOCK_RUN, run_id, tenant)
            if row is None:
                raise RunNotFound(run_id)
            run = codec.build_run(row)
            if run.state is RunState.CANCELLED or (run.cancel_requested and run.state in common.WITH_A_WORKER):
                return Cancellation(run=run, already=True)
            if run.state in common.WITH_A_WORKER:
                row = await db.fetchrow(queries.REQUEST_CANCEL, run_id)
                assert row is not None, "LOCK_RUN holds the run's row lock in this transaction"
                await notify(db, Change(ChangeKind.RUN, run.shard_id, tenant, run_id))
                return Cancellation(run=codec.build_run(row))
            if run.state not in (RunState.SCHEDULED, RunState.BUFFERED):
                raise InvalidState("run", run_id, run.state.value, "cancel")
            row = await db.fetchrow(queries.CANCEL_RUN, run_id, CANCELLED_BY_REQUEST)
            assert row is not None, "LOCK_RUN holds the run's row lock in this transaction"
            released = await release_buffered(db, [run.job_id])
            await notify(db, Change(ChangeKind.RUN, run.shard_id, tenant, run_id))
            for other in released:
                await notify(db, Change(ChangeKind.RUN, other.shard_id, other.tenant, other.run_id))
        return Cancellation(run=codec.build_run(row), released=released)

    async def retry_run(self, tenant: str, run_id: str) -> Run:
        async with self._transaction() as db:
            row = await db.fetchrow(queries.RUN_STATE, run_id, tenant)
            if row is None:
                raise RunNotFound(run_id)
            if row["state"] not in ("dead", "lost"):
                raise InvalidState("run", run_id, row["state"], "retry (only dead or lost runs can be replayed)")
            row = await db.fetchrow(queries.RETRY_RUN, run_id)
            assert row is not None, "RUN_STATE holds the run's row lock in this transaction"
            run = codec.build_run(row)
            await notify(db, Change(ChangeKind.RUN, run.shard_id, run.tenant, run.run_id))
        return run

    async def record_dispatches(self, dispatches: Sequence[Dispatch]) -> list[Attempt]:
        if not dispatches:
            return []
        # One statement is atomic on its own: no BEGIN and COMMIT, two round trips a batch fewer.
        async with self._connection() as db:
            return await _dispatch(db, dispatches)

    async def record_capped_dispatches(self, dispatches: Sequence[Dispatch]) -> CappedDispatches:
        if not dispatches:
            return CappedDispatches([], [])
        keys = common.capped_keys(dispatches)
        async with self._transaction() as db:
            await db.execute(queries.LOCK_CONCURRENCY_KEYS, [t for t, _ in keys], [k for _, k in keys])
            scheduled = {row["run_id"] for row in await db.fetch(queries.SCHEDULED_AMONG, [d.run_id for d in dispatches])}
            rows = await db.fetch(queries.COUNT_ACTIVE_BY_KEY, [t for t, _ in keys], [k for _, k in keys])
            active = {(row["tenant"], row["concurrency_key"]): row["active"] for row in rows}
            admitted, held = common.admit_under_caps(dispatches, scheduled, active)
            attempts = await _dispatch(db, admitted) if admitted else []
        return CappedDispatches(attempts, held)

    async def record_heartbeats(self, heartbeats: Sequence[Heartbeat]) -> list[str]:
        if not heartbeats:
            return []
        async with self._transaction() as db:
            rows = await db.fetch(
                queries.EXTEND_LEASES,
                [h.run_id for h in heartbeats],
                [h.lease_token for h in heartbeats],
                [h.progress for h in heartbeats],
                [h.checkpoint for h in heartbeats],
                [h.started for h in heartbeats],
            )
            started = [(row["run_id"], row["lease_token"]) for row in rows if row["started"]]
            if started:
                await db.execute(
                    queries.MARK_ATTEMPTS_STARTED, [run_id for run_id, _ in started], [token for _, token in started]
                )
        current = {row["run_id"] for row in rows}
        return [h.run_id for h in heartbeats if h.run_id not in current]

    async def record_results(
        self, results: Sequence[AttemptResult], *, reporter_of: ReporterOf | None = None
    ) -> list[ResultOutcome]:
        if not results:
            return []
        successes, others = common.successes_first(results)
        async with self._transaction() as db:
            succeeded = await db.fetch(
                queries.SUCCEED_RUNS, [r.run_id for r in successes], [r.lease_token for r in successes]
            ) if successes else []
            attempt_of = {(row["run_id"], row["attempt_token"]): row["attempts"] for row in succeeded}
            done = [r for r in successes if (r.run_id, r.lease_token) in attempt_of]
            if done:
                await succeed_attempts(db, done, attempt_of)
                if outputs := [(r.run_id, r.output) for r in done if r.output]:
                    await db.executemany(queries.SET_OUTPUT, outputs)
            rest = [r for r in successes if (r.run_id, r.lease_token) not in attempt_of] + others
            outcomes = [ResultOutcome(row=row, accepted=True) for row in succeeded]
            released = await release_buffered(db, {row["job_id"] for row in succeeded})
            for run in released:
                await notify(db, Change(ChangeKind.RUN, run.shard_id, run.tenant, run.run_id))
            outcomes += [ResultOutcome(run=run, accepted=True, released=True) for run in released]
            if rest:
                rows = await db.fetch(queries.RESULT_RUNS, list({r.run_id for r in rest}))
                now = await db.fetchval(queries.DB_NOW)
                runs = {row["run_id"]: codec.build_run(row) for row in rows}
                if reporter_of is not None:
                    rest = await record_late_reports(db, runs, rest, reporter_of, now, outcomes)
                outcomes += await apply_results(db, runs, rest, now, self._rng)
            return outcomes

    async def get_run(self, tenant: str, run_id: str) -> Run:
        async with self._connection() as db:
            row = await db.fetchrow(queries.GET_RUN, run_id, tenant)
        if row is None:
            raise RunNotFound(run_id)
        return codec.build_run(row)

    async def list_runs(
        self,
        tenant: str,
        *,
        job_id: str | None = None,
        states: Collection[RunState] = (),
        limit: int = 100,
        page_token: str = "",
    ) -> Page[Run]:
        before_time, before_id = None, ""
        if page_token:
            micros, before_id = codec.decode_page_token(page_token, int, str)
            before_time = from_micros(micros)
        async with self._connection() as db:
            rows = await db.fetch(
                queries.LIST_RUNS,
                tenant, job_id, [s.value for s in states], before_time, before_id, common.page_limit(limit) + 1,
            )
        return common.page_of([codec.build_listed_run(row) for row in rows], limit, common.run_page_key)

    async def runs_by_id_prefix(self, tenant: str, prefix: str, limit: int) -> list[Run]:
        low, high = common.id_prefix_range(prefix)
        async with self._connection() as db:
            rows = await db.fetch(queries.RUNS_BY_ID_RANGE, low, high, tenant, common.page_limit(limit))
        return common.with_id_prefix([codec.build_run(row) for row in rows], prefix, lambda run: run.run_id).items

    async def jobs_by_id_prefix(self, tenant: str, prefix: str, limit: int) -> list[Job]:
        low, high = common.id_prefix_range(prefix)
        async with self._connection() as db:
            rows = await db.fetch(queries.JOBS_BY_ID_RANGE, low, high, tenant, common.page_limit(limit))
        return common.with_id_prefix([codec.build_job(row) for row in rows], prefix, lambda job: job.job_id).items

    async def jobs_by_name_prefix(self, tenant: str, prefix: str, limit: int) -> list[Job]:
        low, high = common.id_prefix_range(prefix)
        async with self._connection() as db:
            rows = await db.fetch(queries.JOBS_BY_NAME_RANGE, tenant, low, high, common.page_limit(limit))
        return common.with_id_prefix([codec.build_job(row) for row in rows], prefix, lambda job: job.name).items

    async def list_attempts(self, run_id: str) -> list[Attempt]:
        async with self._connection() as db:
            rows = await db.fetch(queries.LIST_ATTEMPTS, run_id)
        return [codec.build_attempt(row) for row in rows]


async def record_late_reports(
    db: PoolConnection,
    runs: dict[str, Run],
    results: list[AttemptResult],
    reporter_of: ReporterOf,
    now: datetime,
    outcomes: list[ResultOutcome],
) -> list[AttemptResult]:
    """Record the results whose attempt has no row (:mod:`fastlane.storage.late_reports`); returns
    the results left for :func:`apply_results` (see :func:`~fastlane.storage.late_reports.settle_plan`)."""
    known = {(row["run_id"], row["lease_token"])
             for row in await db.fetch(queries.ATTEMPT_KEYS, list({r.run_id for r in results}))}
    late = late_reports.unrecorded(results, known)
    if not late:
        return results
    plan = late_reports.plan_late_reports(runs, late, reporter_of, now)
    for row in plan.rows:
        await db.execute(queries.INSERT_LATE_ATTEMPT, row.run_id, row.attempt, row.lease_token, row.worker_id,
                         row.node_id, row.outcome.value, row.dispatched_at, row.started_at, row.finished_at,
                         row.error_code, row.error_message, row.error_traceback)
        await db.execute(queries.COUNT_LATE_ATTEMPT, row.attempt, row.dispatched_at, row.run_id)
    for run_id, attempt, since in plan.redeliveries:
        await db.execute(queries.MARK_REDELIVERIES, run_id, attempt, since)
    for run in plan.adopted.values():  # its shard's owner holds it as waiting: it must hear it was run
        await notify(db, Change(ChangeKind.RUN, run.shard_id, run.tenant, run.run_id))
    return late_reports.settle_plan(plan, runs, results, outcomes)


async def succeed_attempts(db: PoolConnection, done: Sequence[AttemptResult],
                           attempt_of: Mapping[tuple[str, int], int]) -> None:
    """Mark the current attempts of these successes succeeded: by primary key, ``attempt_of``
    numbering each (run id, lease token) as its run's count of attempts, and the few that number
    misses (see SUCCEED_ATTEMPTS_BY_TOKEN) by their token."""
    rows = await db.fetch(
        queries.SUCCEED_ATTEMPTS,
        [r.run_id for r in done], [attempt_of[r.run_id, r.lease_token] for r in done], [r.lease_token for r in done],
        [r.error_code for r in done], [r.error_message for r in done], [r.started_at for r in done],
        [r.finished_at for r in done],
    )
    matched = {row["run_id"] for row in rows}  # a run id is enough: SUCCEED_RUNS matched one token per run
    if missed := [r for r in done if r.run_id not in matched]:
        await db.execute(
            queries.SUCCEED_ATTEMPTS_BY_TOKEN,
            [r.run_id for r in missed], [r.lease_token for r in missed], [r.error_code for r in missed],
            [r.error_message for r in missed], [r.started_at for r in missed], [r.finished_at for r in missed],
        )


async def apply_results(
    db: PoolConnection,
    runs: dict[str, Run],
    results: Sequence[AttemptResult],
    now: datetime,
    rng: random.Random,
) -> list[ResultOutcome]:
    """Write what :func:`fastlane.storage.common.decide_results` made of these results."""
    decided = common.decide_results(runs, results, now, rng)
    if decided.runs:
        await db.execute(
            queries.APPLY_RUN_RESULTS,
            [run.run_id for run in decided.runs], [run.state.value for run in decided.runs],
            [run.available_at for run in decided.runs], [run.finished_at for run in decided.runs],
            [run.last_error for run in decided.runs],
        )
    if decided.attempts:
        updates = decided.attempts
        await db.execute(
            queries.APPLY_ATTEMPT_RESULTS,
            [u.result.run_id for u in updates], [u.result.lease_token for u in updates],
            [u.outcome.value for u in updates], [u.result.error_code for u in updates],
            [u.result.error_message for u in updates], [u.result.started_at for u in updates],
            [u.finished_at for u in updates], [u.result.error_traceback for u in updates],
        )
    released = await release_buffered(db, decided.finished_jobs)
    # A worker may report to any node: the owner of each run's shard must hear of a retry or
    # a run released from the overlap buffer at once, not at its next full scan.
    for run in [*released, *(run for run in decided.runs if run.state is RunState.SCHEDULED)]:
        await notify(db, Change(ChangeKind.RUN, run.shard_id, run.tenant, run.run_id))
    return decided.outcomes + [ResultOutcome(run=run, accepted=True, released=True) for run in released]


async def release_buffered(db: PoolConnection, job_ids: Collection[str]) -> list[Run]:
    """Schedule the oldest buffered run of each job that has no other active run left."""
    if not job_ids:
        return []
    rows = await db.fetch(queries.RELEASE_BUFFERED, list(job_ids))
    return [codec.build_run(row) for row in rows]


async def _dispatch(db: PoolConnection, dispatches: Sequence[Dispatch]) -> list[Attempt]:
    """Start an attempt of each run still ``scheduled``, in one statement."""
    rows = await db.fetch(
        queries.DISPATCH_RUNS,
        [d.run_id for d in dispatches],
        [d.lease_token for d in dispatches],
        [d.worker_id for d in dispatches],
        [d.node_id for d in dispatches],
        [common.micros_of_delta(d.lease_ttl) for d in dispatches],
        [d.dispatched_at for d in dispatches],
    )
    return [codec.build_attempt(row) for row in rows]
