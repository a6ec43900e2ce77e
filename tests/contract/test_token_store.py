"""The Store contract for API tokens: every test runs against each backend (``make_store``)."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime, timedelta

import pytest
from old_schemas import read_without_later_columns

from fastlane.domain.access import ApiToken, Role
from fastlane.domain.errors import Conflict, StorageError, TokenNotFound
from fastlane.domain.models import JobSpec, Schedule
from fastlane.errors import InvalidArgument
from fastlane.storage.migrations import migrations_for
from fastlane.storage.store import SQLStore

SHARDS = 4
# A stored hash is bytes of any value: NUL first (a text column would cut it or refuse it) and
# bytes above 0x7f (no encoding may touch them).
HASH = bytes(range(0, 256, 8))
OTHER_HASH = bytes(range(255, 0, -8))
EXPIRY = datetime(2031, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)
USED = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


@pytest.fixture
async def store(make_store):
    store = make_store(shard_count=SHARDS)
    await store.migrate()
    yield store
    await store.close()


def token(token_id: str = "tok000000001", tenant: str = "default", **fields) -> ApiToken:
    # A created_at far from now: the store must replace it with the database clock's.
    fields = {"role": Role.CLIENT, "name": "ci deploys", "created_at": datetime(2001, 1, 1, tzinfo=UTC)} | fields
    return ApiToken(token_id=token_id, tenant=tenant, **fields)


async def create_in_order(store, *tokens: ApiToken) -> list[ApiToken]:
    """Create ``tokens`` one after the other, each at a later database instant than the last."""
    created = []
    for each in tokens:
        if created:
            await asyncio.sleep(0.002)  # distinct microseconds, so created_at alone orders them
        created.append(await store.tokens.create_token(each, HASH))
    return created


# -- create and find -------------------------------------------------------------------------------


async def test_created_token_is_found_with_its_hash_and_the_database_creation_time(store):
    before = await store.db_now()
    created = await store.tokens.create_token(token(role=Role.WORKER, expires_at=EXPIRY), HASH)
    after = await store.db_now()

    assert before <= created.created_at <= after
    assert (created.token_id, created.tenant, created.role, created.name) == (
        "tok000000001", "default", Role.WORKER, "ci deploys",
    )
    assert created.expires_at == EXPIRY
    found = await store.tokens.find_token("tok000000001")
    assert found is not None
    record, stored_hash = found
    assert record == created
    assert type(stored_hash) is bytes and stored_hash == HASH


async def test_a_new_token_starts_unrevoked_and_unused_whatever_the_record_says(store):
    created = await store.tokens.create_token(token(revoked_at=USED, last_used_at=USED), HASH)

    assert created.revoked_at is None and created.last_used_at is None
    found = await store.tokens.find_token(created.token_id)
    assert found is not None and found[0].revoked_at is None and found[0].last_used_at is None


async def test_find_unknown_token_is_none(store):
    await store.tokens.create_token(token(), HASH)

    assert await store.tokens.find_token("tok999999999") is None


async def test_create_token_with_a_taken_id_is_a_conflict_and_keeps_the_first(store):
    first = await store.tokens.create_token(token(name="first"), HASH)

    with pytest.raises(Conflict, match="tok000000001"):
        await store.tokens.create_token(token(name="second", tenant="acme"), OTHER_HASH)

    assert await store.tokens.find_token("tok000000001") == (first, HASH)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        pytest.param({"name": "line\nbreak"}, "name", id="control-character-in-name"),
        pytest.param({"name": "x" * 201}, "name", id="name-over-200"),
        pytest.param({"tenant": "two words"}, "tenant", id="tenant-not-a-name"),
        pytest.param({"tenant": ""}, "tenant", id="tenant-empty"),
        pytest.param({"token_id": ""}, "token_id", id="id-empty"),
        pytest.param({"expires_at": datetime(2031, 1, 1)}, "expires_at", id="expiry-without-offset"),
    ],
)
async def test_create_token_refuses_bad_fields_and_writes_nothing(store, fields, field):
    bad = token(**{"token_id": "tok000000001", "tenant": "default"} | fields)

    with pytest.raises(InvalidArgument) as refused:
        await store.tokens.create_token(bad, HASH)

    assert refused.value.field == field
    assert await store.tokens.list_tokens() == []


@pytest.mark.parametrize("name", ["", "x" * 200, "déploiement nocturne ☾"], ids=["empty", "200", "unicode"])
async def test_token_names_within_bounds_are_kept_as_given(store, name):
    created = await store.tokens.create_token(token(name=name), HASH)

    assert created.name == name
    assert (await store.tokens.list_tokens())[0].name == name


# -- list ------------------------------------------------------------------------------------------


async def test_list_tokens_of_every_tenant_or_one_in_creation_order(store):
    # Ids in the opposite order to creation: the listing must follow created_at, not the id.
    zulu, mike, alpha = await create_in_order(
        store,
        token("zzzzzzzzzzzz", tenant="acme", role=Role.ADMIN),
        token("mmmmmmmmmmmm", tenant="default", role=Role.VIEWER),
        token("aaaaaaaaaaaa", tenant="acme", role=Role.WORKER),
    )

    assert await store.tokens.list_tokens() == [zulu, mike, alpha]
    assert await store.tokens.list_tokens("acme") == [zulu, alpha]
    assert await store.tokens.list_tokens("default") == [mike]
    assert await store.tokens.list_tokens("nobody") == []
    assert [each.role for each in await store.tokens.list_tokens()] == [Role.ADMIN, Role.VIEWER, Role.WORKER]


# -- revoke ----------------------------------------------------------------------------------------


async def test_revoke_sets_the_database_time_and_revoking_again_keeps_it(store):
    created = await store.tokens.create_token(token(), HASH)

    before = await store.db_now()
    revoked = await store.tokens.revoke_token(created.token_id)
    after = await store.db_now()
    await asyncio.sleep(0.002)
    again = await store.tokens.revoke_token(created.token_id, tenant="default")

    assert revoked.revoked_at is not None and before <= revoked.revoked_at <= after
    assert again == revoked
    assert revoked == token(created_at=created.created_at, revoked_at=revoked.revoked_at)
    assert await store.tokens.find_token(created.token_id) == (revoked, HASH)


async def test_revoke_within_another_tenant_is_not_found_and_changes_nothing(store):
    created = await store.tokens.create_token(token(tenant="acme"), HASH)

    with pytest.raises(TokenNotFound) as refused:
        await store.tokens.revoke_token(created.token_id, tenant="default")

    assert "acme" not in str(refused.value)  # nothing about whose token it is
    assert await store.tokens.find_token(created.token_id) == (created, HASH)
    assert (await store.tokens.revoke_token(created.token_id, tenant="acme")).revoked_at is not None


async def test_revoke_unknown_token_is_not_found(store):
    await store.tokens.create_token(token(), HASH)

    with pytest.raises(TokenNotFound):
        await store.tokens.revoke_token("tok999999999")
    with pytest.raises(TokenNotFound):
        await store.tokens.revoke_token("tok999999999", tenant="default")


# -- touch -----------------------------------------------------------------------------------------


async def last_used(store, token_id: str) -> datetime | None:
    found = await store.tokens.find_token(token_id)
    assert found is not None
    return found[0].last_used_at


async def test_touch_keeps_the_latest_use_and_ignores_unknown_tokens(store):
    first, second = await create_in_order(store, token("tok000000001"), token("tok000000002"))

    await store.tokens.touch_tokens({first.token_id: USED})
    assert await last_used(store, first.token_id) == USED
    assert await last_used(store, second.token_id) is None

    # One batch: an earlier time for the first (a late report), a first use of the second, and
    # an id nobody has.
    await store.tokens.touch_tokens({
        first.token_id: USED - timedelta(hours=1),
        second.token_id: USED - timedelta(microseconds=1),
        "tok999999999": USED,
    })
    assert await last_used(store, first.token_id) == USED
    assert await last_used(store, second.token_id) == USED - timedelta(microseconds=1)
    assert await store.tokens.find_token("tok999999999") is None

    await store.tokens.touch_tokens({first.token_id: USED + timedelta(microseconds=1)})
    assert await last_used(store, first.token_id) == USED + timedelta(microseconds=1)

    await store.tokens.touch_tokens({})  # an empty batch is accepted (a flush with nothing used)
    assert await last_used(store, first.token_id) == USED + timedelta(microseconds=1)


# -- migration -------------------------------------------------------------------------------------


async def test_a_database_at_version_3_with_jobs_migrates_to_version_5(db_url, make_store, monkeypatch):
    store = make_store(shard_count=SHARDS)
    # The store's migrate() reads the migrations through its own module's name for them: there,
    # it is made to see only the first three, as a node of the previous release would.
    store_module = sys.modules[SQLStore.__module__]
    monkeypatch.setattr(store_module, "migrations_for", lambda dialect: migrations_for(dialect)[:3])
    read_without_later_columns(monkeypatch)
    try:
        assert await store.migrate() == 3
        job, _ = await store.jobs.create_job(
            JobSpec(name="billing", job_type="billing.run", schedule=Schedule.cron_expr("*/5 * * * *"), payload=b"{}")
        )
        with pytest.raises(StorageError):
            await store.tokens.find_token("tok000000001")  # no table yet: this really is version 3

        monkeypatch.undo()
        latest = len(migrations_for("postgres" if db_url.startswith("postgres") else "sqlite"))
        assert await store.migrate() == latest >= 7
        assert await store.migrate() == latest  # and again: nothing left to apply

        assert await store.jobs.get_job("default", job.job_id) == job
        created = await store.tokens.create_token(token(), HASH)
        assert await store.tokens.find_token(created.token_id) == (created, HASH)
    finally:
        await store.close()
