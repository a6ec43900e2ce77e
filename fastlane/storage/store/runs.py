"""The store's runs: manual runs, cancel and retry, and the reads of run history."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from fastlane.domain import lifecycle
from fastlane.domain.errors import JobNotFound, RunNotFound
from fastlane.domain.lifecycle import CancelDecision
from fastlane.domain.models import Attempt, Run, RunState, new_id
from fastlane.domain.records import Change, ChangeKind, Page, RunFilter
from fastlane.domain.transitions import CANCELLED_BY_REQUEST
from fastlane.runtime.clock import from_micros
from fastlane.storage import codec, common
from fastlane.storage.results import Cancellation
from fastlane.storage.store.attempts import release_buffered
from fastlane.storage.store.database import StorePart


class SQLRuns(StorePart):
    async def create_manual_run(self, tenant: str, job_id: str) -> Run:
        async with self._db.write() as tx:
            row = await tx.fetchrow(self._q.INSERT_MANUAL_RUN, new_id(), job_id, tenant)
            if row is None:
                raise JobNotFound(job_id)
            run = codec.build_run(row)
            await tx.notify(Change(ChangeKind.RUN, run.shard_id, run.tenant, run.run_id))
        return run

    async def cancel_run(self, tenant: str, run_id: str) -> Cancellation:
        async with self._db.write() as tx:
            row = await tx.fetchrow(self._q.LOCK_RUN, run_id, tenant)
            if row is None:
                raise RunNotFound(run_id)
            run = codec.build_run(row)
            decision = lifecycle.cancel_decision(run)
            if decision is CancelDecision.ALREADY:
                return Cancellation(run=run, already=True)
            if decision is CancelDecision.REQUEST:
                row = await tx.fetchrow(self._q.REQUEST_CANCEL, run_id)
                assert row is not None, "LOCK_RUN holds the run (its row lock, or the one writer)"
                await tx.notify(Change(ChangeKind.RUN, run.shard_id, tenant, run_id))
                return Cancellation(run=codec.build_run(row))
            row = await tx.fetchrow(self._q.CANCEL_RUN, run_id, CANCELLED_BY_REQUEST)
            assert row is not None, "LOCK_RUN holds the run (its row lock, or the one writer)"
            released = await release_buffered(tx, self._q, [run.job_id])
            await tx.notify(Change(ChangeKind.RUN, run.shard_id, tenant, run_id))
            for other in released:
                await tx.notify(Change(ChangeKind.RUN, other.shard_id, other.tenant, other.run_id))
        return Cancellation(run=codec.build_run(row), released=released)

    async def retry_run(self, tenant: str, run_id: str) -> Run:
        async with self._db.write() as tx:
            row = await tx.fetchrow(self._q.RUN_STATE, run_id, tenant)
            if row is None:
                raise RunNotFound(run_id)
            lifecycle.check_replayable(run_id, row["state"])
            row = await tx.fetchrow(self._q.RETRY_RUN, run_id)
            assert row is not None, "RUN_STATE holds the run (its row lock, or the one writer)"
            run = codec.build_run(row)
            await tx.notify(Change(ChangeKind.RUN, run.shard_id, run.tenant, run.run_id))
        return run

    async def get_run(self, tenant: str, run_id: str) -> Run:
        async with self._db.read() as tx:
            row = await tx.fetchrow(self._q.GET_RUN, run_id, tenant)
        if row is None:
            raise RunNotFound(run_id)
        return codec.build_run_read_alone(row)

    async def list_runs(
        self,
        tenant: str,
        *,
        job_id: str | None = None,
        states: Collection[RunState] = (),
        limit: int = 100,
        page_token: str = "",
        scheduled_from: datetime | None = None,
        scheduled_before: datetime | None = None,
        job_type: str | None = None,
        backfill_id: str | None = None,
    ) -> Page[Run]:
        before_time, before_id = None, ""
        if page_token:
            micros, before_id = codec.decode_page_token(page_token, int, str)
            before_time = from_micros(micros)
        async with self._db.read() as tx:
            rows = await tx.fetch(
                self._q.LIST_RUNS,
                tenant, job_id, [s.value for s in states], before_time, before_id, scheduled_from, scheduled_before,
                common.page_limit(limit) + 1, job_type, backfill_id,
            )
        return common.page_of([codec.build_listed_run(row) for row in rows], limit, common.run_page_key)

    def page_token_after(self, run: Run) -> str:
        return codec.encode_page_token(*common.run_page_key(run))

    async def count_runs(self, tenant: str, selection: RunFilter) -> int:
        async with self._db.read() as tx:
            return int(await tx.fetchval(
                self._q.COUNT_RUNS, tenant, selection.job_id, selection.job_type,
                sorted(state.value for state in selection.states), selection.scheduled_from,
                selection.scheduled_before, selection.backfill_id,
            ))

    async def runs_by_id_prefix(self, tenant: str, prefix: str, limit: int) -> list[Run]:
        low, high = common.id_prefix_range(prefix)
        async with self._db.read() as tx:
            rows = await tx.fetch(self._q.RUNS_BY_ID_RANGE, low, high, tenant, common.page_limit(limit))
        return common.with_id_prefix([codec.build_run(row) for row in rows], prefix, lambda run: run.run_id).items

    async def list_attempts(self, run_id: str) -> list[Attempt]:
        async with self._db.read() as tx:
            rows = await tx.fetch(self._q.LIST_ATTEMPTS, run_id)
        return [codec.build_attempt(row) for row in rows]
