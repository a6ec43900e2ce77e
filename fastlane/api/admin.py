"""AdminService: what this node knows of the cluster."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from fastlane import wire
from fastlane._proto import admin_pb2, admin_pb2_grpc
from fastlane.api.guard import rpc
from fastlane.storage import Store


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, store: Store, node_status: Callable[[], admin_pb2.NodeStatus]) -> None:
        self._store = store
        self._node_status = node_status

    @rpc
    async def GetCluster(self, request: admin_pb2.GetClusterRequest, context: grpc.aio.ServicerContext) -> admin_pb2.ClusterStatus:
        shards = await self._store.list_shards()
        return admin_pb2.ClusterStatus(
            database_time=wire.timestamp(await self._store.db_now()),
            nodes=[self._node_status()],
            shards=[
                admin_pb2.ShardStatus(shard_id=s.shard_id, owner=s.owner, token=s.token,
                                      lease_expires_at=wire.timestamp(s.lease_expires_at))
                for s in shards
            ],
        )
