"""The Store contract: every test runs against each backend (the ``make_store`` fixture)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from fastlane.domain.errors import InvalidState, JobAlreadyExists, JobNotFound, RunNotFound, StaleFence
from fastlane.domain.models import (
    AttemptOutcome,
    Delivery,
    DueJob,
    JobSpec,
    JobState,
    MisfireKind,
    MisfirePolicy,
    NodeInfo,
    OverlapPolicy,
    RetryPolicy,
    RunState,
    Schedule,
    ShardLease,
)
from fastlane.domain.policies import plan_occurrence
from fastlane.errors import InvalidArgument
from fastlane.storage import (
    AttemptResult,
    Change,
    Dispatch,
    Heartbeat,
    JobFilter,
    Occurrence,
    RunFilter,
    open_store,
)

SHARDS = 4
TTL = timedelta(seconds=30)
NOW = datetime.now(UTC)


@pytest.fixture
async def store(make_store):
    store = make_store(shard_count=SHARDS)
    await store.migrate()
    yield store
    await store.close()


@pytest.fixture
async def second_store(make_store, store):
    """Another store on the same database: another connection, as another node would have."""
    other = make_store(shard_count=SHARDS)
    yield other
    await other.close()


def spec(name: str = "billing", **changes) -> JobSpec:
    base = JobSpec(name=name, job_type="billing.run", schedule=Schedule.cron_expr("*/5 * * * *"), payload=b'{"a":1}')
    return replace(base, **changes)


async def own_all(store, owner: str = "node-a") -> dict[int, ShardLease]:
    leases = await store.shards.acquire_shards(owner, TTL, limit=SHARDS)
    return {lease.shard_id: lease for lease in leases}


async def due_now(store, job_id: str, seconds_ago: float = 0.5) -> None:
    """Make a job due at once by pointing its schedule at a past instant."""
    current = await store.jobs.get_job("default", job_id)
    at = datetime.now(UTC) - timedelta(seconds=seconds_ago)
    await store.jobs.update_job("default", job_id, replace(current.spec, schedule=Schedule.at_instant(at)))


async def lease_expired(store, shard_id: int, timeout: float = 5.0) -> None:
    """Wait until an attempt of the shard has an expired lease, by the database clock."""
    deadline = asyncio.get_running_loop().time() + timeout
    while shard_id not in await store.lane.shards_with_expired_leases([shard_id]):
        assert asyncio.get_running_loop().time() < deadline, "the attempt's lease never expired"
        await asyncio.sleep(0.02)


async def materialise_job(store, leases, job_id: str):
    job = await store.jobs.get_job("default", job_id)
    now = await store.db_now()
    occurrence = plan_occurrence(DueJob.of(job), now, now)
    return (await store.lane.materialise_runs([leases[job.shard_id]], [occurrence])).runs


# -- migrations and jobs -----------------------------------------------------------------------


async def test_migrate_is_idempotent_and_creates_the_shards(store):
    assert await store.migrate() == 17  # 0017: a run names the backfill that wrote it
    shards = await store.shards.list_shards()
    assert [shard.shard_id for shard in shards] == list(range(SHARDS))
    assert all(shard.owner == "" and shard.token == 0 for shard in shards)


async def test_create_job_is_idempotent_on_tenant_and_name(store):
    job, created = await store.jobs.create_job(spec())
    again, created_again = await store.jobs.create_job(spec())
    assert created and not created_again
    assert again.job_id == job.job_id
    assert job.next_fire_at is not None and job.next_fire_at.minute % 5 == 0
    other_tenant, created_other = await store.jobs.create_job(spec(tenant="acme"))
    assert created_other and other_tenant.job_id != job.job_id


async def test_create_job_with_a_taken_name_and_another_spec_names_the_difference(store):
    await store.jobs.create_job(spec())
    with pytest.raises(JobAlreadyExists, match="different schedule"):
        await store.jobs.create_job(spec(schedule=Schedule.cron_expr("0 * * * *")))


async def test_interval_job_is_idempotent_although_its_anchor_is_filled_in(store):
    every = spec(schedule=Schedule.interval(timedelta(seconds=10)))
    job, _ = await store.jobs.create_job(every)
    assert job.spec.schedule.anchor is not None
    assert job.next_fire_at == job.spec.schedule.anchor + timedelta(seconds=10)
    again, created = await store.jobs.create_job(every)
    assert not created and again.job_id == job.job_id


async def test_jobs_are_invisible_to_other_tenants(store):
    job, _ = await store.jobs.create_job(spec())
    with pytest.raises(JobNotFound):
        await store.jobs.get_job("acme", job.job_id)
    with pytest.raises(JobNotFound):
        await store.jobs.delete_job("acme", job.job_id)


async def test_list_jobs_pages_and_filters(store):
    for index in range(5):
        await store.jobs.create_job(spec(f"job-{index}", job_type="a" if index % 2 else "b"))
    first = await store.jobs.list_jobs("default", limit=2)
    second = await store.jobs.list_jobs("default", limit=2, page_token=first.next_page_token)
    third = await store.jobs.list_jobs("default", limit=2, page_token=second.next_page_token)
    names = [job.name for page in (first, second, third) for job in page.items]
    assert sorted(names) == [f"job-{index}" for index in range(5)]
    assert third.next_page_token == ""
    only_a = await store.jobs.list_jobs("default", job_type="a")
    assert sorted(job.name for job in only_a.items) == ["job-1", "job-3"]
    assert [job.name for job in (await store.jobs.list_jobs("default", name="job-3")).items] == ["job-3"]
    assert (await store.jobs.list_jobs("default", name="job-3", job_type="b")).items == []
    assert (await store.jobs.list_jobs("other-tenant", name="job-3")).items == []
    with pytest.raises(InvalidArgument, match="page_token"):
        await store.jobs.list_jobs("default", page_token="not-a-token")


async def test_a_paused_job_keeps_the_reason_of_its_pause_until_it_is_resumed(store):
    job, _ = await store.jobs.create_job(spec("reasoned"))
    paused = await store.jobs.pause_job("default", job.job_id, "ledger migration")
    assert (paused.state, paused.pause_reason) == (JobState.PAUSED, "ledger migration")
    assert (await store.jobs.get_job("default", job.job_id)).pause_reason == "ledger migration"
    assert [found.pause_reason for found in (await store.jobs.list_jobs("default")).items] == ["ledger migration"]
    assert (await store.jobs.pause_job("default", job.job_id, "other")).pause_reason == "ledger migration"  # unchanged
    resumed = await store.jobs.resume_job("default", job.job_id)
    assert (resumed.state, resumed.pause_reason) == (JobState.ACTIVE, None)
    assert (await store.jobs.pause_job("default", job.job_id)).pause_reason is None  # none given


async def test_jobs_are_listed_and_counted_by_a_set_of_states_within_the_tenant(store):
    jobs = [(await store.jobs.create_job(spec(f"job-{index}", job_type="a" if index % 2 else "b")))[0]
            for index in range(5)]
    await store.jobs.pause_job("default", jobs[1].job_id)
    await store.jobs.pause_job("default", jobs[2].job_id)
    paused = frozenset({JobState.PAUSED})
    listed = await store.jobs.list_jobs("default", states=paused)
    assert sorted(job.name for job in listed.items) == ["job-1", "job-2"]
    both = await store.jobs.list_jobs("default", states={JobState.PAUSED, JobState.ACTIVE}, job_type="a")
    assert sorted(job.name for job in both.items) == ["job-1", "job-3"]
    assert len((await store.jobs.list_jobs("default", states=())).items) == 5  # no states: any
    assert await store.jobs.count_selected_jobs("default", JobFilter(states=paused)) == 2
    assert await store.jobs.count_selected_jobs("default", JobFilter(states=paused, job_type="a")) == 1
    active = frozenset({JobState.ACTIVE})
    assert await store.jobs.count_selected_jobs("default", JobFilter(states=active | paused, job_type="b")) == 3
    assert await store.jobs.count_selected_jobs("default", JobFilter(states=frozenset())) == 0  # no state: none
    assert await store.jobs.count_selected_jobs("other-tenant", JobFilter(states=active | paused)) == 0
    assert (await store.jobs.list_jobs("other-tenant", states=paused)).items == []


async def test_jobs_and_runs_are_found_by_the_start_of_their_id_within_the_tenant(store):
    jobs = [(await store.jobs.create_job(spec(f"job-{index}")))[0] for index in range(3)]
    job = jobs[0]
    assert [found.job_id for found in await store.jobs.jobs_by_id_prefix("default", job.job_id[:8], 10)] == [job.job_id]
    assert [found.job_id for found in await store.jobs.jobs_by_id_prefix("default", job.job_id, 10)] == [job.job_id]
    assert await store.jobs.jobs_by_id_prefix("other-tenant", job.job_id[:8], 10) == []
    run = await store.runs.create_manual_run("default", job.job_id)
    assert [found.run_id for found in await store.runs.runs_by_id_prefix("default", run.run_id[:6], 10)] == [run.run_id]
    assert await store.runs.runs_by_id_prefix("other-tenant", run.run_id[:6], 10) == []
    assert await store.runs.runs_by_id_prefix("default", "zzzz", 10) == []


async def test_jobs_are_found_by_the_start_of_their_name_in_byte_order_within_the_tenant(store):
    # Names a locale's collation orders apart from their bytes ("a-b" after "ab" in en_US), and
    # characters that are wildcards elsewhere (a "." or "_" is no pattern here).
    names = ["ab", "a-b", "a-c", "a.b", "a", "b-a", "A-b", "a-b-2"]
    for name in names:
        await store.jobs.create_job(spec(name))
    await store.jobs.create_job(replace(spec("a-b-other"), tenant="other-tenant"))

    async def found(prefix: str, limit: int = 100) -> list[str]:
        return [job.name for job in await store.jobs.jobs_by_name_prefix("default", prefix, limit)]

    assert await found("a-") == ["a-b", "a-b-2", "a-c"]
    assert await found("a") == sorted(name for name in names if name.startswith("a"))
    assert await found("a.") == ["a.b"]
    assert await found("A") == ["A-b"]
    assert await found("a-b") == ["a-b", "a-b-2"]
    assert await found("a", limit=2) == ["a", "a-b"]
    assert await found("zz") == []
    assert [job.name for job in await store.jobs.jobs_by_name_prefix("other-tenant", "a-", 10)] == ["a-b-other"]


async def test_update_job_recomputes_next_fire_only_when_the_schedule_changes(store):
    job, _ = await store.jobs.create_job(spec())
    same_schedule = await store.jobs.update_job("default", job.job_id, spec(payload=b"{}"))
    assert same_schedule.next_fire_at == job.next_fire_at and same_schedule.version == job.version + 1
    at = datetime(2031, 1, 1, tzinfo=UTC)
    moved = await store.jobs.update_job("default", job.job_id, spec(schedule=Schedule.at_instant(at)))
    assert moved.next_fire_at == at
    with pytest.raises(InvalidArgument, match="name"):
        await store.jobs.update_job("default", job.job_id, spec("renamed"))


async def test_pause_and_resume_change_state_and_are_idempotent(store):
    job, _ = await store.jobs.create_job(spec())
    assert (await store.jobs.pause_job("default", job.job_id)).state is JobState.PAUSED
    assert (await store.jobs.pause_job("default", job.job_id)).state is JobState.PAUSED
    assert await store.lane.load_due_jobs(range(SHARDS), datetime(2100, 1, 1, tzinfo=UTC)) == []
    assert (await store.jobs.resume_job("default", job.job_id)).state is JobState.ACTIVE


async def test_completed_one_shot_cannot_be_paused(store):
    leases = await own_all(store)
    job, _ = await store.jobs.create_job(spec(schedule=Schedule.now()))
    await materialise_job(store, leases, job.job_id)
    assert (await store.jobs.get_job("default", job.job_id)).state is JobState.COMPLETED
    with pytest.raises(InvalidState, match="completed"):
        await store.jobs.pause_job("default", job.job_id)


async def test_delete_job_cancels_its_queued_runs_and_keeps_history(store):
    leases = await own_all(store)
    job, _ = await store.jobs.create_job(spec())
    await due_now(store, job.job_id)
    [run] = await materialise_job(store, leases, job.job_id)
    await store.jobs.delete_job("default", job.job_id)
    with pytest.raises(JobNotFound):
        await store.jobs.get_job("default", job.job_id)
    kept = await store.runs.get_run("default", run.run_id)
    assert kept.state is RunState.CANCELLED and kept.finished_at is not None


async def test_load_due_jobs_respects_shards_horizon_and_watermark(store):
    now = await store.db_now()
    jobs = []
    for index in range(12):
        at = now + timedelta(seconds=index)
        job, _ = await store.jobs.create_job(spec(f"at-{index}", schedule=Schedule.at_instant(at)))
        jobs.append(job)
    horizon = now + timedelta(seconds=6)
    due = await store.lane.load_due_jobs(range(SHARDS), horizon)
    assert [job.job_id for job in due] == [job.job_id for job in jobs[:6]]
    assert [job.next_fire_at for job in due] == [job.next_fire_at for job in jobs[:6]]
    later = await store.lane.load_due_jobs(range(SHARDS), now + timedelta(seconds=9), at_or_after=horizon)
    assert [job.job_id for job in later] == [job.job_id for job in jobs[6:9]]
    one_shard = jobs[0].shard_id
    scoped = await store.lane.load_due_jobs([one_shard], now + timedelta(seconds=20))
    assert scoped and all(job.shard_id == one_shard for job in scoped)
    assert len(scoped) == sum(1 for job in jobs if job.shard_id == one_shard)


# -- shards and fencing ------------------------------------------------------------------------


async def test_acquiring_a_shard_increments_its_token(store, second_store):
    [first] = await store.shards.acquire_shards("node-a", TTL, limit=1, shard_ids=[2])
    assert first.owner == "node-a" and first.token == 1
    assert await second_store.shards.acquire_shards("node-b", TTL, limit=1, shard_ids=[2]) == []
    await store.shards.release_shards([first])
    [taken] = await second_store.shards.acquire_shards("node-b", TTL, limit=1, shard_ids=[2])
    assert taken.owner == "node-b" and taken.token == 2


async def test_renew_keeps_the_token_and_extends_the_lease(store):
    [lease] = await store.shards.acquire_shards("node-a", TTL, limit=1)
    [renewed] = await store.shards.renew_shards([lease], TTL * 2)
    assert renewed.token == lease.token
    assert renewed.lease_expires_at > lease.lease_expires_at


async def test_a_lease_expires_by_the_database_clock(store, second_store):
    ttl = timedelta(milliseconds=600)
    [lease] = await store.shards.acquire_shards("node-a", ttl, limit=1, shard_ids=[0])
    db_now = await store.db_now()
    # The expiry is the database's now plus the TTL, whatever the caller's clock says.
    assert timedelta(0) < lease.lease_expires_at - db_now <= ttl
    assert await second_store.shards.acquire_shards("node-b", TTL, limit=1, shard_ids=[0]) == []
    deadline = asyncio.get_running_loop().time() + 10
    while not (taken := await second_store.shards.acquire_shards("node-b", TTL, limit=1, shard_ids=[0])):
        assert asyncio.get_running_loop().time() < deadline, "the lease never expired"
        await asyncio.sleep(0.05)
    assert await second_store.db_now() >= lease.lease_expires_at
    assert taken[0].token == lease.token + 1
    assert await store.shards.renew_shards([lease], TTL) == []


async def test_stale_token_cannot_materialise_runs(store, second_store):
    leases = await own_all(store)
    job, _ = await store.jobs.create_job(spec())
    await due_now(store, job.job_id)
    job = await store.jobs.get_job("default", job.job_id)
    stale = leases[job.shard_id]
    await store.shards.release_shards([stale])
    [successor] = await second_store.shards.acquire_shards("node-b", TTL, limit=1, shard_ids=[job.shard_id])
    assert successor.token == stale.token + 1
    now = await store.db_now()
    with pytest.raises(StaleFence) as raised:
        await store.lane.materialise_runs([stale], [plan_occurrence(DueJob.of(job), now, now)])
    assert raised.value.shard_id == job.shard_id and raised.value.token == stale.token
    unchanged = await store.jobs.get_job("default", job.job_id)
    assert unchanged.next_fire_at == job.next_fire_at and unchanged.state is JobState.ACTIVE
    assert (await store.runs.list_runs("default", job_id=job.job_id)).items == []


async def due_jobs_over_shards(store, prefix: str) -> tuple[list, list[int]]:
    """Eight jobs due now, and the shards they fall in (more than one)."""
    jobs = []
    for index in range(8):
        job, _ = await store.jobs.create_job(spec(f"{prefix}-{index}"))
        await due_now(store, job.job_id)
        jobs.append(await store.jobs.get_job("default", job.job_id))
    shards = sorted({job.shard_id for job in jobs})
    assert len(shards) > 1
    return jobs, shards


async def test_one_stale_fence_refuses_the_whole_batch(store, second_store):
    leases = await own_all(store)
    jobs, shards = await due_jobs_over_shards(store, "multi")
    await store.shards.release_shards([leases[shards[-1]]])
    await second_store.shards.acquire_shards("node-b", TTL, limit=1, shard_ids=[shards[-1]])
    now = await store.db_now()
    with pytest.raises(StaleFence) as raised:
        await store.lane.materialise_runs([leases[s] for s in shards], [plan_occurrence(DueJob.of(j), now, now) for j in jobs])
    assert raised.value.shard_id == shards[-1]
    assert (await store.runs.list_runs("default")).items == []


async def test_a_batch_of_written_runs_holds_equal_values_once(store):
    """The fast lane holds written runs by the hundred thousand: a batch's runs share their
    transaction's created_at, each its scheduled time as available_at, and the window's job ids."""
    leases = await own_all(store)
    jobs, shards = await due_jobs_over_shards(store, "shared")
    now = await store.db_now()
    occurrences = [plan_occurrence(DueJob.of(job), now, now) for job in jobs]
    runs = (await store.lane.materialise_runs([leases[s] for s in shards], occurrences)).runs
    assert len(runs) == len(jobs)
    first = runs[0]
    job_id_held = {o.job_id: o.job_id for o in occurrences}
    for run in runs:
        assert run.job_id is job_id_held[run.job_id]
        assert run.available_at is run.scheduled_for
        assert run.created_at is first.created_at and run.updated_at is first.created_at
        assert run.tenant is first.tenant and run.job_type is first.job_type
    pending = await store.lane.pending_runs(shards, now + timedelta(hours=1))
    assert len(pending) == len(runs)
    assert all(run.available_at is run.scheduled_for and run.tenant is first.tenant for run in pending)


async def test_a_lease_past_its_expiry_cannot_materialise_runs(store):
    """Owner and token still match, but the lease ran out by the database clock: refused, as in a
    batch with a live lease beside it."""
    live = await own_all(store)
    jobs, shards = await due_jobs_over_shards(store, "expiring")
    expiring = shards[0]
    await store.shards.release_shards([live[expiring]])
    [short] = await store.shards.acquire_shards("node-a", timedelta(milliseconds=300), limit=1, shard_ids=[expiring])
    deadline = asyncio.get_running_loop().time() + 10
    while await store.db_now() <= short.lease_expires_at:
        assert asyncio.get_running_loop().time() < deadline, "the lease never expired"
        await asyncio.sleep(0.05)
    fences = [short if shard == expiring else live[shard] for shard in shards]
    now = await store.db_now()
    with pytest.raises(StaleFence) as raised:
        await store.lane.materialise_runs(fences, [plan_occurrence(DueJob.of(job), now, now) for job in jobs])
    assert raised.value.shard_id == expiring and raised.value.token == short.token
    assert (await store.runs.list_runs("default")).items == []


async def test_stale_token_cannot_requeue_expired_runs(store, second_store):
    leases = await own_all(store)
    await store.shards.release_shards([leases[1]])
    await second_store.shards.acquire_shards("node-b", TTL, limit=1, shard_ids=[1])
    with pytest.raises(StaleFence):
        await store.lane.requeue_expired(leases[1])


async def test_racing_materialisations_create_exactly_one_run(store, second_store):
    leases = await own_all(store)
    jobs = []
    for index in range(20):
        job, _ = await store.jobs.create_job(spec(f"race-{index}"))
        await due_now(store, job.job_id)
        jobs.append(await store.jobs.get_job("default", job.job_id))
    now = await store.db_now()
    by_shard: dict[int, list[Occurrence]] = {}
    for job in jobs:
        by_shard.setdefault(job.shard_id, []).append(plan_occurrence(DueJob.of(job), now, now))
    # Both connections believe they hold every shard (same owner and token): only the database decides.
    results = await asyncio.gather(*(
        writer.lane.materialise_runs([leases[shard_id]], occurrences)
        for shard_id, occurrences in by_shard.items()
        for writer in (store, second_store)
    ))
    created = [run for result in results for run in result.runs]
    assert sorted(run.job_id for run in created) == sorted(job.job_id for job in jobs)
    for job in jobs:
        assert len((await store.runs.list_runs("default", job_id=job.job_id)).items) == 1


async def test_materialise_advances_next_fire_and_completes_one_shots(store):
    leases = await own_all(store)
    cron_job, _ = await store.jobs.create_job(spec())
    await due_now(store, cron_job.job_id)
    [run] = await materialise_job(store, leases, cron_job.job_id)
    assert run.state is RunState.SCHEDULED and run.attempts == 0 and run.payload == b'{"a":1}'
    assert run.idempotency_key.startswith(f"{cron_job.job_id}:")
    job = await store.jobs.get_job("default", cron_job.job_id)
    assert job.state is JobState.COMPLETED and job.next_fire_at is None
    # Materialising the same occurrence again writes nothing: the job no longer has that fire time.
    now = await store.db_now()
    again = Occurrence(job_id=job.job_id, expected_next_fire_at=run.scheduled_for, fire_times=(run.scheduled_for,),
                       next_fire_at=None)
    assert (await store.lane.materialise_runs([leases[job.shard_id]], [again])).runs == []
    assert now >= run.scheduled_for


async def test_skipped_occurrences_are_recorded_but_not_returned(store):
    leases = await own_all(store)
    job, _ = await store.jobs.create_job(spec(schedule=Schedule.interval(timedelta(seconds=1))))
    job = await store.jobs.get_job("default", job.job_id)
    start = job.next_fire_at
    occurrence = Occurrence(
        job_id=job.job_id, expected_next_fire_at=start, fire_times=(start + timedelta(seconds=2),),
        skipped_times=(start, start + timedelta(seconds=1)), next_fire_at=start + timedelta(seconds=3),
    )
    written = await store.lane.materialise_runs([leases[job.shard_id]], [occurrence])
    [fired] = written.runs
    assert fired.scheduled_for == start + timedelta(seconds=2)
    assert written.skipped == {"misfire": 2}  # counted for fastlane_occurrences_skipped_total
    skipped = await store.runs.list_runs("default", job_id=job.job_id, states=[RunState.SKIPPED])
    assert sorted(run.scheduled_for for run in skipped.items) == [start, start + timedelta(seconds=1)]
    assert all(run.finished_at is not None for run in skipped.items)
    assert (await store.jobs.get_job("default", job.job_id)).next_fire_at == start + timedelta(seconds=3)


# -- runs and attempts -------------------------------------------------------------------------


async def scheduled_run(store, **changes):
    leases = await own_all(store)
    job, _ = await store.jobs.create_job(spec(**changes))
    await due_now(store, job.job_id)
    [run] = await materialise_job(store, leases, job.job_id)
    return leases, run


async def test_dispatch_then_success_records_one_attempt(store):
    _, run = await scheduled_run(store)
    [attempt] = await store.attempts.record_dispatches(
        [Dispatch(run_id=run.run_id, lease_token=11, worker_id="w1", node_id="n1", lease_ttl=TTL, dispatched_at=NOW)]
    )
    assert attempt.attempt == 1 and attempt.outcome is AttemptOutcome.PENDING and attempt.worker_id == "w1"
    assert attempt.dispatched_at == NOW  # the send time, not the time the journal wrote it
    assert await store.attempts.record_heartbeats(
        [Heartbeat(run_id=run.run_id, lease_token=11, progress=0.5, checkpoint=b"cp", started=True)]
    ) == []
    running = await store.runs.get_run("default", run.run_id)
    assert running.state is RunState.RUNNING and running.progress == 0.5 and running.checkpoint == b"cp"
    [outcome] = await store.attempts.record_results(
        [AttemptResult(run_id=run.run_id, lease_token=11, outcome=AttemptOutcome.SUCCEEDED)]
    )
    assert outcome.accepted and outcome.run.state is RunState.SUCCEEDED
    [attempt] = await store.runs.list_attempts(run.run_id)
    assert attempt.outcome is AttemptOutcome.SUCCEEDED and attempt.started_at and attempt.finished_at
    done = await store.runs.get_run("default", run.run_id)
    assert done.state is RunState.SUCCEEDED and done.attempts == 1 and done.finished_at is not None


async def test_a_run_already_dispatched_is_not_dispatched_twice(store):
    _, run = await scheduled_run(store)
    first = Dispatch(run_id=run.run_id, lease_token=1, worker_id="w1", node_id="n1", lease_ttl=TTL, dispatched_at=NOW)
    second = Dispatch(run_id=run.run_id, lease_token=2, worker_id="w2", node_id="n2", lease_ttl=TTL, dispatched_at=NOW)
    assert len(await store.attempts.record_dispatches([first])) == 1
    assert await store.attempts.record_dispatches([second]) == []
    assert await store.attempts.record_heartbeats([Heartbeat(run_id=run.run_id, lease_token=2)]) == [run.run_id]


async def test_retryable_failure_reschedules_and_permanent_failure_kills(store):
    _, run = await scheduled_run(store, retry=RetryPolicy(max_attempts=2, backoff_base=timedelta(seconds=2)))
    await store.attempts.record_dispatches([Dispatch(run_id=run.run_id, lease_token=1, worker_id="w", node_id="n", lease_ttl=TTL, dispatched_at=NOW)])
    [failed] = await store.attempts.record_results([AttemptResult(
        run_id=run.run_id, lease_token=1, outcome=AttemptOutcome.FAILED, error_code="boom", error_message="it broke")])
    assert failed.run.state is RunState.SCHEDULED and failed.run.last_error == "it broke"
    now = await store.db_now()
    assert failed.run.available_at <= now + timedelta(seconds=2)
    pending = await store.lane.pending_runs(range(SHARDS), now + timedelta(seconds=3))
    assert [p.run_id for p in pending] == [run.run_id]
    await store.attempts.record_dispatches([Dispatch(run_id=run.run_id, lease_token=2, worker_id="w", node_id="n", lease_ttl=TTL, dispatched_at=NOW)])
    [dead] = await store.attempts.record_results([AttemptResult(
        run_id=run.run_id, lease_token=2, outcome=AttemptOutcome.FAILED, error_message="again")])
    assert dead.run.state is RunState.DEAD
    attempts = await store.runs.list_attempts(run.run_id)
    assert [(a.attempt, a.outcome, a.error_code) for a in attempts] == [
        (1, AttemptOutcome.FAILED, "boom"), (2, AttemptOutcome.FAILED, None)]


async def test_a_failed_attempt_keeps_its_traceback_and_a_success_has_none(store):
    _, run = await scheduled_run(store, retry=RetryPolicy(max_attempts=2, backoff_base=timedelta(seconds=1)))
    traced = 'Traceback (most recent call last):\n  File "handler.py", line 3, in charge\nValueError: card declined'
    await store.attempts.record_dispatches([Dispatch(run_id=run.run_id, lease_token=1, worker_id="w", node_id="n",
                                            lease_ttl=TTL, dispatched_at=NOW)])
    await store.attempts.record_results([AttemptResult(run_id=run.run_id, lease_token=1, outcome=AttemptOutcome.FAILED,
                                              error_code="ValueError", error_message="card declined",
                                              error_traceback=traced, started_at=NOW + timedelta(milliseconds=3))])
    await store.attempts.record_dispatches([Dispatch(run_id=run.run_id, lease_token=2, worker_id="w", node_id="n",
                                            lease_ttl=TTL, dispatched_at=NOW)])
    await store.attempts.record_results([AttemptResult(run_id=run.run_id, lease_token=2, outcome=AttemptOutcome.SUCCEEDED,
                                              error_traceback="ignored: the attempt succeeded")])
    attempts = await store.runs.list_attempts(run.run_id)
    assert [(a.outcome, a.error_traceback) for a in attempts] == [
        (AttemptOutcome.FAILED, traced), (AttemptOutcome.SUCCEEDED, None)]
    # A listing says when the first attempt started (the start lag `runs list` shows).
    [listed] = (await store.runs.list_runs("default", job_id=run.job_id)).items
    assert listed.first_started_at == attempts[0].started_at == NOW + timedelta(milliseconds=3)


async def test_permanent_failure_goes_straight_to_dead(store):
    _, run = await scheduled_run(store)
    await store.attempts.record_dispatches([Dispatch(run_id=run.run_id, lease_token=1, worker_id="w", node_id="n", lease_ttl=TTL, dispatched_at=NOW)])
    [outcome] = await store.attempts.record_results([AttemptResult(
        run_id=run.run_id, lease_token=1, outcome=AttemptOutcome.PERMANENT_FAILURE, error_message="bad input")])
    assert outcome.run.state is RunState.DEAD and outcome.run.attempts == 1


async def test_the_next_lease_expiry_is_when_the_earliest_attempt_lease_out_ends(store):
    leases, run = await scheduled_run(store)
    assert await store.lane.next_lease_expiry([run.shard_id]) is None  # nothing is out
    await store.attempts.record_dispatches([Dispatch(run_id=run.run_id, lease_token=1, worker_id="w1", node_id="n",
                                            lease_ttl=timedelta(seconds=20), dispatched_at=NOW)])
    remaining = await store.lane.next_lease_expiry([run.shard_id])
    assert remaining is not None and timedelta(seconds=19) < remaining <= timedelta(seconds=20)
    assert await store.lane.next_lease_expiry([(run.shard_id + 1) % SHARDS]) is None  # another shard's leases are not counted
    await store.attempts.record_results([AttemptResult(run_id=run.run_id, lease_token=1, outcome=AttemptOutcome.SUCCEEDED)])
    assert await store.lane.next_lease_expiry([run.shard_id]) is None  # finished: no longer out


async def test_a_superseded_result_is_recorded_but_does_not_change_the_run(store):
    leases, run = await scheduled_run(store)
    await store.attempts.record_dispatches([Dispatch(run_id=run.run_id, lease_token=1, worker_id="w1", node_id="n",
                                            lease_ttl=timedelta(milliseconds=200), dispatched_at=NOW)])
    await lease_expired(store, run.shard_id)
    requeued = await store.lane.requeue_expired(leases[run.shard_id])
    assert [r.run_id for r in requeued] == [run.run_id] and requeued[0].state is RunState.SCHEDULED
    await store.attempts.record_dispatches([Dispatch(run_id=run.run_id, lease_token=2, worker_id="w2", node_id="n", lease_ttl=TTL, dispatched_at=NOW)])
    [late] = await store.attempts.record_results(
        [AttemptResult(run_id=run.run_id, lease_token=1, outcome=AttemptOutcome.SUCCEEDED)])
    assert not late.accepted
    current = await store.runs.get_run("default", run.run_id)
    assert current.state is RunState.DISPATCHED and current.worker_id == "w2" and current.attempts == 2
    outcomes = [a.outcome for a in await store.runs.list_attempts(run.run_id)]
    assert outcomes == [AttemptOutcome.SUPERSEDED, AttemptOutcome.PENDING]
    # A result resent after it was recorded does not overwrite the outcome it recorded.
    await store.attempts.record_results([AttemptResult(run_id=run.run_id, lease_token=2, outcome=AttemptOutcome.SUCCEEDED)])
    await store.attempts.record_results([AttemptResult(run_id=run.run_id, lease_token=2, outcome=AttemptOutcome.SUCCEEDED)])
    outcomes = [a.outcome for a in await store.runs.list_attempts(run.run_id)]
    assert outcomes == [AttemptOutcome.SUPERSEDED, AttemptOutcome.SUCCEEDED]


async def test_manual_runs_use_their_run_id_as_idempotency_key(store):
    job, _ = await store.jobs.create_job(spec())
    first = await store.runs.create_manual_run("default", job.job_id)
    second = await store.runs.create_manual_run("default", job.job_id)
    assert first.manual and first.idempotency_key == first.run_id
    assert first.run_id != second.run_id
    with pytest.raises(JobNotFound):
        await store.runs.create_manual_run("acme", job.job_id)


async def test_list_runs_pages_newest_first_and_filters_by_state(store):
    job, _ = await store.jobs.create_job(spec())
    runs = [await store.runs.create_manual_run("default", job.job_id) for _ in range(5)]
    first = await store.runs.list_runs("default", job_id=job.job_id, limit=3)
    second = await store.runs.list_runs("default", job_id=job.job_id, limit=3, page_token=first.next_page_token)
    listed = [run.run_id for run in first.items + second.items]
    assert listed == [run.run_id for run in reversed(runs)]
    assert (await store.runs.list_runs("default", states=[RunState.SUCCEEDED])).items == []
    with pytest.raises(RunNotFound):
        await store.runs.get_run("acme", runs[0].run_id)


async def test_list_runs_keeps_the_runs_scheduled_within_a_time_range(store):
    job, _ = await store.jobs.create_job(spec())
    runs = [await store.runs.create_manual_run("default", job.job_id) for _ in range(4)]
    instants = sorted(run.scheduled_for for run in runs)  # manual runs: scheduled when made, each later
    assert len(set(instants)) == 4

    middle = await store.runs.list_runs("default", scheduled_from=instants[1], scheduled_before=instants[3])
    assert [run.scheduled_for for run in middle.items] == [instants[2], instants[1]]  # from inclusive, before not
    since = await store.runs.list_runs("default", scheduled_from=instants[2])
    assert [run.scheduled_for for run in since.items] == [instants[3], instants[2]]
    until = await store.runs.list_runs("default", scheduled_before=instants[1], job_id=job.job_id)
    assert [run.scheduled_for for run in until.items] == [instants[0]]
    # Paging within the range goes on where the page ended, and stays in the range.
    first = await store.runs.list_runs("default", scheduled_from=instants[1], limit=2)
    rest = await store.runs.list_runs("default", scheduled_from=instants[1], limit=2, page_token=first.next_page_token)
    assert [run.scheduled_for for run in first.items + rest.items] == [instants[3], instants[2], instants[1]]
    assert (await store.runs.list_runs("acme", scheduled_from=instants[0])).items == []  # another tenant's: none


async def test_runs_are_listed_and_counted_by_job_type_and_state_within_the_tenant(store):
    billing, _ = await store.jobs.create_job(spec(name="billing", job_type="billing.close"))
    other, _ = await store.jobs.create_job(spec(name="other", job_type="mail.send"))
    billed = [await store.runs.create_manual_run("default", billing.job_id) for _ in range(3)]
    await store.runs.create_manual_run("default", other.job_id)
    by_type = await store.runs.list_runs("default", job_type="billing.close", limit=2)
    rest = await store.runs.list_runs("default", job_type="billing.close", limit=2, page_token=by_type.next_page_token)
    assert [run.run_id for run in by_type.items + rest.items] == [run.run_id for run in reversed(billed)]
    scheduled = frozenset({RunState.SCHEDULED})
    assert await store.runs.count_runs("default", RunFilter(job_type="billing.close", states=scheduled)) == 3
    assert await store.runs.count_runs("default", RunFilter(states=scheduled)) == 4
    assert await store.runs.count_runs("default", RunFilter(job_id=other.job_id, states=scheduled)) == 1
    assert await store.runs.count_runs("default", RunFilter(job_type="billing.close",
                                                            states=frozenset({RunState.DEAD}))) == 0
    assert await store.runs.count_runs("default", RunFilter(states=frozenset())) == 0  # no state: none
    since = RunFilter(states=scheduled, scheduled_from=billed[1].scheduled_for, scheduled_before=billed[2].scheduled_for)
    assert await store.runs.count_runs("default", since) == 1
    assert await store.runs.count_runs("acme", RunFilter(states=scheduled)) == 0  # another tenant's: none
    assert (await store.runs.list_runs("acme", job_type="billing.close")).items == []


# -- overlap, cancel, replay, delivery semantics ------------------------------------------------


async def occurrence_now(store, leases, job_id: str):
    """Materialise the job's next occurrence as if it were due now."""
    job = await store.jobs.get_job("default", job_id)
    occurrence = Occurrence(job_id=job_id, expected_next_fire_at=job.next_fire_at, fire_times=(job.next_fire_at,),
                            next_fire_at=job.next_fire_at + timedelta(seconds=1))
    return await store.lane.materialise_runs([leases[job.shard_id]], [occurrence])


def dispatch(run_id: str, token: int) -> Dispatch:
    return Dispatch(run_id=run_id, lease_token=token, worker_id="w", node_id="n", lease_ttl=TTL, dispatched_at=NOW)


async def test_a_batch_of_results_mixing_current_stale_and_repeated_ones(store):
    leases = await own_all(store)
    runs = []
    for index in range(4):
        job, _ = await store.jobs.create_job(spec(f"mixed-{index}"))
        await due_now(store, job.job_id)
        runs += await materialise_job(store, leases, job.job_id)
    await store.attempts.record_dispatches([dispatch(run.run_id, 10 + index) for index, run in enumerate(runs)])
    finished = datetime(2027, 1, 1, 12, tzinfo=UTC)
    ok, stale, failing, cancelled = runs
    outcomes = await store.attempts.record_results([
        AttemptResult(run_id=ok.run_id, lease_token=10, outcome=AttemptOutcome.SUCCEEDED, finished_at=finished),
        AttemptResult(run_id=ok.run_id, lease_token=10, outcome=AttemptOutcome.FAILED),  # a resent copy
        AttemptResult(run_id=stale.run_id, lease_token=99, outcome=AttemptOutcome.SUCCEEDED),  # not its attempt
        AttemptResult(run_id=failing.run_id, lease_token=12, outcome=AttemptOutcome.FAILED, error_message="boom"),
        AttemptResult(run_id=cancelled.run_id, lease_token=13, outcome=AttemptOutcome.CANCELLED),
    ])
    by_run = {(o.run.run_id, o.accepted): o.run for o in outcomes}
    assert by_run[(ok.run_id, True)].state is RunState.SUCCEEDED
    assert by_run[(stale.run_id, False)].state is RunState.DISPATCHED
    assert by_run[(failing.run_id, True)].state is RunState.SCHEDULED
    assert by_run[(cancelled.run_id, True)].state is RunState.CANCELLED
    assert len(outcomes) == 4
    [attempt] = await store.runs.list_attempts(ok.run_id)
    assert attempt.outcome is AttemptOutcome.SUCCEEDED and attempt.finished_at == finished
    assert (await store.runs.get_run("default", ok.run_id)).lease_token is None
    assert (await store.runs.get_run("default", stale.run_id)).state is RunState.DISPATCHED  # its own attempt goes on
    assert [a.outcome for a in await store.runs.list_attempts(stale.run_id)] == [AttemptOutcome.PENDING]


async def states_of(store, job_id: str) -> list[str]:
    runs = (await store.runs.list_runs("default", job_id=job_id)).items
    return [run.state.value for run in sorted(runs, key=lambda run: run.scheduled_for)]


@pytest.mark.parametrize(
    ("overlap", "expected"),
    [
        (OverlapPolicy.ALLOW, ["dispatched", "scheduled", "scheduled"]),
        (OverlapPolicy.SKIP, ["dispatched", "skipped", "skipped"]),
        (OverlapPolicy.BUFFER_ONE, ["dispatched", "buffered", "skipped"]),
        (OverlapPolicy.BUFFER_ALL, ["dispatched", "buffered", "buffered"]),
    ],
)
async def test_overlap_policy_decides_the_runs_of_a_busy_job(store, overlap, expected):
    leases = await own_all(store)
    job, _ = await store.jobs.create_job(spec(schedule=Schedule.interval(timedelta(seconds=1)), overlap=overlap))
    [first] = (await occurrence_now(store, leases, job.job_id)).runs
    await store.attempts.record_dispatches([dispatch(first.run_id, 1)])
    written = [await occurrence_now(store, leases, job.job_id) for _ in range(2)]
    assert await states_of(store, job.job_id) == expected
    skipped = expected.count("skipped")
    assert sum(w.skipped.get("overlap", 0) for w in written) == skipped and not any("misfire" in w.skipped
                                                                                    for w in written)


async def test_a_finished_run_releases_the_oldest_buffered_one(store):
    leases = await own_all(store)
    job, _ = await store.jobs.create_job(
        spec(schedule=Schedule.interval(timedelta(seconds=1)), overlap=OverlapPolicy.BUFFER_ALL))
    [first] = (await occurrence_now(store, leases, job.job_id)).runs
    await store.attempts.record_dispatches([dispatch(first.run_id, 1)])
    await occurrence_now(store, leases, job.job_id)
    await occurrence_now(store, leases, job.job_id)
    outcomes = await store.attempts.record_results(
        [AttemptResult(run_id=first.run_id, lease_token=1, outcome=AttemptOutcome.SUCCEEDED)])
    [released] = [o.run for o in outcomes if o.released]
    assert released.state is RunState.SCHEDULED and released.scheduled_for == first.scheduled_for + timedelta(seconds=1)
    assert await states_of(store, job.job_id) == ["succeeded", "scheduled", "buffered"]


async def test_cancel_previous_cancels_the_active_run_and_schedules_the_new_one(store):
    leases = await own_all(store)
    job, _ = await store.jobs.create_job(
        spec(schedule=Schedule.interval(timedelta(seconds=1)), overlap=OverlapPolicy.CANCEL_PREVIOUS))
    [first] = (await occurrence_now(store, leases, job.job_id)).runs
    await store.attempts.record_dispatches([dispatch(first.run_id, 1)])
    second = await occurrence_now(store, leases, job.job_id)
    assert [run.run_id for run in second.cancelling] == [first.run_id]
    assert second.cancelling[0].cancel_requested and len(second.runs) == 1
    # The worker stops the handler and reports it; the run ends cancelled, not retried.
    [outcome] = await store.attempts.record_results(
        [AttemptResult(run_id=first.run_id, lease_token=1, outcome=AttemptOutcome.FAILED, error_message="stopped")])
    assert outcome.run.state is RunState.CANCELLED


async def test_cancel_ends_a_queued_run_and_flags_a_delivered_one(store):
    _, queued = await scheduled_run(store)
    cancelled = await store.runs.cancel_run("default", queued.run_id)
    assert cancelled.run.state is RunState.CANCELLED and cancelled.run.finished_at is not None
    again = await store.runs.cancel_run("default", queued.run_id)  # idempotent, as a pause is
    assert again.already and again.run == cancelled.run and not again.released
    job, _ = await store.jobs.create_job(spec("other"))
    delivered = await store.runs.create_manual_run("default", job.job_id)
    await store.attempts.record_dispatches([dispatch(delivered.run_id, 5)])
    flagged = await store.runs.cancel_run("default", delivered.run_id)
    assert flagged.run.state is RunState.DISPATCHED and flagged.run.cancel_requested and not flagged.already
    asked_again = await store.runs.cancel_run("default", delivered.run_id)
    assert asked_again.already and asked_again.run == flagged.run
    [outcome] = await store.attempts.record_results(
        [AttemptResult(run_id=delivered.run_id, lease_token=5, outcome=AttemptOutcome.CANCELLED)])
    assert outcome.run.state is RunState.CANCELLED
    # A run that finished otherwise cannot be cancelled.
    finished = await store.runs.create_manual_run("default", job.job_id)
    await store.attempts.record_dispatches([dispatch(finished.run_id, 6)])
    await store.attempts.record_results([AttemptResult(run_id=finished.run_id, lease_token=6, outcome=AttemptOutcome.SUCCEEDED)])
    with pytest.raises(InvalidState, match="succeeded"):
        await store.runs.cancel_run("default", finished.run_id)


async def test_a_dead_run_is_replayed_with_the_same_idempotency_key(store):
    _, run = await scheduled_run(store)
    await store.attempts.record_dispatches([dispatch(run.run_id, 1)])
    await store.attempts.record_results([AttemptResult(run_id=run.run_id, lease_token=1,
                                              outcome=AttemptOutcome.PERMANENT_FAILURE)])
    replayed = await store.runs.retry_run("default", run.run_id)
    assert replayed.state is RunState.SCHEDULED and replayed.idempotency_key == run.idempotency_key
    assert [p.run_id for p in await store.lane.pending_runs(range(SHARDS), datetime.now(UTC) + TTL)] == [run.run_id]
    [attempt] = await store.attempts.record_dispatches([dispatch(run.run_id, 2)])
    assert attempt.attempt == 2
    with pytest.raises(InvalidState, match="only dead or lost"):
        await store.runs.retry_run("default", run.run_id)


async def test_an_at_most_once_run_whose_worker_vanished_is_lost(store):
    leases, run = await scheduled_run(store, delivery=Delivery.AT_MOST_ONCE)
    await store.attempts.record_dispatches([Dispatch(run_id=run.run_id, lease_token=1, worker_id="w", node_id="n",
                                            lease_ttl=timedelta(milliseconds=100), dispatched_at=NOW)])
    await lease_expired(store, run.shard_id)
    assert await store.lane.requeue_expired(leases[run.shard_id]) == []
    assert (await store.runs.get_run("default", run.run_id)).state is RunState.LOST


async def test_an_at_most_once_failure_is_not_retried(store):
    _, run = await scheduled_run(store, delivery=Delivery.AT_MOST_ONCE)
    await store.attempts.record_dispatches([dispatch(run.run_id, 1)])
    [outcome] = await store.attempts.record_results(
        [AttemptResult(run_id=run.run_id, lease_token=1, outcome=AttemptOutcome.FAILED)])
    assert outcome.run.state is RunState.DEAD


# -- membership and change notification ----------------------------------------------------------


def node(node_id: str, **changes) -> NodeInfo:
    return NodeInfo(node_id=node_id, address=f"{node_id}:7070", started_at=NOW, heartbeat_at=NOW, **changes)


async def test_heartbeats_list_the_live_nodes(store, second_store):
    [me] = await store.shards.heartbeat_node(node("node-a", shards_owned=3), TTL)
    assert me.node_id == "node-a" and me.shards_owned == 3 and me.address == "node-a:7070"
    both = await second_store.shards.heartbeat_node(node("node-b", eligible=False, note="clock off"), TTL)
    assert [(n.node_id, n.eligible) for n in both] == [("node-a", True), ("node-b", False)]
    assert both[1].note == "clock off" and both[1].heartbeat_at >= both[0].heartbeat_at
    # Once node-a has not beaten for longer than the window it is no longer live, though listed.
    deadline = asyncio.get_running_loop().time() + 5
    while len(live := await second_store.shards.heartbeat_node(node("node-b"), timedelta(milliseconds=200))) > 1:
        assert asyncio.get_running_loop().time() < deadline, "node-a stayed live"
        await asyncio.sleep(0.02)
    assert [n.node_id for n in live] == ["node-b"]
    assert [n.node_id for n in await store.shards.list_nodes()] == ["node-a", "node-b"]
    await store.shards.remove_node("node-a")
    assert [n.node_id for n in await store.shards.list_nodes()] == ["node-b"]


async def test_committed_changes_reach_the_other_nodes(store, second_store):
    changes: list[Change] = []
    arrived = asyncio.Event()

    def on_change(change: Change) -> None:
        changes.append(change)
        arrived.set()

    watcher = asyncio.create_task(second_store.watch_changes(on_change))
    try:
        if not store.capabilities.listens:
            # A single node owns such a database (SQLite): there is nobody to tell, and nothing arrives.
            await store.jobs.create_job(spec())
            await asyncio.sleep(0.2)  # a quiet period: nothing may arrive in it
            assert changes == [] and not watcher.done()
            return
        await asyncio.wait_for(arrived.wait(), 10)  # the listener announces itself once connected
        job, _ = await store.jobs.create_job(spec())
        run = await store.runs.create_manual_run("default", job.job_id)
        await store.jobs.pause_job("default", job.job_id)
        await store.jobs.delete_job("default", job.job_id)
        expected = [
            Change("job", job.shard_id, "default", job.job_id),
            Change("run", job.shard_id, "default", run.run_id),
            Change("job", job.shard_id, "default", job.job_id),
            Change("job_deleted", job.shard_id, "default", job.job_id),
        ]
        deadline = asyncio.get_running_loop().time() + 10
        while [c for c in changes if c.kind != "members"] != expected:
            assert asyncio.get_running_loop().time() < deadline, changes
            await asyncio.sleep(0.02)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def test_cancel_previous_reports_a_queued_run_it_cancelled(store):
    leases = await own_all(store)
    job, _ = await store.jobs.create_job(
        spec(schedule=Schedule.interval(timedelta(seconds=1)), overlap=OverlapPolicy.CANCEL_PREVIOUS))
    [queued] = (await occurrence_now(store, leases, job.job_id)).runs
    second = await occurrence_now(store, leases, job.job_id)
    # The node holds the queued run in memory: it must learn to drop it.
    assert [(run.run_id, run.state) for run in second.cancelling] == [(queued.run_id, RunState.CANCELLED)]


async def test_due_jobs_carry_their_timing_queue_and_priority_and_share_equal_ones(store):
    now = await store.db_now()
    skip_late = MisfirePolicy(kind=MisfireKind.SKIP, grace=timedelta(seconds=3))
    cron = Schedule.cron_expr("*/2 * * * * *", "Europe/London")
    created = [
        (await store.jobs.create_job(spec("once-a", schedule=Schedule.at_instant(now + timedelta(seconds=1)))))[0],
        (await store.jobs.create_job(spec("once-b", schedule=Schedule.at_instant(now + timedelta(seconds=2)), priority=250)))[0],
        (await store.jobs.create_job(spec("cron-a", schedule=cron, misfire=skip_late)))[0],
        (await store.jobs.create_job(spec("cron-b", schedule=cron, misfire=skip_late)))[0],
    ]
    due = {job.job_id: job for job in await store.lane.load_due_jobs(range(SHARDS), now + timedelta(minutes=1))}
    once_a, once_b, cron_a, cron_b = (due[job.job_id] for job in created)
    assert once_a.timing.recurrence is None and once_a.timing.misfire == MisfirePolicy()
    assert cron_a.timing.recurrence == cron and cron_a.timing.misfire == skip_late
    assert [job.shard_id for job in (once_a, once_b, cron_a, cron_b)] == [job.shard_id for job in created]
    assert [job.next_fire_at for job in (once_a, once_b, cron_a, cron_b)] == [job.next_fire_at for job in created]
    # Equal timings are one value in memory, however many jobs hold them.
    assert once_a.timing is once_b.timing and cron_a.timing is cron_b.timing
    # Its queue and priority: whether its runs may be held back while the queue is behind.
    assert once_a.queue == ("billing.run", "default") and once_a.queue is cron_b.queue
    assert [job.priority for job in (once_a, once_b, cron_a)] == [0, 250, 0]


async def test_pending_runs_come_in_time_order_and_leave_out_the_ones_held(store):
    leases = await own_all(store)
    at = datetime.now(UTC) - timedelta(seconds=1)
    runs = []
    for index in range(6):
        job, _ = await store.jobs.create_job(spec(f"pending-{index}", schedule=Schedule.at_instant(at)))
        runs += await materialise_job(store, leases, job.job_id)
        at -= timedelta(seconds=1)  # each run due before the previous one
    later = datetime.now(UTC) + timedelta(seconds=5)
    everything = await store.lane.pending_runs(range(SHARDS), later)
    assert [run.run_id for run in everything] == [run.run_id for run in reversed(runs)]
    held = {runs[0].run_id, runs[3].run_id}
    rest = await store.lane.pending_runs(range(SHARDS), later, skip=held)
    assert [run.run_id for run in rest] == [run.run_id for run in reversed(runs) if run.run_id not in held]
    assert rest[0].payload == runs[-1].payload and rest[0].state is RunState.SCHEDULED


async def test_due_jobs_page_by_fire_time_then_id(store):
    at = datetime.now(UTC) + timedelta(minutes=5)
    for index in range(5):  # all due at the same instant: paging must not repeat or skip any
        await store.jobs.create_job(spec(f"same-{index}", schedule=Schedule.at_instant(at)))
    horizon = at + timedelta(seconds=1)
    first = await store.lane.load_due_jobs(range(SHARDS), horizon, limit=2)
    second = await store.lane.load_due_jobs(range(SHARDS), horizon, limit=2,
                                       after_job=(first[-1].next_fire_at, first[-1].job_id))
    third = await store.lane.load_due_jobs(range(SHARDS), horizon, limit=2,
                                      after_job=(second[-1].next_fire_at, second[-1].job_id))
    paged = [job.job_id for job in first + second + third]
    assert len(paged) == 5 and len(set(paged)) == 5
    assert paged == sorted(paged)  # one fire time: job id order


@pytest.mark.postgres
async def test_a_manual_run_of_a_job_deleted_meanwhile_is_job_not_found(pg_dsn, monkeypatch):
    # The insert copies the job's row: a job deleted before it runs leaves it nothing to copy.
    # That is a job not found.
    from fastlane.storage.postgres import queries

    store = open_store(pg_dsn, shard_count=SHARDS)
    try:
        await store.migrate()
        job, _ = await store.jobs.create_job(
            JobSpec(name="gone", job_type="t", schedule=Schedule.interval(timedelta(hours=1))))
        monkeypatch.setattr(queries.STATEMENTS, "INSERT_MANUAL_RUN", "SELECT $1::text, $2::text, $3::text WHERE false")
        with pytest.raises(JobNotFound):
            await store.runs.create_manual_run("default", job.job_id)
    finally:
        await store.close()
