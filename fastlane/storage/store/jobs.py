"""The store's jobs: create (idempotent on tenant and name), read, list, update, pause, resume,
set aside and delete; each change another node must hear of is notified inside its transaction."""

from __future__ import annotations

from collections.abc import Collection

from fastlane.domain import lifecycle
from fastlane.domain.errors import JobNotFound
from fastlane.domain.models import Job, JobSpec, JobState, new_id, shard_of
from fastlane.domain.records import Change, ChangeKind, JobFilter, Page
from fastlane.domain.schedules import first_fire
from fastlane.domain.validation import validate_spec
from fastlane.storage import codec, common
from fastlane.storage.store.database import StorePart, Tx


class SQLJobs(StorePart):
    async def create_job(self, spec: JobSpec, *, job_id: str | None = None) -> tuple[Job, bool]:
        validate_spec(spec)
        job_id = job_id or new_id()
        shard_id = shard_of(job_id, await self.shard_count())
        async with self._db.write() as tx:
            now = await tx.now()
            stored = common.anchor_interval(spec, now)
            row = await tx.fetchrow(
                self._q.INSERT_JOB,
                job_id, spec.tenant, spec.name, spec.job_type, shard_id, first_fire(stored.schedule, now),
                spec.priority, spec.payload, codec.encode_policies(stored).decode(), now,
            )
            if row is not None:
                job = codec.build_job(row)
                await _notify(tx, job)
                return job, True
            row = await tx.fetchrow(self._q.JOB_BY_NAME, spec.tenant, spec.name)
            if row is None:
                # The job that conflicted was deleted since (PostgreSQL: this statement sees a new
                # snapshot; SQLite's one writer keeps that from happening).
                raise TypeError(f"job {spec.name!r} of tenant {spec.tenant!r} vanished after conflicting")
            existing = codec.build_job(row)
        return common.idempotent_create(existing, spec), False

    async def get_job(self, tenant: str, job_id: str) -> Job:
        async with self._db.read() as tx:
            row = await tx.fetchrow(self._q.GET_JOB, job_id, tenant)
        if row is None:
            raise JobNotFound(job_id)
        return codec.build_job(row)

    async def list_jobs(
        self,
        tenant: str,
        *,
        states: Collection[JobState] = (),
        job_type: str | None = None,
        limit: int = 100,
        page_token: str = "",
        name: str | None = None,
    ) -> Page[Job]:
        after = codec.decode_page_token(page_token, str)[0] if page_token else ""
        async with self._db.read() as tx:
            if name is not None:  # one row at most, found by the (tenant, name) index
                found = await tx.fetchrow(self._q.JOB_BY_NAME, tenant, name)
                return common.named_job_page(None if found is None else codec.build_job(found),
                                             JobFilter(job_type=job_type, states=frozenset(states)), after)
            rows = await tx.fetch(
                self._q.LIST_JOBS, tenant, after, sorted(state.value for state in states), job_type,
                common.page_limit(limit) + 1,
            )
        return common.page_of([codec.build_job(row) for row in rows], limit, common.job_page_key)

    async def count_selected_jobs(self, tenant: str, selection: JobFilter) -> int:
        async with self._db.read() as tx:
            return int(await tx.fetchval(self._q.COUNT_SELECTED_JOBS, tenant,
                                         sorted(state.value for state in selection.states), selection.job_type))

    async def update_job(self, tenant: str, job_id: str, spec: JobSpec) -> Job:
        validate_spec(spec)
        async with self._db.write() as tx:
            row = await tx.fetchrow(self._q.LOCK_JOB, job_id, tenant)
            if row is None:
                raise JobNotFound(job_id)
            current = codec.build_job(row)
            common.check_update(current, spec)
            now = await tx.now()
            spec = common.anchor_interval(spec, now)
            next_fire_at, state = common.rescheduled(current, spec, now)
            row = await tx.fetchrow(
                self._q.UPDATE_JOB,
                job_id, tenant, spec.job_type, spec.priority, spec.payload,
                codec.encode_policies(spec).decode(), next_fire_at, state.value, now,
            )
            assert row is not None, "LOCK_JOB holds the job (its row lock, or the one writer)"
            job = codec.build_job(row)
            await _notify(tx, job)
        return job

    async def pause_job(self, tenant: str, job_id: str, reason: str | None = None) -> Job:
        return await self._change_state(tenant, job_id, JobState.PAUSED, "pause", reason)

    async def resume_job(self, tenant: str, job_id: str) -> Job:
        return await self._change_state(tenant, job_id, JobState.ACTIVE, "resume")

    async def set_job_aside(self, job_id: str, reason: str) -> None:
        async with self._db.write() as tx:
            row = await tx.fetchrow(self._q.SET_JOB_ASIDE, job_id, JobState.ERRORED.value, reason)
            if row is not None:
                await tx.notify(Change(ChangeKind.JOB, row["shard_id"], row["tenant"], job_id))

    async def count_jobs(self, state: JobState) -> int:
        async with self._db.read() as tx:
            return int(await tx.fetchval(self._q.COUNT_JOBS, state.value))

    async def _change_state(self, tenant: str, job_id: str, target: JobState, verb: str,
                            reason: str | None = None) -> Job:
        async with self._db.write() as tx:
            row = await tx.fetchrow(self._q.LOCK_JOB, job_id, tenant)
            if row is None:
                raise JobNotFound(job_id)
            if not lifecycle.job_state_change(job_id, row["state"], target, verb):
                return codec.build_job(row)
            row = await tx.fetchrow(self._q.CHANGE_JOB_STATE, job_id, target.value, reason)
            assert row is not None, "LOCK_JOB holds the job (its row lock, or the one writer)"
            job = codec.build_job(row)
            await _notify(tx, job)
        return job

    async def delete_job(self, tenant: str, job_id: str) -> None:
        async with self._db.write() as tx:
            shard_id = await tx.fetchval(self._q.DELETE_JOB, job_id, tenant)
            if shard_id is None:
                raise JobNotFound(job_id)
            await tx.notify(Change(ChangeKind.JOB_DELETED, shard_id, tenant, job_id))
            await tx.execute(self._q.CANCEL_RUNS_OF_DELETED_JOB, job_id)

    async def jobs_by_id_prefix(self, tenant: str, prefix: str, limit: int) -> list[Job]:
        low, high = common.id_prefix_range(prefix)
        async with self._db.read() as tx:
            rows = await tx.fetch(self._q.JOBS_BY_ID_RANGE, low, high, tenant, common.page_limit(limit))
        return common.with_id_prefix([codec.build_job(row) for row in rows], prefix, lambda job: job.job_id).items

    async def jobs_by_name_prefix(self, tenant: str, prefix: str, limit: int) -> list[Job]:
        low, high = common.id_prefix_range(prefix)
        async with self._db.read() as tx:
            rows = await tx.fetch(self._q.JOBS_BY_NAME_RANGE, tenant, low, high, common.page_limit(limit))
        return common.with_id_prefix([codec.build_job(row) for row in rows], prefix, lambda job: job.name).items



async def _notify(tx: Tx, job: Job) -> None:
    await tx.notify(Change(ChangeKind.JOB, job.shard_id, job.tenant, job.job_id))
