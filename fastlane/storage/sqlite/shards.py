"""The SQLite store's shard leases and node membership.

Lease and membership upkeep takes urgent turns at the single writer, so a renewal never queues
behind a run of large data batches (see :mod:`fastlane.storage.turns`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence
from datetime import timedelta

from fastlane.domain.models import NodeInfo, ShardLease
from fastlane.domain.records import Change
from fastlane.storage import codec, common
from fastlane.storage.sqlite import queries
from fastlane.storage.sqlite.connection import SQLiteConnections, fetch_all, json_array


class SQLiteShards(SQLiteConnections):
    """Shard and membership methods of :class:`~fastlane.storage.sqlite.SQLiteStore`."""

    async def acquire_shards(
        self, owner: str, ttl: timedelta, *, limit: int, shard_ids: Collection[int] | None = None
    ) -> list[ShardLease]:
        wanted = None if shard_ids is None else json_array(shard_ids)
        async with self._transaction(urgent=True) as db:
            rows = await fetch_all(
                db, queries.ACQUIRE_SHARDS, (owner, common.micros_of_delta(ttl), wanted, wanted, limit)
            )
        return common.leases_in_order(rows)

    async def renew_shards(self, leases: Sequence[ShardLease], ttl: timedelta) -> list[ShardLease]:
        if not leases:
            return []
        async with self._transaction(urgent=True) as db:
            rows = await fetch_all(
                db,
                queries.RENEW_SHARDS,
                (common.micros_of_delta(ttl), common.single_owner(leases),
                 json_array((lease.shard_id, lease.token) for lease in leases)),
            )
        return common.leases_in_order(rows)

    async def release_shards(self, leases: Sequence[ShardLease]) -> None:
        if not leases:
            return
        async with self._transaction(urgent=True) as db:
            await db.execute(
                queries.RELEASE_SHARDS,
                (common.single_owner(leases), json_array((lease.shard_id, lease.token) for lease in leases)),
            )

    async def list_shards(self) -> list[ShardLease]:
        async with self._read() as db:
            rows = await fetch_all(db, queries.LIST_SHARDS, ())
        return [codec.build_lease(row) for row in rows]

    # -- membership -----------------------------------------------------------------------------

    async def heartbeat_node(self, node: NodeInfo, live_within: timedelta) -> list[NodeInfo]:
        async with self._transaction(urgent=True) as db:
            await db.execute(
                queries.HEARTBEAT_NODE,
                (node.node_id, node.address, node.clock_offset_ms, node.shards_owned, node.workers, node.eligible,
                 node.note),
            )
            rows = await fetch_all(db, queries.LIVE_NODES, (common.micros_of_delta(live_within),))
        return [codec.build_node(row) for row in rows]

    async def remove_node(self, node_id: str) -> None:
        async with self._transaction(urgent=True) as db:
            await db.execute(queries.REMOVE_NODE, (node_id,))

    async def list_nodes(self) -> list[NodeInfo]:
        async with self._read() as db:
            rows = await fetch_all(db, queries.LIST_NODES, ())
        return [codec.build_node(row) for row in rows]

    async def watch_changes(self, on_change: Callable[[Change], None]) -> None:
        # One node owns an SQLite database, and it learns of its own changes by direct call.
        await asyncio.Event().wait()
