"""PostgreSQL failover: a store on a multi-host URL follows a promoted standby, and the fence stays
sound when the standby lacks the primary's last commits.

Each test runs its own primary and standby (``pg_basebackup``), as it kills the primary. SQLite has
one file and no standby, so there the question does not arise (its ``server_epoch`` is always 0:
see test_store).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.parse
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from fastlane.domain.errors import StaleFence, StorageUnavailable
from fastlane.storage import Store, open_store
from fastlane.testing.postgres import (
    REPLICATION_SETTINGS,
    StandbyPostgres,
    ThrowawayPostgres,
    create_database,
    multi_host_dsn,
    replicated_pair,
)

pytestmark = pytest.mark.postgres

TTL = timedelta(seconds=30)
SHARDS = 4
FIRST_FLOOR = 1 << 32  # the least token acquired on timeline 2


async def until_writable(store: Store, owner: str, timeout: float = 20.0) -> list:  # type: ignore[type-arg]
    """Acquire shards as soon as the store reaches a server that takes writes."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            return await store.shards.acquire_shards(owner, TTL, limit=SHARDS)
        except StorageUnavailable:
            assert asyncio.get_running_loop().time() < deadline, "no writable server came"
            await asyncio.sleep(0.1)


@pytest.fixture
async def lagging_standby() -> AsyncIterator[tuple[ThrowawayPostgres, StandbyPostgres, str]]:
    """A primary with a migrated database, and a standby made from it that then stops receiving
    (no ``primary_conninfo``): whatever the primary commits after, the standby never has, as an
    asynchronous standby that was behind when its primary died."""
    primary = ThrowawayPostgres(settings=REPLICATION_SETTINGS).start()
    try:
        dsn = await create_database(primary.dsn, "fastlane")
        store = open_store(dsn, shard_count=SHARDS, lease_ttl=TTL)
        await store.migrate()
        await store.close()
        standby = StandbyPostgres(primary, settings={**REPLICATION_SETTINGS, "primary_conninfo": "''"}).start()
        try:
            yield primary, standby, dsn
        finally:
            standby.stop()
    finally:
        primary.stop()


async def test_a_token_whose_bump_the_standby_lost_is_never_handed_out_again(lagging_standby):
    primary, standby, dsn = lagging_standby
    url = multi_host_dsn(dsn, standby)
    before, after = open_store(url, shard_count=SHARDS, lease_ttl=TTL), open_store(url, shard_count=SHARDS, lease_ttl=TTL)
    try:
        held = await before.shards.acquire_shards("node-a", TTL, limit=SHARDS)  # committed on the primary only
        assert len(held) == SHARDS and before.server_epoch == 0
        primary.crash()
        standby.promote()

        taken = await until_writable(after, "node-b")
        # The standby never saw node-a's acquisition: without the floor, node-b would now hold
        # the very tokens node-a holds, and the fence could not tell them apart.
        assert len(taken) == SHARDS
        assert all(lease.token >= FIRST_FLOOR for lease in taken), [lease.token for lease in taken]
        assert {lease.token for lease in taken}.isdisjoint(lease.token for lease in held)

        # node-a, reconnecting, finds another server, and its writes under the old tokens are refused.
        assert await before.shards.renew_shards(held, TTL) == []
        assert before.server_epoch == 1 and after.server_epoch == 0
        with pytest.raises(StaleFence):
            await before.lane.materialise_runs(held, [])
        assert {lease.owner for lease in await after.shards.list_shards()} == {"node-b"}
    finally:
        await before.close()
        await after.close()


async def test_a_store_follows_a_promoted_synchronous_standby_and_keeps_what_was_acknowledged():
    primary, standby = replicated_pair(synchronous=True)
    try:
        dsn = await create_database(primary.dsn, "fastlane")
        store = open_store(multi_host_dsn(dsn, standby), shard_count=SHARDS, lease_ttl=TTL)
        try:
            await store.migrate()
            held = await store.shards.acquire_shards("node-a", TTL, limit=SHARDS)
            assert [lease.token for lease in held] == [1] * SHARDS
            primary.crash()
            with pytest.raises(StorageUnavailable):  # no writable server until the promotion
                await store.shards.renew_shards(held, TTL)
            standby.promote()

            # The same store object, no restart: its pool's new connections find the new primary.
            renewed = await _retry(lambda: store.shards.renew_shards(held, TTL))
            assert len(renewed) == SHARDS
            assert store.server_epoch == 1
            # Synchronous: the acquisition the old primary acknowledged is on the new one.
            assert {(lease.shard_id, lease.owner, lease.token) for lease in await store.shards.list_shards()} == {
                (lease.shard_id, "node-a", 1) for lease in held
            }
            await store.shards.release_shards(renewed)
            again = await store.shards.acquire_shards("node-a", TTL, limit=SHARDS)
            assert all(lease.token == FIRST_FLOOR for lease in again), [lease.token for lease in again]
        finally:
            await store.close()
    finally:
        standby.stop()
        primary.stop()


@contextlib.asynccontextmanager
async def silent_host() -> AsyncIterator[int]:
    """A port that accepts connections and never says a word: a server gone dark, as behind a
    partition, where nothing is refused or reset."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in held:
            writer.transport.abort()


async def test_a_first_host_gone_dark_does_not_keep_the_store_from_the_next(pg_dsn):
    ttl = timedelta(seconds=3)  # connecting may take 3/4 of it, shared by the hosts
    async with silent_host() as port:
        parts = urllib.parse.urlsplit(pg_dsn)
        user, _, server = parts.netloc.rpartition("@")
        url = urllib.parse.urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{port},{server}",
                                                     query="target_session_attrs=read-write"))
        store = open_store(url, shard_count=SHARDS, lease_ttl=ttl)
        try:
            started = time.monotonic()
            await store.migrate()  # its own connection: past the silent host, within its share
            first = time.monotonic() - started
            assert first < ttl.total_seconds() * 3 / 4, first
            started = time.monotonic()
            assert len(await store.shards.acquire_shards("node-a", TTL, limit=SHARDS)) == SHARDS
            # The pool's connection begins with the host that last gave one.
            assert time.monotonic() - started < 1.0
        finally:
            await store.close()


async def _retry(call, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            return await call()
        except StorageUnavailable:
            assert asyncio.get_running_loop().time() < deadline, "the store never reached the promoted standby"
            await asyncio.sleep(0.1)
