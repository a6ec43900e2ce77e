"""The store's shard leases and node membership; a node joining or leaving is notified so that
every node rebalances at once."""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from datetime import timedelta
from typing import Any

from fastlane.domain.errors import StorageUnavailable
from fastlane.domain.models import NodeInfo, ShardLease
from fastlane.domain.records import Change, ChangeKind
from fastlane.storage import codec, common
from fastlane.storage.driver_errors import gave_up_waiting
from fastlane.storage.store.database import Batch, StorePart

log = logging.getLogger("fastlane.storage")


class SQLShards(StorePart):
    async def acquire_shards(
        self, owner: str, ttl: timedelta, *, limit: int, shard_ids: Collection[int] | None = None
    ) -> list[ShardLease]:
        """Take free and expired shards.

        The first transaction takes the rows nobody has locked and skips the others (``SKIP
        LOCKED``): nodes acquiring at once split the free shards instead of queueing for one
        another.

        Where rows are locked (not :attr:`Capabilities.one_writer`) and that falls short, a
        second transaction takes expired shards whose rows are still locked, and waits for them.
        Such a lock is the fence (``FOR KEY SHARE``) of a transaction the old owner opened while
        its lease was valid; skipping it left a frozen owner's shards unowned for as long as it
        stayed frozen. The wait is bounded by ``lock_timeout``, which is longer than
        ``idle_in_transaction_session_timeout`` (see PostgreSQL's ``SessionLimits``): the old
        owner commits, rolls back, or, frozen, has its session ended by the server before the
        wait runs out. A wait that runs out anyway leaves the shard to the next lease cycle, and
        the shards of the first step are returned all the same. This transaction holds no other
        lock while it waits, so nodes waiting for rows cannot deadlock one another.

        The fence still holds: the takeover locks the row only once the old owner's
        transaction has ended, so that transaction either committed before the takeover or
        never commits; and after the takeover the token no longer matches any write the old
        owner tries (``StaleFence``).
        """
        micros = common.micros_of_delta(ttl)
        only = None if shard_ids is None else list(shard_ids)
        async with self._db.write(urgent=True) as tx:
            rows = list(await tx.fetch(self._q.ACQUIRE_SHARDS, owner, micros, limit, only))
        if len(rows) < limit and not self._db.capabilities.one_writer:
            rows += await self._acquire_expired(owner, micros, limit - len(rows), only)
        return common.leases_in_order(rows)

    async def _acquire_expired(self, owner: str, micros: int, limit: int, only: list[int] | None) -> list[Any]:
        try:
            async with self._db.write(urgent=True) as tx:
                return list(await tx.fetch(self._q.ACQUIRE_EXPIRED_SHARDS, owner, micros, limit, only))
        except StorageUnavailable as error:
            if not gave_up_waiting(error.__cause__):
                raise
            log.info("expired shards still locked by their old owner's transaction: next cycle (%s)", error)
            return []

    async def renew_shards(self, leases: Sequence[ShardLease], ttl: timedelta) -> list[ShardLease]:
        if not leases:
            return []
        async with self._db.write(urgent=True) as tx:
            rows = await tx.fetch(
                self._q.RENEW_SHARDS, _leases(leases), common.single_owner(leases), common.micros_of_delta(ttl)
            )
        return common.leases_in_order(rows)

    async def release_shards(self, leases: Sequence[ShardLease]) -> None:
        if not leases:
            return
        async with self._db.write(urgent=True) as tx:
            await tx.execute(self._q.RELEASE_SHARDS, _leases(leases), common.single_owner(leases))

    async def list_shards(self) -> list[ShardLease]:
        async with self._db.read() as tx:
            rows = await tx.fetch(self._q.LIST_SHARDS)
        return [codec.build_lease(row) for row in rows]

    # -- membership -------------------------------------------------------------------------------

    async def heartbeat_node(self, node: NodeInfo, live_within: timedelta) -> list[NodeInfo]:
        async with self._db.write(urgent=True) as tx:
            joined = await tx.fetchval(
                self._q.HEARTBEAT_NODE,
                node.node_id, node.address, node.clock_offset_ms, node.shards_owned, node.workers, node.eligible,
                node.note,
            )
            if joined:
                await tx.notify(Change(ChangeKind.MEMBERS, key=node.node_id))
            rows = await tx.fetch(self._q.LIVE_NODES, common.micros_of_delta(live_within))
        return [codec.build_node(row) for row in rows]

    async def remove_node(self, node_id: str) -> None:
        async with self._db.write(urgent=True) as tx:
            await tx.execute(self._q.REMOVE_NODE, node_id)
            await tx.notify(Change(ChangeKind.MEMBERS, key=node_id))

    async def list_nodes(self) -> list[NodeInfo]:
        async with self._db.read() as tx:
            rows = await tx.fetch(self._q.LIST_NODES)
        return [codec.build_node(row) for row in rows]



def _leases(leases: Sequence[ShardLease]) -> Batch:
    return Batch(((lease.shard_id, lease.token) for lease in leases), 2)
