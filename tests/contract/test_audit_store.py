"""The Store contract for the audit trail: every test runs against each backend (``make_store``)."""

from __future__ import annotations

import sys
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from fastlane.domain.access import ApiToken, Role
from fastlane.domain.audit import MAX_AUDIT_DETAIL, AuditAction, AuditEvent, AuditTarget
from fastlane.domain.errors import StorageError
from fastlane.domain.limits import MAX_NAME_LENGTH
from fastlane.domain.models import JobSpec, Schedule
from fastlane.errors import InvalidArgument
from fastlane.storage.migrations import migrations_for
from fastlane.storage.store import SQLStore

SHARDS = 4
JOB, RUN = "job-0001", "run-0001"


@pytest.fixture
async def store(make_store):
    store = make_store(shard_count=SHARDS)
    await store.migrate()
    yield store
    await store.close()


def event(action: AuditAction = AuditAction.CREATED, *, tenant: str = "a", kind: AuditTarget = AuditTarget.JOB,
          target_id: str = JOB, job_id: str = JOB, **fields) -> AuditEvent:
    fields = {"token_id": "tok000000001", "actor": "ci deploys"} | fields
    return AuditEvent(tenant=tenant, action=action, target_kind=kind, target_id=target_id, job_id=job_id, **fields)


def run_event(action: AuditAction, run_id: str = RUN, **fields) -> AuditEvent:
    return event(action, kind=AuditTarget.RUN, target_id=run_id, **fields)


def summary(events: list[AuditEvent]) -> list[tuple[str, str, str]]:
    return [(e.action.value, e.target_kind.value, e.target_id) for e in events]


async def record_one_by_one(store, *events: AuditEvent) -> None:
    for each in events:
        await store.audit.record_audit([each])


# -- record and list -------------------------------------------------------------------------------


async def test_recorded_events_read_back_newest_first_with_the_database_time_and_an_id(store):
    before = await store.db_now()
    # A recorded time and id far from the truth: the store must set its own.
    await record_one_by_one(
        store,
        event(AuditAction.CREATED, detail="billing", at=datetime(2001, 1, 1, tzinfo=UTC), event_id=99_999),
        event(AuditAction.PAUSED),
        event(AuditAction.RESUMED, token_id=None, actor=""),
    )
    after = await store.db_now()

    listed = await store.audit.list_audit("a", target_kind="job", target_id=JOB)

    assert summary(listed) == [("resumed", "job", JOB), ("paused", "job", JOB), ("created", "job", JOB)]
    assert all(before <= e.at <= after for e in listed)
    assert listed[0].at >= listed[1].at >= listed[2].at
    assert listed[0].event_id > listed[1].event_id > listed[2].event_id
    created = listed[2]
    assert replace(created, event_id=None, at=None) == event(AuditAction.CREATED, detail="billing")
    assert (listed[0].token_id, listed[0].actor) == (None, "")  # authentication was off


async def test_a_batch_is_recorded_in_its_order(store):
    await store.audit.record_audit([event(AuditAction.CREATED), event(AuditAction.UPDATED, detail="version 2"),
                              event(AuditAction.PAUSED)])
    await store.audit.record_audit([])  # an empty batch is accepted and writes nothing

    listed = await store.audit.list_audit("a", target_kind=AuditTarget.JOB, target_id=JOB)

    assert [e.action for e in listed] == [AuditAction.PAUSED, AuditAction.UPDATED, AuditAction.CREATED]
    assert listed[1].detail == "version 2"


async def test_a_jobs_history_holds_its_runs_events_and_a_runs_only_its_own(store):
    await record_one_by_one(
        store,
        event(AuditAction.CREATED),
        run_event(AuditAction.TRIGGERED, "run-1"),
        run_event(AuditAction.TRIGGERED, "run-2"),
        run_event(AuditAction.CANCELLED, "run-1", detail="its worker was told to stop"),
        event(AuditAction.DELETED),
        event(AuditAction.CREATED, target_id="job-other", job_id="job-other"),
    )

    job_history = await store.audit.list_audit("a", target_kind="job", target_id=JOB)
    run_history = await store.audit.list_audit("a", target_kind="run", target_id="run-1")

    assert summary(job_history) == [
        ("deleted", "job", JOB), ("cancelled", "run", "run-1"), ("triggered", "run", "run-2"),
        ("triggered", "run", "run-1"), ("created", "job", JOB),
    ]
    assert summary(run_history) == [("cancelled", "run", "run-1"), ("triggered", "run", "run-1")]
    assert run_history[0].job_id == JOB
    # A run's id asked for as a job has no history of its own (and the other way round).
    assert await store.audit.list_audit("a", target_kind="job", target_id="run-1") == []
    assert await store.audit.list_audit("a", target_kind="run", target_id=JOB) == []


async def test_another_tenants_events_are_never_listed(store):
    # Both tenants have events about the very same ids (ids are not secret, nor unique across
    # tenants as far as the trail is concerned).
    await record_one_by_one(
        store,
        event(AuditAction.CREATED, tenant="a"),
        event(AuditAction.PAUSED, tenant="b", token_id="tokbbbbbbbbb", actor="b's token"),
        run_event(AuditAction.CANCELLED, tenant="b"),
        run_event(AuditAction.TRIGGERED, tenant="a"),
    )

    assert summary(await store.audit.list_audit("a", target_kind="job", target_id=JOB)) == [
        ("triggered", "run", RUN), ("created", "job", JOB)]
    assert summary(await store.audit.list_audit("a", target_kind="run", target_id=RUN)) == [("triggered", "run", RUN)]
    b_events = await store.audit.list_audit("b", target_kind="job", target_id=JOB)
    assert summary(b_events) == [("cancelled", "run", RUN), ("paused", "job", JOB)]
    assert {e.tenant for e in b_events} == {"b"}
    assert await store.audit.list_audit("c", target_kind="job", target_id=JOB) == []


async def test_the_limit_keeps_the_newest_events(store):
    await store.audit.record_audit([event(AuditAction.UPDATED, detail=f"version {n}") for n in range(1, 8)])

    newest = await store.audit.list_audit("a", target_kind="job", target_id=JOB, limit=3)
    one = await store.audit.list_audit("a", target_kind="job", target_id=JOB, limit=1)
    every = await store.audit.list_audit("a", target_kind="job", target_id=JOB, limit=1000)

    assert [e.detail for e in newest] == ["version 7", "version 6", "version 5"]
    assert [e.detail for e in one] == ["version 7"]
    assert len(every) == 7


async def test_events_outlive_their_deleted_job(store):
    job, _ = await store.jobs.create_job(
        JobSpec(tenant="a", name="billing", job_type="billing.run", schedule=Schedule.cron_expr("*/5 * * * *")))
    await store.audit.record_audit([event(AuditAction.CREATED, target_id=job.job_id, job_id=job.job_id)])
    await store.jobs.delete_job("a", job.job_id)
    await store.audit.record_audit([event(AuditAction.DELETED, target_id=job.job_id, job_id=job.job_id)])

    history = await store.audit.list_audit("a", target_kind="job", target_id=job.job_id)

    assert [e.action for e in history] == [AuditAction.DELETED, AuditAction.CREATED]


# -- bounds ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("changes", "field"), [
    ({"tenant": ""}, "tenant"),
    ({"tenant": "a b"}, "tenant"),
    ({"target_id": ""}, "target_id"),
    ({"target_id": "x" * 201}, "target_id"),
    ({"job_id": "j\x00"}, "job_id"),
    ({"token_id": "t" * 201}, "token_id"),
    ({"action": "renamed"}, "action"),
    ({"target_kind": "worker"}, "target_kind"),
])
async def test_record_refuses_bad_fields_and_writes_nothing_of_the_batch(store, changes, field):
    good = event(AuditAction.CREATED)
    with pytest.raises(InvalidArgument) as refused:
        await store.audit.record_audit([good, replace(good, **changes)])
    assert refused.value.field == field
    assert await store.audit.list_audit("a", target_kind="job", target_id=JOB) == []


async def test_actor_and_detail_are_cut_and_cleaned_not_refused(store):
    await store.audit.record_audit([event(actor="a\tname\n" + "x" * 500, detail="line\x00one\r\n" + "y" * 500)])

    [stored] = await store.audit.list_audit("a", target_kind="job", target_id=JOB)

    assert len(stored.actor) == MAX_NAME_LENGTH and stored.actor.startswith("a name ")
    assert len(stored.detail) == MAX_AUDIT_DETAIL and stored.detail.startswith("line one  ")


@pytest.mark.parametrize(("arguments", "field"), [
    ({"target_kind": "jobs"}, "target_kind"),
    ({"target_kind": ""}, "target_kind"),
    ({"target_id": ""}, "target_id"),
    ({"target_id": "x" * 201}, "target_id"),
    ({"limit": 0}, "limit"),
    ({"limit": 1001}, "limit"),
    ({"limit": -1}, "limit"),
])
async def test_list_refuses_a_bad_kind_id_or_limit(store, arguments, field):
    with pytest.raises(InvalidArgument) as refused:
        await store.audit.list_audit("a", **({"target_kind": "job", "target_id": JOB} | arguments))
    assert refused.value.field == field


# -- migration -------------------------------------------------------------------------------------


async def test_a_database_at_version_4_with_tokens_migrates_and_keeps_them(make_store, monkeypatch):
    store = make_store(shard_count=SHARDS)
    latest = migrations_for(store.dialect)[-1].version  # 5 adds the audit trail; later ones may follow
    # As in test_token_store: the store's migrate() is made to see only the first four migrations.
    store_module = sys.modules[SQLStore.__module__]
    monkeypatch.setattr(store_module, "migrations_for", lambda dialect: migrations_for(dialect)[:4])
    try:
        assert await store.migrate() == 4
        token = await store.tokens.create_token(
            ApiToken(token_id="tok000000001", tenant="a", role=Role.CLIENT, name="ci",
                     created_at=datetime(2001, 1, 1, tzinfo=UTC)), b"hash")
        with pytest.raises(StorageError):
            await store.audit.list_audit("a", target_kind="job", target_id=JOB)  # no table yet: version 4

        monkeypatch.undo()
        assert await store.migrate() == latest >= 5
        assert await store.migrate() == latest

        assert await store.tokens.find_token(token.token_id) == (token, b"hash")
        await store.audit.record_audit([event()])
        assert len(await store.audit.list_audit("a", target_kind="job", target_id=JOB)) == 1
    finally:
        await store.close()
