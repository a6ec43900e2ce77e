"""The PostgreSQL store's shard leases and node membership; a node joining or leaving is
notified so that every node rebalances at once."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import timedelta

from fastlane.domain.models import NodeInfo, ShardLease
from fastlane.domain.records import Change, ChangeKind
from fastlane.storage import codec, common
from fastlane.storage.postgres import queries
from fastlane.storage.postgres.changes import notify
from fastlane.storage.postgres.connection import PostgresConnections


class PostgresShards(PostgresConnections):
    """Shard and membership methods of :class:`~fastlane.storage.postgres.PostgresStore`."""

    async def acquire_shards(
        self, owner: str, ttl: timedelta, *, limit: int, shard_ids: Collection[int] | None = None
    ) -> list[ShardLease]:
        async with self._transaction() as db:
            rows = await db.fetch(
                queries.ACQUIRE_SHARDS,
                owner, common.micros_of_delta(ttl), limit, None if shard_ids is None else list(shard_ids),
            )
        return common.leases_in_order(rows)

    async def renew_shards(self, leases: Sequence[ShardLease], ttl: timedelta) -> list[ShardLease]:
        if not leases:
            return []
        async with self._transaction() as db:
            rows = await db.fetch(
                queries.RENEW_SHARDS,
                [lease.shard_id for lease in leases], [lease.token for lease in leases], common.single_owner(leases),
                common.micros_of_delta(ttl),
            )
        return common.leases_in_order(rows)

    async def release_shards(self, leases: Sequence[ShardLease]) -> None:
        if not leases:
            return
        async with self._transaction() as db:
            await db.execute(
                queries.RELEASE_SHARDS,
                [lease.shard_id for lease in leases], [lease.token for lease in leases], common.single_owner(leases),
            )

    async def list_shards(self) -> list[ShardLease]:
        async with self._connection() as db:
            rows = await db.fetch(queries.LIST_SHARDS)
        return [codec.build_lease(row) for row in rows]

    # -- membership -----------------------------------------------------------------------------

    async def heartbeat_node(self, node: NodeInfo, live_within: timedelta) -> list[NodeInfo]:
        async with self._transaction() as db:
            joined = await db.fetchval(
                queries.HEARTBEAT_NODE,
                node.node_id, node.address, node.clock_offset_ms, node.shards_owned, node.workers, node.eligible,
                node.note,
            )
            if joined:
                await notify(db, Change(ChangeKind.MEMBERS, key=node.node_id))
            rows = await db.fetch(queries.LIVE_NODES, common.micros_of_delta(live_within))
        return [codec.build_node(row) for row in rows]

    async def remove_node(self, node_id: str) -> None:
        async with self._transaction() as db:
            await db.execute(queries.REMOVE_NODE, node_id)
            await notify(db, Change(ChangeKind.MEMBERS, key=node_id))

    async def list_nodes(self) -> list[NodeInfo]:
        async with self._connection() as db:
            rows = await db.fetch(queries.LIST_NODES)
        return [codec.build_node(row) for row in rows]
