"""The SQLite store's runs and attempts: manual runs, cancel and retry, dispatches, heartbeats,
results, and the reads of run history."""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from datetime import datetime

import aiosqlite

from fastlane.clock import from_micros, to_micros
from fastlane.domain.models import Attempt, Job, Run, RunState, new_id
from fastlane.domain.records import AttemptResult, CappedDispatches, Dispatch, Heartbeat, Page
from fastlane.domain.transitions import CANCELLED_BY_REQUEST
from fastlane.errors import InvalidState, JobNotFound, RunNotFound
from fastlane.storage import codec, common, late_reports
from fastlane.storage.late_reports import ReporterOf
from fastlane.storage.results import Cancellation, ResultOutcome
from fastlane.storage.sqlite import queries
from fastlane.storage.sqlite.connection import (
    SQLiteConnections,
    fetch_all,
    fetch_one,
    fetch_value,
    instant,
    json_array,
)


class SQLiteRuns(SQLiteConnections):
    """Run and attempt methods of :class:`~fastlane.storage.sqlite.SQLiteStore`."""

    _rng: random.Random

    async def create_manual_run(self, tenant: str, job_id: str) -> Run:
        async with self._transaction() as db:
            row = await fetch_one(db, queries.INSERT_MANUAL_RUN, (new_id(), job_id, tenant))
        if row is None:
            raise JobNotFound(job_id)
        return codec.build_run(row)

    async def cancel_run(self, tenant: str, run_id: str) -> Cancellation:
        async with self._transaction() as db:
            row = await fetch_one(db, queries.LOCK_RUN, (run_id, tenant))
            if row is None:
                raise RunNotFound(run_id)
            run = codec.build_run(row)
            if run.state is RunState.CANCELLED or (run.cancel_requested and run.state in common.WITH_A_WORKER):
                return Cancellation(run=run, already=True)
            if run.state in common.WITH_A_WORKER:
                row = await fetch_one(db, queries.REQUEST_CANCEL, (run_id,))
                assert row is not None, "LOCK_RUN found the run, and BEGIN IMMEDIATE keeps other writers out"
                return Cancellation(run=codec.build_run(row))
            if run.state not in (RunState.SCHEDULED, RunState.BUFFERED):
                raise InvalidState("run", run_id, run.state.value, "cancel")
            row = await fetch_one(db, queries.CANCEL_RUN, (CANCELLED_BY_REQUEST, run_id))
            assert row is not None, "LOCK_RUN found the run, and BEGIN IMMEDIATE keeps other writers out"
            released = await release_buffered(db, [run.job_id])
        return Cancellation(run=codec.build_run(row), released=released)

    async def retry_run(self, tenant: str, run_id: str) -> Run:
        async with self._transaction() as db:
            row = await fetch_one(db, queries.RUN_STATE, (run_id, tenant))
            if row is None:
                raise RunNotFound(run_id)
            if row["state"] not in ("dead", "lost"):
                raise InvalidState("run", run_id, row["state"], "retry (only dead or lost runs can be replayed)")
            row = await fetch_one(db, queries.RETRY_RUN, (run_id,))
            assert row is not None, "RUN_STATE found the run, and BEGIN IMMEDIATE keeps other writers out"
        return codec.build_run(row)

    async def record_dispatches(self, dispatches: Sequence[Dispatch]) -> list[Attempt]:
        if not dispatches:
            return []
        async with self._transaction() as db:
            return await _dispatch(db, dispatches)

    async def record_capped_dispatches(self, dispatches: Sequence[Dispatch]) -> CappedDispatches:
        if not dispatches:
            return CappedDispatches([], [])
        keys = common.capped_keys(dispatches)
        async with self._transaction() as db:  # BEGIN IMMEDIATE: no other writer counts meanwhile
            rows = await fetch_all(db, queries.SCHEDULED_AMONG, (json_array(d.run_id for d in dispatches),))
            scheduled = {row["run_id"] for row in rows}
            rows = await fetch_all(db, queries.COUNT_ACTIVE_BY_KEY, (json_array({key for _, key in keys}),))
            active = {(row["tenant"], row["concurrency_key"]): row["active"] for row in rows}
            admitted, held = common.admit_under_caps(dispatches, scheduled, active)
            attempts = await _dispatch(db, admitted) if admitted else []
        return CappedDispatches(attempts, held)

    async def record_heartbeats(self, heartbeats: Sequence[Heartbeat]) -> list[str]:
        if not heartbeats:
            return []
        async with self._transaction() as db:
            current = {
                (row["run_id"], row["lease_token"])
                for row in await fetch_all(db, queries.CURRENT_ATTEMPTS, (json_array(h.run_id for h in heartbeats),))
            }
            live = [h for h in heartbeats if (h.run_id, h.lease_token) in current]
            await db.executemany(
                queries.EXTEND_LEASES,
                [(h.progress, h.checkpoint, h.started, h.run_id, h.lease_token) for h in live],
            )
            await db.executemany(
                queries.MARK_ATTEMPTS_STARTED,
                [(h.run_id, h.lease_token) for h in live if h.started],
            )
        return [h.run_id for h in heartbeats if (h.run_id, h.lease_token) not in current]

    async def record_results(
        self, results: Sequence[AttemptResult], *, reporter_of: ReporterOf | None = None
    ) -> list[ResultOutcome]:
        if not results:
            return []
        successes, others = common.successes_first(results)
        async with self._transaction() as db:
            # Successes of current attempts set-wise (see common.successes_first). This is the
            # only writer, so the tokens read here are still current at the update.
            current = {
                (row["run_id"], row["lease_token"])
                for row in await fetch_all(db, queries.CURRENT_ATTEMPTS, (json_array({r.run_id for r in successes}),))
            } if successes else set()
            applied = [r for r in successes if (r.run_id, r.lease_token) in current]
            succeeded = await fetch_all(
                db, queries.SUCCEED_RUNS, (json_array(r.run_id for r in applied),)
            ) if applied else []
            await db.executemany(
                queries.SUCCEED_ATTEMPTS,
                [(r.error_code, r.error_message, instant(r.started_at), instant(r.finished_at), r.run_id,
                  r.lease_token) for r in applied],
            )
            if outputs := [(r.output, r.run_id) for r in applied if r.output]:
                await db.executemany(queries.SET_OUTPUT, outputs)
            outcomes = [ResultOutcome(row=row, accepted=True) for row in succeeded]
            released = await release_buffered(db, {row["job_id"] for row in succeeded})
            outcomes += [ResultOutcome(run=run, accepted=True, released=True) for run in released]
            rest = [r for r in successes if (r.run_id, r.lease_token) not in current] + others
            if rest:
                rows = await fetch_all(db, queries.RESULT_RUNS, (json_array({r.run_id for r in rest}),))
                now = from_micros(await fetch_value(db, queries.DB_NOW))
                runs = {row["run_id"]: codec.build_run(row) for row in rows}
                if reporter_of is not None:
                    rest = await record_late_reports(db, runs, rest, reporter_of, now, outcomes)
                outcomes += await apply_results(db, runs, rest, now, self._rng)
            return outcomes

    async def get_run(self, tenant: str, run_id: str) -> Run:
        async with self._read() as db:
            row = await fetch_one(db, queries.GET_RUN, (run_id, tenant))
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
            before_time, before_id = codec.decode_page_token(page_token, int, str)
        state_list = json_array(s.value for s in states)
        async with self._read() as db:
            rows = await fetch_all(
                db,
                queries.LIST_RUNS,
                (tenant, job_id, job_id, state_list, state_list, before_time, before_time, before_id,
                 common.page_limit(limit) + 1),
            )
        return common.page_of([codec.build_listed_run(row) for row in rows], limit, common.run_page_key)

    async def runs_by_id_prefix(self, tenant: str, prefix: str, limit: int) -> list[Run]:
        low, high = common.id_prefix_range(prefix)
        async with self._read() as db:
            rows = await fetch_all(db, queries.RUNS_BY_ID_RANGE, (low, high, tenant, common.page_limit(limit)))
        return common.with_id_prefix([codec.build_run(row) for row in rows], prefix, lambda run: run.run_id).items

    async def jobs_by_id_prefix(self, tenant: str, prefix: str, limit: int) -> list[Job]:
        low, high = common.id_prefix_range(prefix)
        async with self._read() as db:
            rows = await fetch_all(db, queries.JOBS_BY_ID_RANGE, (low, high, tenant, common.page_limit(limit)))
        return common.with_id_prefix([codec.build_job(row) for row in rows], prefix, lambda job: job.job_id).items

    async def jobs_by_name_prefix(self, tenant: str, prefix: str, limit: int) -> list[Job]:
        low, high = common.id_prefix_range(prefix)
        async with self._read() as db:
            rows = await fetch_all(db, queries.JOBS_BY_NAME_RANGE, (tenant, low, high, common.page_limit(limit)))
        return common.with_id_prefix([codec.build_job(row) for row in rows], prefix, lambda job: job.name).items

    async def list_attempts(self, run_id: str) -> list[Attempt]:
        async with self._read() as db:
            rows = await fetch_all(db, queries.LIST_ATTEMPTS, (run_id,))
        return [codec.build_attempt(row) for row in rows]


async def record_late_reports(
    db: aiosqlite.Connection,
    runs: dict[str, Run],
    results: list[AttemptResult],
    reporter_of: ReporterOf,
    now: datetime,
    outcomes: list[ResultOutcome],
) -> list[AttemptResult]:
    """Record the results whose attempt has no row (:mod:`fastlane.storage.late_reports`); returns
    the results left for :func:`apply_results` (see :func:`~fastlane.storage.late_reports.settle_plan`)."""
    known = {(row["run_id"], row["lease_token"])
             for row in await fetch_all(db, queries.ATTEMPT_KEYS, (json_array({r.run_id for r in results}),))}
    late = late_reports.unrecorded(results, known)
    if not late:
        return results
    plan = late_reports.plan_late_reports(runs, late, reporter_of, now)
    for row in plan.rows:
        await db.execute(queries.INSERT_LATE_ATTEMPT, (
            row.run_id, row.attempt, row.lease_token, row.worker_id, row.node_id, row.outcome.value,
            to_micros(row.dispatched_at), instant(row.started_at), instant(row.finished_at), row.error_code,
            row.error_message, row.error_traceback))
        await db.execute(queries.COUNT_LATE_ATTEMPT, (row.attempt, to_micros(row.dispatched_at), row.run_id))
    for run_id, attempt, since in plan.redeliveries:
        await db.execute(queries.MARK_REDELIVERIES, (run_id, attempt, to_micros(since)))
    return late_reports.settle_plan(plan, runs, results, outcomes)


async def apply_results(
    db: aiosqlite.Connection,
    runs: dict[str, Run],
    results: Sequence[AttemptResult],
    now: datetime,
    rng: random.Random,
) -> list[ResultOutcome]:
    """Write what :func:`fastlane.storage.common.decide_results` made of these results."""
    decided = common.decide_results(runs, results, now, rng)
    await db.executemany(
        queries.APPLY_RUN_RESULTS,
        [(run.state.value, to_micros(run.available_at), instant(run.finished_at), run.last_error, run.run_id)
         for run in decided.runs],
    )
    await db.executemany(
        queries.APPLY_ATTEMPT_RESULTS,
        [(u.outcome.value, u.result.error_code, u.result.error_message, u.result.error_traceback,
          instant(u.result.started_at),
          to_micros(u.finished_at), u.result.run_id, u.result.lease_token) for u in decided.attempts],
    )
    released = await release_buffered(db, decided.finished_jobs)
    return decided.outcomes + [ResultOutcome(run=run, accepted=True, released=True) for run in released]


async def release_buffered(db: aiosqlite.Connection, job_ids: Collection[str]) -> list[Run]:
    """Schedule the oldest buffered run of each job that has no other active run left."""
    if not job_ids:
        return []
    rows = await fetch_all(db, queries.RELEASE_BUFFERED, (json_array(job_ids),))
    return [codec.build_run(row) for row in rows]


async def _dispatch(db: aiosqlite.Connection, dispatches: Sequence[Dispatch]) -> list[Attempt]:
    """Start an attempt of each run still ``scheduled``: the runs in one statement, the attempts in another."""
    started = await fetch_all(
        db,
        queries.DISPATCH_RUNS,
        (json_array((d.run_id, d.lease_token, d.worker_id, common.micros_of_delta(d.lease_ttl),
                     to_micros(d.dispatched_at))
                    for d in dispatches),),
    )
    if not started:
        return []
    sent = {d.run_id: d for d in dispatches}
    rows = await fetch_all(
        db,
        queries.INSERT_ATTEMPTS,
        (json_array((run["run_id"], run["attempts"], run["lease_token"], run["worker_id"],
                     sent[run["run_id"]].node_id, to_micros(sent[run["run_id"]].dispatched_at))
                    for run in started),),
    )
    return [codec.build_attempt(row) for row in rows]
